"""The search's small report page: OUT/search.html (self-contained, the figure embedded) and
OUT/search.md (linking search.png beside it).

It reuses the campaign report's CSS and table renderers (host/report/render.py) so a search
page reads like a campaign report; it only imports from there. What it states: the power
source (modelled or measured), the verdict and how far the frontier moved, every configuration
with predicted (at pick time) and measured figures side by side with their intervals, the two
fitted models with the energy residuals, and the proxy's rank correlations.
"""

from __future__ import annotations

import base64
import html
import math
from pathlib import Path
from typing import Any

from host.report.render import CSS, _table_html, _table_md
from host.report.tables import Table, num, with_ci


def _pi(row: dict[str, Any]) -> str:
    lo, hi = row.get("predicted_epi_interval") or (None, None)
    return with_ci(row.get("predicted_epi"), lo, hi)


def configs_table(doc: dict[str, Any]) -> Table:
    """Every measured configuration, predicted beside measured, never in its place."""
    rows, classes = [], []
    for r in doc["configs"]:
        m = r["measured"]
        rows.append([
            r["config"], r["kind"], r.get("assignment", ""), num(r.get("proxy_kl_nats")),
            num(r.get("direct_kl_nats")),
            num(r.get("predicted_j_per_token")),
            with_ci(m["j_per_token"], *m["j_per_token_ci"]), num(r.get("energy_residual_j")),
            num(r.get("predicted_accuracy")), num(m["accuracy"]),
            _pi(r), with_ci(m["epi"], *m["epi_ci"]),
            m["power_source"] or "not stated", m["reason"],
        ])
        usable = math.isfinite(m["j_per_token"]) and math.isfinite(m["accuracy"])
        classes.append("" if usable else "invalid")
    return Table(
        "configs", "Configurations: predicted (when picked) and measured",
        "Predicted figures are the models' at pick time, before the candidate was measured "
        "(fitted on every map measured before it). Measured figures are the campaign's, with its "
        "intervals; only they count. J resid: measured J/token minus the final energy fit.",
        ["config", "kind", "layers:type", "proxy KL", "direct KL", "J/tok pred",
         "J/tok meas [CI]", "J resid", "acc pred", "acc meas", "EPI pred [PI]",
         "EPI meas [CI]", "power", "note"],
        rows, classes)


def comparisons_table(doc: dict[str, Any]) -> Table:
    """Each candidate against the best hand-made map: decided, equivalent or undecided."""
    rows, classes = [], []
    for c in doc["verdict"].get("comparisons") or []:
        lo, hi = c.get("interval_pct") or (None, None)
        state = c["state"] + (f" ({c['direction']})" if c.get("direction") else "")
        rows.append([c["config"], c["against"], state,
                     with_ci(c.get("saving_pct"), lo, hi),
                     f"{100 * c['coverage']:g} %", str(c["paired_rounds"]),
                     str(c["rounds_done"]),
                     "" if c.get("rounds_needed") is None else str(c["rounds_needed"]),
                     c.get("reason") or ""])
        classes.append("" if c["state"] != "undecided" else "invalid")
    return Table(
        "comparisons", "Each candidate against the best hand-made map",
        "Paired saving of J per generated token per campaign round (% of the hand-made map's; "
        "positive: the candidate draws less), with its anytime-valid confidence sequence "
        "(Lai 1976, the campaign's [decide] method): decided when the interval excludes 0, "
        "equivalent when it lies inside ± the margin, else undecided after the budget with the "
        "rounds it would need or the reason. Accuracy is scored once and is not part of it.",
        ["candidate", "against", "verdict", "saving % [interval]", "coverage",
         "paired rounds", "rounds run", "rounds needed", "reason"], rows, classes)


