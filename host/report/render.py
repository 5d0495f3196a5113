"""Render the report as one self-contained HTML file (figures embedded as data URIs, inline
CSS, no scripts, no network) and as Markdown that links the PNG files beside it.

Reading order: title, power banner, the answer block (the study's three questions answered in
words, host.report.answers), the "how these figures were measured" block (host.report.method),
then the results table, the figures and the other tables, each with a short caption. Every
text that comes from the inputs (titles, configuration names, reasons) is escaped in both
outputs: HTML cannot get into the page through a name."""

from __future__ import annotations

import base64
import html
from dataclasses import dataclass

from host.analysis.power_source import MODELLED
from host.analysis.vocabulary import WindowKind
from host.report import answers as answers_mod
from host.report.answers import AnswerBlock
from host.report.data import ReportData
from host.report.method import TITLE as METHOD_TITLE
from host.report.method import measurement_block
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
.answers{border:2px solid #0072B2;border-radius:6px;padding:.4em 1.2em;margin:1em 0;
background:#f4f9fd}.answers dt{font-weight:600;margin-top:.6em}.answers dd{margin-left:1em}
.status{font-weight:600;padding:0 .4em;border-radius:3px}
.status-decided{background:#d8f0e6}.status-undecided,.status-partly{background:#fbe3d4}
.status-cannot{background:#eee}
.method{font-size:.88em;background:#fafafa;border:1px solid #ddd;border-radius:6px;
padding:.3em 1em}.method dt{font-weight:600;display:inline}.method dd{display:inline;margin:0}
.method div{margin:.25em 0}.answers h2,.method h2{margin-top:.4em}
"""


@dataclass
class RenderedFigure:
    key: str
    title: str
    caption: str
    png: bytes
    alt: str = ""


def _status_class(status: str) -> str:
    return "status-" + status.split(" ")[0]


def answers_html(block: AnswerBlock) -> str:
    items = []
    for a in block.answers:
        items.append(f'<dt id="answer-{a.key}">{html.escape(a.question)}</dt><dd>'
                     f'<span class="status {_status_class(a.status)}">'
                     f"{html.escape(a.status)}</span> {html.escape(a.text)}</dd>")
    limits = "".join(f"<li>{html.escape(x)}</li>" for x in block.limits)
    return ('<section class="answers" id="answers"><h2>Answers</h2><dl>' + "".join(items)
            + "</dl><p><strong>What this study cannot tell:</strong></p><ul>" + limits
            + "</ul></section>")


def answers_md(block: AnswerBlock) -> str:
    lines = ["## Answers", ""]
    for a in block.answers:
        lines += [f"**{md_text(a.question)}** *{a.status}.* {md_text(a.text)}", ""]
    lines += ["**What this study cannot tell:**", ""]
    lines += [f"- {md_text(x)}" for x in block.limits]
    return "\n".join(lines) + "\n"


def method_html(entries: list[tuple[str, str]]) -> str:
    body = "".join(f"<div><dt>{html.escape(k)}:</dt> <dd>{html.escape(v)}</dd></div>"
                   for k, v in entries)
    return (f'<section class="method" id="method"><h2>{html.escape(METHOD_TITLE)}</h2>'
            f"<p>Every figure and table below uses these unless its caption says what differs."
            f"</p><dl>{body}</dl></section>")


def method_md(entries: list[tuple[str, str]]) -> str:
    lines = [f"## {METHOD_TITLE}", "",
             "Every figure and table below uses these unless its caption says what differs.",
             ""]
    lines += [f"- **{k}:** {md_text(v)}" for k, v in entries]
    return "\n".join(lines) + "\n"


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


def md_text(text: str) -> str:
    """Text from the inputs made inert in Markdown: HTML escaped (a renderer passes raw HTML
    through), one line."""
    return html.escape(str(text), quote=False).replace("\n", " ")


def _md_cell(text: str) -> str:
    return md_text(text).replace("|", "\\|")


def _table_md(t: Table) -> str:
    lines = [f"## {md_text(t.title)}", "", md_text(t.caption), "",
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
    if lab.power_source == MODELLED:
        banner = ("Power in this report is MODELLED, not measured: " + lab.power_detail +
                  ". The numbers show what the pipeline computes; they are not a measurement "
                  "of real hardware.")
    else:
        banner = f"Power in this report is measured ({lab.power_detail})."
    n_runs = len(rd.doc["runs"])
    n_valid = int(rd.per_run[(rd.per_run["phase"] == WindowKind.REQUEST)]["valid"].sum()) if len(
        rd.per_run) else 0
    how = (f"{len(rd.configs)} configurations, {n_runs} runs ({n_valid} valid for the whole-"
           f"request figure). Lower J per token and lower EPI (J per token ÷ accuracy) are "
           f"better. Medians, intervals and the Pareto frontier use valid runs only; invalid "
           f"runs are shown with their own numbers and the reason they are invalid.")
    return banner, how


def to_html(rd: ReportData, title: str, figures: list[RenderedFigure], tables: list[Table]
            ) -> str:
    banner, how = intro(rd)
    block = answers_mod.build(rd)
    parts = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
             f"<title>{html.escape(title)}</title>",
             '<meta name="viewport" content="width=device-width, initial-scale=1">',
             f"<style>{CSS}</style></head><body>",
             f"<h1>{html.escape(title)}</h1>",
             f'<div class="banner {rd.labels.power_source}">{html.escape(banner)}</div>',
             f"<p>{html.escape(how)}</p>",
             answers_html(block),
             method_html(measurement_block(rd)),
             "<p>Contents: " + " · ".join(
                 f'<a href="#{key}">{html.escape(name)}</a>' for key, name in [
                     *((t.key, t.title) for t in tables[:1]),
                     *((f.key, f.title) for f in figures),
                     *((t.key, t.title) for t in tables[1:])])
             + "</p>"]
    parts.append(_table_html(tables[0]))
    for f in figures:
        b64 = base64.b64encode(f.png).decode()
        parts.append(f'<h2 id="{f.key}">{html.escape(f.title)}</h2>\n<figure>'
                     f'<img alt="{html.escape(f.alt or f.title)}" '
                     f'src="data:image/png;base64,{b64}">'
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
    out = [f"# {md_text(title)}", "", f"> {md_text(banner)}", "", md_text(how), "",
           answers_md(answers_mod.build(rd)), method_md(measurement_block(rd)),
           _table_md(tables[0])]
    for f in figures:
        alt = md_text(f.alt or f.title).replace("[", "(").replace("]", ")")
        out += [f"## {md_text(f.title)}", "", f"![{alt}](figures/{f.key}.png)", "",
                md_text(f.caption), ""]
    for t in tables[1:]:
        out.append(_table_md(t))
    notes = rd.doc.get("notes") or []
    if notes:
        out += ["## Analysis notes", ""] + [f"- {md_text(n)}" for n in notes] + [""]
    return "\n".join(out)
