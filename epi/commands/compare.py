"""`epi compare BUNDLE...`: bundles side by side, unfair differences flagged (docs/bundle.md)."""

from __future__ import annotations

from pathlib import Path

import click

from epi.core.errors import UserError


@click.command("compare")
@click.argument("bundles", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("--out", default=None, type=click.Path(path_type=Path),
              help="Also write the report (Markdown) to this file.")
def compare(bundles: tuple[Path, ...], out: Path | None) -> None:
    """Join the bundles' configurations on model and map sha256 and flag every difference
    that makes the comparison unfair (build flags, power source, calibration, accuracy items)."""
    from host.bundle import archive
    from host.bundle.compare import report
    from host.bundle.facts import facts

    if len(bundles) < 2:
        raise UserError("compare needs at least two bundles")
    lines = report([facts(archive.read(b)) for b in bundles])
    text = "\n".join(lines) + "\n"
    click.echo(text, nl=False)
    if out is not None:
        try:
            out.write_text(text)
        except OSError as exc:
            raise UserError(f"--out: cannot write {out} ({exc.strerror})") from None
        click.echo(f"wrote {out}")
