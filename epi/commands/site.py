"""`epi site data/community --out site/`: the static leaderboard of the submissions the
checker accepts (docs/community.md)."""

from __future__ import annotations

from pathlib import Path

import click

from epi.commands.params import check_output_dir
from epi.core.errors import UserError


@click.command("site")
@click.argument("root", type=click.Path(path_type=Path))
@click.option("--out", required=True, type=click.Path(path_type=Path),
              help="Directory for index.html and one page per submission.")
def site(root: Path, out: Path) -> None:
    """Build the static site: leaderboards per model and hardware class (sortable,
    filterable), a page per submission, cross-lab comparisons of the same model and map."""
    from host.community.site import build

    check_output_dir(out, "--out")
    if not root.is_dir():
        shown = str(root) if str(root).isprintable() else repr(str(root))
        raise UserError(f"{shown}: not a directory (data/community is expected)")
    try:
        entries, refused = build(root, out)
    except OSError as exc:
        raise UserError(f"--out {out}: cannot write ({exc.strerror})") from None
    for line in refused:
        click.echo(f"left out: {line}")
    click.echo(f"{len(entries)} submission(s); wrote {out / 'index.html'}")
