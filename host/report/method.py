"""The report's one "how these figures were measured" block.

Power source, energy basis, integration method, what each kind of interval is (method,
achieved coverage and n per configuration) and the sample counts are stated here once; each
figure and table caption then names only what differs from this block (and keeps a short
power tag), instead of repeating six to ten lines of it.
"""

from __future__ import annotations

from host.analysis.vocabulary import EnergyBasis, EnergyMethod
from host.report import instrument
from host.report.data import (
    ReportData,
    accuracy_interval_text,
    epi_interval_text,
    interval_text,
)

TITLE = "How these figures were measured"


def comparison_methods(rd: ReportData) -> list[str]:
    """Every interval method the paired comparisons, savings, pairs and differential use."""
    doc = rd.doc
    rows: list[object] = []
    for key in ("comparisons", "savings", "perplexity_matched_pairs"):
        value = doc.get(key)
        rows += value if isinstance(value, list) else []
    lg = doc.get("layer_groups")
    if isinstance(lg, dict) and isinstance(lg.get("differential"), list):
        rows += lg["differential"]
    out: list[str] = []
    for r in rows:
        if not isinstance(r, dict):
            continue
        for col in ("energy_ci_method", "ci_method", "accuracy_method"):
            m = r.get(col)
            if isinstance(m, str) and m and not m.startswith("no per-item"):
                out.append(m)
    return list(dict.fromkeys(out))


def measurement_block(rd: ReportData) -> list[tuple[str, str]]:
    """(label, text) entries of the block, in reading order."""
    lab = rd.labels
    h = rd.headline()
    basis = ("gross: the wall energy of each window" if lab.energy_basis == EnergyBasis.GROSS else
             "net: the window's energy minus idle-baseline power × its duration")
    method = (f"{lab.energy_method} energy, {lab.edge_model} window edges ("
              + ("the chip's cumulative energy counter differenced over each window"
                 if lab.energy_method == EnergyMethod.COUNTER else
                 "the trapezoid integral of the power readings")
              + "; windows: prefill = request start → first token, decode = first → last "
                "token)")
    comps = comparison_methods(rd)
    entries = [
        ("power", lab.power_text()),
        ("energy basis", basis),
        ("method", method),
        ("intervals", "; ".join([interval_text(h), accuracy_interval_text(h),
                                 epi_interval_text(h)])),
        ("instrument uncertainty", instrument.method_text(rd)),
        ("paired comparisons", "; ".join(comps) + "; a comparison is decided when its "
         "interval excludes 0, else 'cannot be told apart'" if comps else
         "none in this study"),
        ("sample counts", "; ".join(f"{phase}: {rd.counts(phase)}"
                                    for phase in ("request", "prefill", "decode"))),
        ("invalid runs", "left out of every median, interval and the Pareto frontier; shown "
         "with their own measured figures (hollow grey markers, shaded rows) and reasons"
         + _spread_gate(rd)),
    ]
    return entries


def _spread_gate(rd: ReportData) -> str:
    """The repeat-spread gate the analysis applied, as results.json's options give it."""
    options = rd.doc.get("options")
    cv = options.get("cv_threshold") if isinstance(options, dict) else None
    if not isinstance(cv, int | float) or isinstance(cv, bool):
        return ""
    return (f"; among the gates, a run is refused when its repeats' J/token vary by a CV above "
            f"{100 * cv:g} % (cv_threshold{'' if cv == 0.03 else ', the default is 3 %'})")
