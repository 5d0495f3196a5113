"""`epi meter qualify`: a guided qualification of a board against a reference.

Every channel idle, then each loaded alone (PF 1, then a low PF), measured against what the
user has: a plug-in energy meter's reading typed in, a known resistive load, or a second CT
on the same conductor. Per channel: energy error with its uncertainty, noise floor, smallest
load metered, CT orientation, crosstalk, counter vs integral, phase, pass/fail against the
stated accuracy class (meter/qualify; docs/meter.md "Qualifying a board"). The result is saved
beside the calibration files. `--emulate` runs it on emulated chips with injected faults.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import click

from epi.commands.params import BoundedInt, FiniteFloat, check_output_file
from epi.core.errors import UserError

if TYPE_CHECKING:
    from meter.qualify.analysis import ChannelQualification
    from meter.qualify.emulated import ChannelFaults
    from meter.qualify.session import QualifyOptions

FAULT_KINDS = ("gain", "phase", "offset", "reversed", "crosstalk", "dead")


def parse_injection(text: str, n_channels: int) -> tuple[int, str, float, int | None]:
    """"gain:1=0.03", "phase:2=0.02", "offset:3=0.2", "reversed:4", "dead:6",
    "crosstalk:5=0:0.01" (channel 5 sees 1 % of channel 0) -> (channel, kind, value, source)."""
    try:
        kind, rest = text.split(":", 1)
        ch_text, _, value_text = rest.partition("=")
        ch = int(ch_text)
        source = None
        if kind == "crosstalk":
            src_text, _, value_text = value_text.partition(":")
            source = int(src_text)
        value = float(value_text) if value_text else 0.0
    except ValueError:
        raise UserError(f"--inject {text!r}: expected KIND:CHANNEL[=VALUE] (kinds: "
                        f"{', '.join(FAULT_KINDS)}; crosstalk:CH=FROM:FRACTION)") from None
    if kind not in FAULT_KINDS:
        raise UserError(f"--inject {text!r}: unknown kind {kind!r} ({', '.join(FAULT_KINDS)})")
    for c in (ch, source):
        if c is not None and not 0 <= c < n_channels:
            raise UserError(f"--inject {text!r}: channel {c} not in 0..{n_channels - 1}")
    return ch, kind, value, source


@click.command("qualify")
@click.option("--board", "board_path", type=click.Path(path_type=Path, dir_okay=False),
              help="Board file (real chips).")
@click.option("--emulate", is_flag=True, help="Emulated chips (with --inject faults).")
@click.option("--channels", "n_channels", type=BoundedInt(1, 16), default=4, show_default=True,
              help="Channels of the emulated board.")
@click.option("--inject", multiple=True, help="Emulated fault, e.g. gain:1=0.03, phase:2=0.02, "
              "offset:3=0.2, reversed:0, dead:1, crosstalk:2=0:0.01 (repeatable).")
@click.option("--reference", type=click.Choice(["plug-in", "resistive", "two-ct"]),
              default="plug-in", show_default=True, help="What the energy is checked against.")
@click.option("--reference-pct", type=FiniteFloat(0, 100), default=1.0, show_default=True,
              help="The reference's accuracy (%, k = 1): plug-in meter or second CT.")
@click.option("--resistive-ohm", type=FiniteFloat(1, 1e6), default=None,
              help="The resistive load's resistance (with --reference resistive).")
@click.option("--reference-channel", type=BoundedInt(0, 15), default=None,
              help="The channel whose CT is the reference (with --reference two-ct).")
@click.option("--class", "class_pct", type=FiniteFloat(0.01, 10), default=1.0,
              show_default=True, help="Accuracy class to pass (%).")
@click.option("--step-s", type=FiniteFloat(1, 3600), default=30.0, show_default=True,
              help="Seconds per measured step.")
@click.option("--load-w", type=FiniteFloat(0.1, 10000), default=7.0, show_default=True,
              help="The emulated load (W).")
@click.option("--no-low-pf", is_flag=True, help="Skip the low-power-factor (phase) step.")
@click.option("--out", "out_path", type=click.Path(path_type=Path, dir_okay=False),
              default=None, help="Where to save the result [default: qualification.json beside "
              "the board's calibration files].")
@click.option("--json", "as_json", is_flag=True,
              help="Print the result as the qualification document (the saved file's JSON) "
                   "instead of the table.")
def qualify(board_path: Path | None, emulate: bool, n_channels: int, inject: tuple[str, ...],
            reference: str, reference_pct: float, resistive_ohm: float | None,
            reference_channel: int | None, class_pct: float, step_s: float, load_w: float,
            no_low_pf: bool, out_path: Path | None, as_json: bool) -> None:
    """Qualify each channel against a reference; exit 1 when a channel fails."""
    from meter.qualify.report import record, render, save
    from meter.qualify.session import QualifyOptions
    from meter.qualify.session import qualify as run_qualify

    if out_path is not None:
        check_output_file(out_path, "--out")
    opts = QualifyOptions(accuracy_class_pct=class_pct, idle_s=step_s, load_s=step_s,
                          low_power_factor=None if no_low_pf else 0.5)
    if emulate:
        from meter.qualify.emulated import emulated_board

        faults: list[dict[str, tuple[float, int | None]]] = [{} for _ in range(n_channels)]
        for text in inject:
            ch, kind, value, source = parse_injection(text, n_channels)
            faults[ch][kind] = (value, source)
        specs = [_faults(f) for f in faults]
        drivers, clock, plant, ref = emulated_board(specs, load_w=load_w)
        names = [f"ch{i}" for i in range(n_channels)]
        ref_text, board_text = "the emulator's exact integral", "emulated"
        out = out_path or Path("qualification.json")
        try:
            results = run_qualify(drivers, names, clock, plant, ref, opts)
        finally:
            for d in drivers:
                d.close()
    else:
        if board_path is None:
            raise UserError("epi meter qualify: give --board FILE (real chips) or --emulate")
        results, ref_text, out = _real(board_path, reference, reference_pct, resistive_ohm,
                                       reference_channel, opts, out_path)
        board_text = str(board_path)
    doc = record(results, ref_text, board_text, emulate)
    save(out, doc)
    if as_json:
        import json

        click.echo(json.dumps(doc, indent=1))
    else:
        click.echo(render(results, ref_text), nl=False)
        click.echo(f"saved {out}")
    if not all(q.passed for q in results):
        raise SystemExit(1)  # a failed qualification is a result, not an error


def _faults(spec: dict[str, tuple[float, int | None]]) -> ChannelFaults:
    from meter.qualify.emulated import ChannelFaults

    errors: dict[str, float] = {}
    keys = {"gain": "energy_l", "phase": "phase_l_rad", "offset": "power_offset_w"}
    for kind, (value, _source) in spec.items():
        if kind in keys:
            errors[keys[kind]] = value
    cross = spec.get("crosstalk")
    return ChannelFaults(errors=errors, ct_reversed="reversed" in spec, dead="dead" in spec,
                         crosstalk_from=cross[1] if cross else None,
                         crosstalk_fraction=cross[0] if cross else 0.0)


def _real(board_path: Path, reference: str, reference_pct: float, resistive_ohm: float | None,
          reference_channel: int | None, opts: QualifyOptions, out_path: Path | None
          ) -> tuple[list[ChannelQualification], str, Path]:
    from meter.board.channels import load_board, open_channels
    from meter.clock import SystemClock
    from meter.qualify.references import PlugInMeter, ResistiveLoad, SecondCT
    from meter.qualify.session import qualify as run_qualify

    board = load_board(board_path)
    ref: PlugInMeter | ResistiveLoad | SecondCT
    if reference == "resistive":
        if resistive_ohm is None:
            raise UserError("--reference resistive needs --resistive-ohm R")
        ref = ResistiveLoad(resistive_ohm, reference_pct)
        text = f"resistive load {resistive_ohm:g} ohm ± {reference_pct:g} %"
    elif reference == "two-ct":
        if reference_channel is None:
            raise UserError("--reference two-ct needs --reference-channel N")
        ref = SecondCT(reference_channel, reference_pct)
        text = f"channel {reference_channel}'s CT on the same conductor ± {reference_pct:g} %"
    else:
        ref = PlugInMeter(lambda q: float(click.prompt(q, type=float)), reference_pct)
        text = f"plug-in energy meter ± {reference_pct:g} %"
    clock = SystemClock()
    channels = open_channels(board, clock=clock)

    class Prompted:
        def set_load(self, channel: int | None, power_factor: float = 1.0) -> None:
            what = ("switch every load OFF" if channel is None else
                    f"switch ON the load on channel {channels[channel].name} ONLY"
                    + (f" (a load with PF about {power_factor:g})" if power_factor < 1 else ""))
            click.prompt(f"{what}, then press Enter", default="", show_default=False)

    try:
        results = run_qualify([c.driver for c in channels], [c.name for c in channels], clock,
                              Prompted(), ref, opts)
    finally:
        for c in channels:
            c.close()
    cal_dirs = [c.calibration_path.parent for c in board.channels if c.calibration_path]
    out = out_path or (cal_dirs[0] if cal_dirs else board_path.parent) / "qualification.json"
    return results, text, out
