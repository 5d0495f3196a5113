"""Render the report as one self-contained HTML file (figures embedded as data URIs, inline
CSS, no scripts, no network) and as Markdown that links the PNG files beside it."""

from __future__ import annotations

import base64
import html
from dataclasses import dataclass

from host.report.data import ReportData
from host.report.tables import Table

CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;max-width:1100px;
margin:2em auto;padding:0 1em;color:#222;line-height:1.45}
h1{margin-bottom:.2em}h2{margin-top:2em;border-bottom:1px solid #ddd;padding-bottom:.2em}
.banner{padding:.6em 1em;border-radius:6px;margin:1em 0}
.modelled{background:#fff3e0;border:1px solid #f0a040}
.measured{background:#e8f5e9;border:1px solid #66bb6a}
figure{margin:1.5em 0}figure img{max-width:100%;border:1px solid #eee}
figcaption,.caption{font-size:.88em;color:#444}
table{border-collapse:collapse;font-size:.85em;margin:.6em 0;width:100%}
th,td{border:1px solid #ddd;padding:3px 6px;text-align:left;vertical-align:top}
th{background:#f5f5f5}tr.invalid td{background:#fdecea}
code{background:#f5f5f5;padding:0 3px}
.notes li{font-size:.85em;color:#555}
"""


@dataclass
class RenderedFigure:
    key: str
    title: str
    caption: str
    png: bytes


def _table_html(t: Table) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in t.headers)
    body = []
    for i, row in enumerate(t.rows):
        cls = (t.row_classes or [""] * len(t.rows))[i]
        cells = "".join(f"<td>{html.escape(c)}</td>" for c in row)
        body.append(f'<tr class="{cls}">{cells}</tr>' if cls else f"<tr>{cells}</tr>")
    rows = "".join(body) or f'<tr><td colspan="{len(t.headers)}">(no rows)</td></tr>'
    return (f'<h2 id="{t.key}">{html.escape(t.title)}</h2>\n'
            f'<p class="caption">{html.escape(t.caption)}</p>\n'
            f"<table><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>\n")


def _md_cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _table_md(t: Table) -> str:
    lines = [f"## {t.title}", "", t.caption, "",
             "| " + " | ".join(_md_cell(h) for h in t.headers) + " |",
             "|" + "---|" * len(t.headers)]
    for row in t.rows:
        lines.append("| " + " | ".join(_md_cell(c) for c in row) + " |")
    if not t.rows:
        lines.append("| " + " | ".join(["(no rows)"] + [""] * (len(t.headers) - 1)) + " |")
    return "\n".join(lines) + "\n"


def intro(rd: ReportData) -> tuple[str, str]:
    """(banner text, how-to-read text)."""
    lab = rd.labels
    if lab.power_source == "modelled":
        banner = ("Power in this report is MODELLED, not measured: " + lab.power_detail +
                  ". The numbers show what the pipeline computes; they are not a measurement "
                  "of real hardware.")
    else:
        banner = f"Power in this report is measured ({lab.power_detail})."
    n_runs = len(rd.doc["runs"])
    n_valid = int(rd.per_run[(rd.per_run["phase"] == "request")]["valid"].sum()) if len(
        rd.per_run) else 0
    how = (f"{len(rd.configs)} configurations, {n_runs} runs ({n_valid} valid for the whole-"
           f"request figure). Lower J per token and lower EPI (J per token ÷ accuracy) are "
           f"better. Medians, intervals and the Pareto frontier use valid runs only; invalid "
           f"runs are shown with their own numbers and the reason they are invalid. "
           f"{lab.line()}.")
    return banner, how


def to_html(rd: ReportData, title: str, figures: list[RenderedFigure], tables: list[Table]
            ) -> str:
    banner, how = intro(rd)
    parts = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
             f"<title>{html.escape(title)}</title>",
             '<meta name="viewport" content="width=device-width, initial-scale=1">',
             f"<style>{CSS}</style></head><body>",
             f"<h1>{html.escape(title)}</h1>",
             f'<div class="banner {rd.labels.power_source}">{html.escape(banner)}</div>',
             f"<p>{html.escape(how)}</p>",
             "<p>Contents: " + " · ".join(
                 f'<a href="#{x.key}">{html.escape(x.title)}</a>' for x in [*tables[:1],
                                                                            *figures,
                                                                            *tables[1:]])
             + "</p>"]
    parts.append(_table_html(tables[0]))
    for f in figures:
        b64 = base64.b64encode(f.png).decode()
        parts.append(f'<h2 id="{f.key}">{html.escape(f.title)}</h2>\n<figure>'
                     f'<img alt="{html.escape(f.title)}" src="data:image/png;base64,{b64}">'
                     f"<figcaption>{html.escape(f.caption)}</figcaption></figure>")
    for t in tables[1:]:
        parts.append(_table_html(t))
    notes = rd.doc.get("notes") or []
    if notes:
        parts.append('<h2 id="notes">Analysis notes</h2><ul class="notes">'
                     + "".join(f"<li>{html.escape(str(n))}</li>" for n in notes) + "</ul>")
    parts.append(f'<p class="caption">Source: {html.escape(str(rd.analysis_dir))} '
                 "(results.json, results.csv, runs.csv, repeats.csv, windows.csv).</p>")
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


def to_markdown(rd: ReportData, title: str, figures: list[RenderedFigure],
                tables: list[Table]) -> str:
    banner, how = intro(rd)
    out = [f"# {title}", "", f"> {banner}", "", how, "", _table_md(tables[0])]
    for f in figures:
        out += [f"## {f.title}", "", f"![{f.title}](figures/{f.key}.png)", "", f.caption, ""]
    for t in tables[1:]:
        out.append(_table_md(t))
    notes = rd.doc.get("notes") or []
    if notes:
        out += ["## Analysis notes", ""] + [f"- {n}" for n in notes] + [""]
    return "\n".join(out)
