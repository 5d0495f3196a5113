"""Build the report of an analysis directory: figures (PNG + SVG), report.html (self-
contained) and report.md, written to a temporary directory and renamed into place, so an
error never leaves half a report."""

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
from host.report.render import RenderedFigure, to_html, to_markdown

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
    for f in fig_mod.build_all(rd):
        png, svg = io.BytesIO(), io.BytesIO()
        f.fig.savefig(png, format="png", dpi=PNG_DPI, bbox_inches="tight")
        f.fig.savefig(svg, format="svg", bbox_inches="tight")
        plt.close(f.fig)
        files[f"figures/{f.key}.png"] = png.getvalue()
        files[f"figures/{f.key}.svg"] = svg.getvalue()
        rendered.append(RenderedFigure(f.key, f.title, f.caption, png.getvalue()))
    tables = table_mod.build_all(rd)
    files["report.html"] = to_html(rd, title, rendered, tables).encode()
    files["report.md"] = to_markdown(rd, title, rendered, tables).encode()
    return files


def write_report(analysis_dir: Path, out_dir: Path, title: str | None = None) -> Report:
    files = render_files(Path(analysis_dir), title)
    out_dir = Path(out_dir)
    if out_dir.exists() and not out_dir.is_dir():
        raise UserError(f"--out: {out_dir} exists and is not a directory")
    parent = out_dir.parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
        tmp = parent / f".{out_dir.name}.tmp-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        for name, content in files.items():
            p = tmp / name
            p.parent.mkdir(parents=True, exist_ok=True)
            with open(p, "wb") as fh:
                fh.write(content)
                fh.flush()
                os.fsync(fh.fileno())
        if out_dir.exists():
            old = parent / f".{out_dir.name}.old-{os.getpid()}"
            os.rename(out_dir, old)
            os.rename(tmp, out_dir)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.rename(tmp, out_dir)
    except OSError as exc:
        raise UserError(f"--out: cannot write {out_dir} ({exc.strerror})") from None
    figs = sorted(out_dir / n for n in files if n.startswith("figures/"))
    return Report(out_dir, out_dir / "report.html", out_dir / "report.md", figs)
