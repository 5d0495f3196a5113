"""`epi doctor`: one screen saying what this machine has for epi, with the fix for each gap."""

from __future__ import annotations

import json
from typing import cast

import click

from epi import __version__
from epi.formats.json_types import JSON
from host.doctor import ROLE_HELP, ROLES, Check, Role, collect_checks, missing_for, needed_by

#: the exit status when something the chosen role needs is missing (2 is a usage error)
EXIT_MISSING = 1


def _document(checks: list[Check], role: Role, missing: list[Check]) -> dict[str, JSON]:
    """`epi doctor --json`: every check with the roles that need it (docs/meter.md)."""
    return {
        "format": "epi-doctor", "format_version": 1, "epi_version": __version__,
        "role": role,
        "checks": [{"area": c.area, "item": c.item,
                    "ok": c.ok, "detail": c.detail, "fix": c.fix or None,
                    "needed_by": [*sorted(needed_by(c))]} for c in checks],
        "missing_for_role": [c.item for c in missing],
    }


@click.command()
@click.option("--role", type=click.Choice(ROLES), default="host", show_default=True,
              help="What this machine is for; exit status 1 when something it needs is "
                   "missing. " + "; ".join(f"{k}: {v}" for k, v in ROLE_HELP.items()) + ".")
@click.option("--json", "as_json", is_flag=True, help="Print the checks as one JSON document.")
def doctor(role: str, as_json: bool) -> None:
    """Say what this machine has for epi — llama.cpp, models, data, meter hardware — and fixes.

    Exit status 1 when something the chosen --role needs is missing (default: host)."""
    chosen = cast(Role, role)
    checks = collect_checks()
    missing = missing_for(checks, chosen)
    if as_json:
        click.echo(json.dumps(_document(checks, chosen, missing), indent=1))
    else:
        _print(checks, chosen, missing)
    if missing:
        raise SystemExit(EXIT_MISSING)


def _print(checks: list[Check], role: Role, missing: list[Check]) -> None:
    click.echo(f"epi {__version__} doctor (role: {role})")
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
    advice = [c for c in checks if c.ok is False and c not in missing]
    click.echo(f"\n{len(missing)} missing for the {role} role"
               + (": " + ", ".join(c.item for c in missing) if missing else ""))
    if advice:
        click.echo(f"{len(advice)} more not needed for it: "
                   + ", ".join(c.item for c in advice))
