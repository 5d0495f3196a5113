"""`epi meter sync URL`: estimate the clock offset to a running meter daemon."""

from __future__ import annotations

import json

import click

from epi.commands.params import BoundedInt, FiniteFloat
from epi.core.clocksync import estimate_offset


@click.command("sync")
@click.argument("url")
@click.option(
    "--samples", default=16, show_default=True, type=BoundedInt(1, 1000),
    help="Request/response exchanges to filter.",
)
@click.option(
    "--timeout", "timeout_s", default=2.0, show_default=True, type=FiniteFloat(0.01, 60),
    help="Seconds to wait for each reply.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the estimate as one JSON object.")
def sync(url: str, samples: int, timeout_s: float, as_json: bool) -> None:
    """Estimate meter monotonic − local monotonic for the daemon at URL (http://HOST:PORT)."""
    est = estimate_offset(url, samples=samples, timeout_s=timeout_s)
    if as_json:
        click.echo(json.dumps(est.as_dict()))
        return
    click.echo(
        f"offset {est.offset_ns / 1e6:+.3f} ms ± {est.uncertainty_ns / 1e6:.3f} ms "
        f"(meter monotonic − local monotonic; min round trip {est.rtt_ns / 1e6:.3f} ms, "
        f"{samples} exchanges, {url})"
    )
