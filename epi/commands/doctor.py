"""`epi doctor`: one screen saying what this machine has for epi, with the fix for each gap."""

from __future__ import annotations

import click

from epi import __version__
from host.doctor import collect_checks


@click.command()
def doctor() -> None:
    """Say what this machine has for epi — llama.cpp, models, data, meter hardware — and fixes."""
    checks = collect_checks()
    click.echo(f"epi {__version__} doctor")
    width = max(len(c.item) for c in checks)
    area = None
    for c in checks:
        if c.area != area:
            area = c.area
            click.echo(f"\n{area}")
        mark = {True: "ok ", False: "MISSING", None: "-- "}[c.ok]
        click.echo(f"  {mark:7} {c.item:{width}}  {c.detail}")
        if c.fix and c.ok is not True:
            click.echo(f"  {'':7} {'':{width}}  fix: {c.fix}")
    missing = [c for c in checks if c.ok is False]
    click.echo(
        f"\n{len(missing)} missing" + (": " + ", ".join(c.item for c in missing) if missing else "")
    )
