"""`epi report ANALYSIS_DIR`: a self-contained HTML report, a Markdown version and the figures
(PNG + SVG) from an `epi analyze` output directory (docs/report.md)."""

from __future__ import annotations

from pathlib import Path

import click

from epi.commands.params import check_output_dir
from host.report.build import write_report


@click.command("report")
@click.argument("analysis_dir", type=click.Path(path_type=Path, file_okay=False))
@click.option("--out", "out_dir", type=click.Path(path_type=Path),
              help="Report directory [default: ANALYSIS_DIR/../report].")
@click.option("--title", help="Report title [default: from the analysis directory name].")
def report(analysis_dir: Path, out_dir: Path | None, title: str | None) -> None:
    """Figures, tables and verdicts of an analysis as HTML (one file) + Markdown.

    Only the report's own files are written into --out; anything else there is kept."""
    out_dir = out_dir or analysis_dir.parent / "report"
    check_output_dir(out_dir, "--out")
    r = write_report(analysis_dir, out_dir, title)
    click.echo(f"wrote {r.markdown} and {len(r.figures)} figure files (PNG + SVG) in "
               f"{r.out_dir / 'figures'}")
    click.echo(f"report: {r.html}")
