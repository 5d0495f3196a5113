"""`epi check-submission PATH...`: every figure of each submission recomputed from its own
bundle; one line per problem, exit 1 when there is any (docs/community.md)."""

from __future__ import annotations

from pathlib import Path

import click

from epi.core.errors import UserError


@click.command("check-submission")
@click.argument("paths", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("--board", type=click.Choice(["measured", "modelled", "any"]), default="any",
              show_default=True,
              help="The leaderboard checked for: 'measured' refuses modelled power.")
def check_submission(paths: tuple[Path, ...], board: str) -> None:
    """Check community submissions: bundle hashes, figures recomputed from the traces and
    token logs, required metadata, protocol, validity, power source."""
    from host.community.check import SUMMARY, check

    dirs = []
    for p in paths:
        if p.is_file() and p.name == SUMMARY:
            p = p.parent
        if not (p / SUMMARY).is_file():
            shown = str(p) if str(p).isprintable() else repr(str(p))  # one line, always
            raise UserError(f"{shown}: no {SUMMARY} (a submission directory is expected)")
        dirs.append(p)
    failed = 0
    for d in dirs:
        problems = check(d, board=None if board == "any" else board)  # type: ignore[arg-type]
        for line in problems:
            click.echo(line)
        click.echo(f"{d}: {'REFUSED, ' + str(len(problems)) + ' problem(s)' if problems else 'ok'}")
        failed += bool(problems)
    if failed:
        raise SystemExit(1)