def model_lines(doc: dict[str, Any]) -> list[str]:
    """The two models and the proxy's validity, one sentence each."""
    em, am = doc["energy_model"], doc["accuracy_model"]
    res = ", ".join(num(x, "+.3g") for x in em["residuals_j"]) or "none"
    return [
        f"Energy model: J/token = {num(em['intercept_j'])} + {num(em['j_per_gb'])} · GB of "
        f"weights (n = {em['n']}, residual sd {num(em.get('residual_sd_j'))} J; residuals "
        f"{res} J). Prefill and fixed per-request work are lumped into the intercept.",
        f"Accuracy model: composite = {num(am['intercept'])} + {num(am['per_nat'])} · KL "
        f"(n = {am['n']}), fitted on each file's directly measured KL and applied to a "
        f"candidate's summed per-layer proxy."
        + (" The free fit's slope was positive (accuracy rising with divergence from the "
           "base: the composite cannot resolve these KL differences), so the slope is held at "
           "0: predicted accuracy is the mean, and candidates rank by energy alone."
           if am.get("clamped") else ""),
        f"Rank correlation with the measured composite: summed per-layer proxy "
        f"{num(doc['proxy_rank_correlation'])} (n = {doc.get('proxy_rank_correlation_n', '?')}, "
        f"the quantity the search ranks by); direct whole-file KL "
        f"{num(doc.get('direct_kl_rank_correlation'))}.",
        f"Rank correlation with the measured perplexity (higher KL should mean higher "
        f"perplexity): direct whole-file KL {num(doc.get('direct_kl_ppl_rank_correlation'))}, "
        f"summed per-layer proxy {num(doc.get('proxy_ppl_rank_correlation'))} "
        f"(n = {doc.get('ppl_rank_correlation_n', 0)} maps with a perplexity).",
    ]


def write_page(doc: dict[str, Any], out: Path, png: Path) -> tuple[Path, Path]:
    """Write search.html and search.md into `out`; returns their paths."""
    sources = sorted({r["measured"]["power_source"] for r in doc["configs"]
                      if r["measured"]["power_source"]})
    modelled = not sources or any(not s.startswith("measured") for s in sources)
    banner = ("Power is MODELLED (" if modelled else "Power is measured (") + \
        (", ".join(sources) or "source not stated") + ")."
    verdict = doc["verdict"]
    table = configs_table(doc)
    comps = comparisons_table(doc)
    lines = model_lines(doc)
    title = "epi search"
    img = base64.b64encode(png.read_bytes()).decode("ascii")
    cls = "modelled" if modelled else "measured"
    body = [
        f"<h1>{title}</h1>",
        f'<div class="banner {cls}">{html.escape(banner)}</div>',
        f"<p><b>Verdict:</b> {html.escape(verdict['text'])}</p>",
        f"<p><b>Frontier:</b> {html.escape(verdict['frontier']['text'])}</p>",
        f'<figure><img alt="search" src="data:image/png;base64,{img}"><figcaption>'
        "Left: measured J/token (bars: campaign intervals) and composite accuracy; the line is "
        "the hand-made frontier. Right: EPI predicted at pick time (bars: prediction interval) "
        "against measured EPI (bars: campaign interval).</figcaption></figure>",
        _table_html(comps),
        _table_html(table),
        "<h2>Models</h2><ul>" + "".join(f"<li>{html.escape(s)}</li>" for s in lines) + "</ul>",
    ]
    page = (f"<!doctype html><html><head><meta charset=\"utf-8\"><title>{title}</title>"
            f"<style>{CSS}</style></head><body>\n" + "\n".join(body) + "\n</body></html>\n")
    md = "\n".join([
        f"# {title}", "", f"**{banner}**", "", f"**Verdict:** {verdict['text']}", "",
        f"**Frontier:** {verdict['frontier']['text']}", "", f"![search]({png.name})", "",
        _table_md(comps), _table_md(table), "## Models", "", *[f"- {s}" for s in lines], "",
    ])
    paths = (out / "search.html", out / "search.md")
    paths[0].write_text(page)
    paths[1].write_text(md)
    return paths
