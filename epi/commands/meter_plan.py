"""`epi meter plan BOARD.toml --load-w MIN..MAX`: what each channel's chain resolves at a load.

Register steps, energy counts per sweep and per prefill/decode window, the start-up threshold,
the chip's accuracy range and ADC headroom, the instrument part of a J/token uncertainty and
what to change when the chain cannot resolve the load (meter/plan.py; docs/meter.md).
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import click

from epi.commands.params import FiniteFloat
from epi.core.errors import UserError

_NUMBER = r"\s*([0-9]+(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?)\s*"
_RANGE_RE = re.compile(rf"^{_NUMBER}(?:\.\.{_NUMBER})?$")


def parse_load_range(text: str) -> tuple[float, float]:
    """"2.7..9.5" -> (2.7, 9.5); "5" -> (5, 5). UserError naming --load-w otherwise."""
    m = _RANGE_RE.match(text)
    try:
        if m is None:
            raise ValueError
        lo = float(m.group(1))
        hi = float(m.group(2)) if m.group(2) is not None else lo
    except ValueError:
        raise UserError(f"--load-w: expected MIN..MAX in watts (e.g. 2.7..9.5), got {text!r}"
                        ) from None
    if not (math.isfinite(lo) and math.isfinite(hi) and 0 < lo <= hi):
        raise UserError(f"--load-w: need finite 0 < MIN <= MAX, got {text!r}")
    return lo, hi


@click.command("plan")
@click.argument("board_path", type=click.Path(path_type=Path, dir_okay=False))
@click.option("--load-w", "load_w", required=True,
              help="The load per channel in watts, MIN..MAX (e.g. 2.7..9.5 for a Pi 5).")
@click.option("--volts", type=FiniteFloat(1, 1000), default=None,
              help="Mains voltage [default: the board's frontend.un_v].")
@click.option("--pf", "power_factor", type=FiniteFloat(0.01, 1), default=1.0,
              show_default=True, help="The load's power factor.")
@click.option("--prefill-s", type=FiniteFloat(0.001, 3600), default=0.5, show_default=True,
              help="A typical prefill window (s).")
@click.option("--decode-s", type=FiniteFloat(0.001, 36000), default=10.0, show_default=True,
              help="A typical decode window (s).")
@click.option("--reference-pct", type=FiniteFloat(0, 100), default=1.0, show_default=True,
              help="Accuracy of the calibration reference (%).")
@click.option("--uncalibrated", is_flag=True,
              help="Gains not calibrated against a reference: the CT class counts instead.")
@click.option("--json", "as_json", is_flag=True,
              help="Print the plan as one JSON document (docs/meter.md, schema in "
                   "docs/schemas/).")
def plan(board_path: Path, load_w: str, volts: float | None, power_factor: float,
         prefill_s: float, decode_s: float, reference_pct: float, uncalibrated: bool,
         as_json: bool) -> None:
    """What each channel of BOARD_PATH resolves at the load, and what to change if not."""
    from meter.board.file import load_board
    from meter.plan import PlanError, PlanOptions, plan_board, render

    opts = PlanOptions(load_w=parse_load_range(load_w), volts=volts,
                       power_factor=power_factor, prefill_s=prefill_s, decode_s=decode_s,
                       reference_pct=reference_pct, calibrated=not uncalibrated)
    board = load_board(board_path)
    try:
        plans = plan_board(board, opts)
    except PlanError as exc:
        raise UserError(f"{board_path}: {exc}") from None
    if as_json:
        import json

        from meter.plan import plan_document

        click.echo(json.dumps(plan_document(plans, opts), indent=1, allow_nan=False))
        return
    click.echo(render(plans, opts), nl=False)
