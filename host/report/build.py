"""Build the report of an analysis directory: figures (PNG + SVG), report.html (self-
contained) and report.md. Everything is rendered before anything is written, and each file
is staged and renamed into place, so an error never leaves half a report and no other file
in the output directory is touched."""

from __future__ import annotations

import io
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import matplotlib.pyplot as plt

from epi.core.errors import UserError
from host.report import data as data_mod
from host.report import figures as fig_mod
from host.report import tables as table_mod
from host.report.guidance_table import guidance_table
from host.report.render import RenderedFigure, to_html, to_markdown
from host.report.split_table import split_table
from host.report.work_figure import energy_vs_bytes

PNG_DPI = 110


@dataclass
class Report:
    out_dir: Path
    html: Path
    markdown: Path
    figures: list[Path]


def render_files(analysis_dir: Path, title: str | None = None) -> dict[str, bytes]:
    """Relative path → content of every report file (nothing written here)."""
    rd = data_mod.load(analysis_dir)
    where = Path(analysis_dir).resolve()
    title = title or f"epi report — {where.parent.name if where.name == 'analysis' else where.name}"
    files: dict[str, bytes] = {}
    rendered = []
    for f in fig_mod.build_all(rd, (energy_vs_bytes,)):
        png, svg = io.BytesIO(), io.BytesIO()
        f.fig.savefig(png, format="png", dpi=PNG_DPI, bbox_inches="tight")
        f.fig.savefig(svg, format="svg", bbox_inches="tight")
        plt.close(f.fig)
        files[f"figures/{f.key}.png"] = png.getvalue()
        files[f"figures/{f.key}.svg"] = svg.getvalue()
        rendered.append(RenderedFigure(f.key, f.title, f.caption, png.getvalue(), f.alt))
    tables = table_mod.build_all(rd)
    tables.insert(1, guidance_table(rd))  # after the results table
    splits = split_table(rd)
    if splits is not None:
        tables.insert(2, splits)
    files["report.html"] = to_html(rd, title, rendered, tables).encode()
    files["report.md"] = to_markdown(rd, title, rendered, tables).encode()
    return files


def _check_writable(out_dir: Path) -> None:
    """Refuse, before any rendering, an output directory that cannot be made or written."""
    if out_dir.exists() and not out_dir.is_dir():
        raise UserError(f"--out: {out_dir} exists and is not a directory")
    probe = out_dir
    while not probe.exists():
        probe = probe.parent
    if not probe.is_dir() or not os.access(probe, os.W_OK | os.X_OK):
        raise UserError(f"--out: {out_dir}: {probe} is not a writable directory")


def _write_synced(path: Path, content: bytes) -> None:
    with open(path, "wb") as fh:
        fh.write(content)
        fh.flush()
        os.fsync(fh.fileno())


def write_report(analysis_dir: Path, out_dir: Path, title: str | None = None) -> Report:
    """Render everything in memory, then put each report file in place.

    Only the report's own files (report.html, report.md, figures/<figure>.png|svg) are
    written, each staged in a hidden directory inside `out_dir` and renamed over its old
    version: any other file in `out_dir` is never touched (an earlier version renamed the
    finished report over the whole directory, deleting the user's files in it). A render
    error leaves `out_dir` as it was; a write error leaves each file either old or new.
    """
    out_dir = Path(out_dir)
    _check_writable(out_dir)
    files = render_files(Path(analysis_dir), title)
    stage = out_dir / f".epi-report-tmp-{os.getpid()}"
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        for name in files:
            target = out_dir / name
            if target.exists() and not target.is_file():
                raise UserError(f"--out: {target} exists and is not a file; the report "
                                "will not replace it")
        shutil.rmtree(stage, ignore_errors=True)
        for name, content in files.items():
            p = stage / name
            p.parent.mkdir(parents=True, exist_ok=True)
            _write_synced(p, content)
        for name in files:
            (out_dir / name).parent.mkdir(parents=True, exist_ok=True)
            os.replace(stage / name, out_dir / name)
    except OSError as exc:
        raise UserError(f"--out: cannot write {out_dir} ({exc.strerror or exc})") from None
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    figs = sorted(out_dir / n for n in files if n.startswith("figures/"))
    return Report(out_dir, out_dir / "report.html", out_dir / "report.md", figs)
