"""`epi compare BUNDLE...`: bundles side by side, unfair differences flagged (docs/bundle.md)."""

from __future__ import annotations

from pathlib import Path

import click

from epi.commands.params import check_output_file
from epi.core.errors import UserError


@click.command("compare")
@click.argument("bundles", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("--out", default=None, type=click.Path(path_type=Path),
              help="Also write the report (Markdown, or JSON with --json) to this file.")
@click.option("--json", "as_json", is_flag=True,
              help="Print (and write) the comparison as JSON (docs/bundle.md) instead of "
                   "Markdown.")
@click.option("--mixed-basis", is_flag=True,
              help="Compare analyses that report different energy bases (gross, net), each on "
                   "its own, flagged; refused without it.")
def compare(bundles: tuple[Path, ...], out: Path | None, as_json: bool,
            mixed_basis: bool) -> None:
    """Join the bundles' configurations on model and map sha256 and flag every difference
    that makes the comparison unfair (energy basis, validity thresholds, analysis method,
    run and accuracy protocol, build, power source, calibration, accuracy items).

    Exit status 3 when a difference makes the comparison unfair (the report is still
    printed), 2 for bad input."""
    import json

    from host.bundle import archive
    from host.bundle.compare import EXIT_UNFAIR, check_bases, differences, document, report
    from host.bundle.facts import facts

    if len(bundles) < 2:
        raise UserError("compare needs at least two bundles")
    if out is not None:
        check_output_file(out, "--out")
    all_facts = [facts(archive.read(b)) for b in bundles]
    check_bases(all_facts, [b.name for b in bundles], mixed_basis)
    if as_json:
        text = json.dumps(document(all_facts), indent=1) + "\n"
    else:
        text = "\n".join(report(all_facts)) + "\n"
    click.echo(text, nl=False)
    if out is not None:
        try:
            out.write_text(text)
        except OSError as exc:
            raise UserError(f"--out: cannot write {out} ({exc.strerror})") from None
        if not as_json:
            click.echo(f"wrote {out}")
    if differences(all_facts):
        raise SystemExit(EXIT_UNFAIR)
