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

from host.analysis.vocabulary import VerdictState
from host.report.render import CSS, _table_html, _table_md
from host.report.tables import Table, num, with_ci
from host.search.summary import ConfigRow, SearchSummary


def _pi(row: ConfigRow) -> str:
    p = row.prediction
    return with_ci(p.epi, *p.epi_interval) if p is not None else with_ci(None, None, None)


def configs_table(doc: SearchSummary) -> Table:
    """Every measured configuration, predicted beside measured, never in its place."""
    rows, classes = [], []
    for r in doc.configs:
        m, p = r.measured, r.prediction
        rows.append([
            r.config, r.kind, r.assignment or "", num(r.proxy_kl_nats),
            num(r.direct_kl_nats),
            num(p.j_per_token if p is not None else None),
            with_ci(m.j_per_token, *m.j_per_token_ci), num(r.energy_residual_j),
            num(p.accuracy if p is not None else None), num(m.accuracy),
            _pi(r), with_ci(m.epi, *m.epi_ci),
            m.power_source or "not stated", m.reason,
        ])
        usable = math.isfinite(m.j_per_token) and math.isfinite(m.accuracy)
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


def comparisons_table(doc: SearchSummary) -> Table:
    """Each candidate against the best hand-made map: decided, equivalent or undecided."""
    rows, classes = [], []
    for c in doc.verdict.comparisons:
        lo, hi = c.get("interval_pct") or (None, None)
        state = c["state"] + (f" ({c['direction']})" if c.get("direction") else "")
        rows.append([c["config"], c["against"], state,
                     with_ci(c.get("saving_pct"), lo, hi),
                     f"{100 * c['coverage']:g} %", str(c["paired_rounds"]),
                     str(c["rounds_done"]),
                     "" if c.get("rounds_needed") is None else str(c["rounds_needed"]),
                     c.get("reason") or ""])
        classes.append("" if c["state"] != VerdictState.UNDECIDED else "invalid")
    return Table(
        "comparisons", "Each candidate against the best hand-made map",
        "Paired saving of J per generated token per campaign round (% of the hand-made map's; "
        "positive: the candidate draws less), with its anytime-valid confidence sequence "
        "(Lai 1976, the campaign's [decide] method): decided when the interval excludes 0, "
        "equivalent when it lies inside ± the margin, else undecided after the budget with the "
        "rounds it would need or the reason. Accuracy is scored once and is not part of it.",
        ["candidate", "against", "verdict", "saving % [interval]", "coverage",
         "paired rounds", "rounds run", "rounds needed", "reason"], rows, classes)


def model_lines(doc: SearchSummary) -> list[str]:
    """The two models and the proxy's validity, one sentence each."""
    p = doc.predictor
    em, am = p.energy, p.accuracy
    res = ", ".join(num(x, "+.3g") for x in em.residuals) or "none"
    return [
        f"Energy model: J/token = {num(em.intercept)} + {num(em.slope)} · GB of "
        f"weights (n = {em.n}, residual sd {num(em.residual_sd)} J; residuals "
        f"{res} J). Prefill and fixed per-request work are lumped into the intercept.",
        f"Accuracy model: composite = {num(am.intercept)} + {num(am.slope)} · KL "
        f"(n = {am.n}), fitted on each file's directly measured KL and applied to a "
        f"candidate's summed per-layer proxy."
        + (" The free fit's slope was positive (accuracy rising with divergence from the "
           "base: the composite cannot resolve these KL differences), so the slope is held at "
           "0: predicted accuracy is the mean, and candidates rank by energy alone."
           if am.clamped else ""),
        f"Rank correlation with the measured composite: summed per-layer proxy "
        f"{num(p.proxy_rank_correlation)} (n = {p.proxy_n}, "
        f"the quantity the search ranks by); direct whole-file KL "
        f"{num(p.direct_kl_rank_correlation)}.",
        f"Rank correlation with the measured perplexity (higher KL should mean higher "
        f"perplexity): direct whole-file KL {num(p.direct_kl_ppl_rank_correlation)}, "
        f"summed per-layer proxy {num(p.proxy_ppl_rank_correlation)} "
        f"(n = {p.ppl_n} maps with a perplexity).",
    ]


def write_page(doc: SearchSummary, out: Path, png: Path) -> tuple[Path, Path]:
    """Write search.html and search.md into `out`; returns their paths."""
    sources = sorted({r.measured.power_source for r in doc.configs
                      if r.measured.power_source})
    modelled = not sources or any(not s.startswith("measured") for s in sources)
    banner = ("Power is MODELLED (" if modelled else "Power is measured (") + \
        (", ".join(sources) or "source not stated") + ")."
    verdict = doc.verdict
    table = configs_table(doc)
    comps = comparisons_table(doc)
    lines = model_lines(doc)
    title = "epi search"
    img = base64.b64encode(png.read_bytes()).decode("ascii")
    cls = "modelled" if modelled else "measured"
    body = [
        f"<h1>{title}</h1>",
        f'<div class="banner {cls}">{html.escape(banner)}</div>',
        f"<p><b>Verdict:</b> {html.escape(verdict.text)}</p>",
        f"<p><b>Frontier:</b> {html.escape(verdict.frontier.text)}</p>",
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
        f"# {title}", "", f"**{banner}**", "", f"**Verdict:** {verdict.text}", "",
        f"**Frontier:** {verdict.frontier.text}", "", f"![search]({png.name})", "",
        _table_md(comps), _table_md(table), "## Models", "", *[f"- {s}" for s in lines], "",
    ])
    paths = (out / "search.html", out / "search.md")
    paths[0].write_text(page)
    paths[1].write_text(md)
    return paths
