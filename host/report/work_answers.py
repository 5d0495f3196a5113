"""The report's answers to RQ4 (size of the EPI-optimal mix against uniform Q4_K_M) and RQ5
(bandwidth or compute), worded from host/analysis/questions.py's statistics.

RQ4's reference is `uniform_q4km` when the study has it, else the analysis's
`reference_map` option (`[analysis] reference_map`). RQ5's work terms, per configuration:

- bytes streamed per decoded token: the model file's size (a dense model reads every weight
  for every token; the file's few non-weight bytes and the token embedding, of which one row
  is read, are within it: an upper bound, stated);
- compute per token: the configuration's own measured prefill seconds per prompt token on
  this node (prefill is compute-bound: its time per token is the cost of that map's kernels
  here, measured, not assumed);

and the energy figure is decode J per generated token (the memory-bound phase).
"""

from __future__ import annotations

import pandas as pd

from host.analysis.headline import headline_rows
from host.analysis.intervals import finite as _finite
from host.analysis.intervals import number
from host.analysis.questions import decompose, size_vs_reference
from host.analysis.vocabulary import Phase
from host.report.answer_model import DECIDED, UNANSWERABLE, UNDECIDED, Answer
from host.report.data import ReportData

REFERENCE = "uniform_q4km"


def _reference(rd: ReportData) -> str | None:
    if REFERENCE in rd.configs:
        return REFERENCE
    named = (rd.doc.get("options") or {}).get("reference_map")
    return str(named) if isinstance(named, str) and named in rd.configs else None


def size_answer(rd: ReportData) -> Answer:
    q = "Is the EPI-optimal mixed configuration smaller or larger than uniform Q4_K_M?"
    ref = _reference(rd)
    if ref is None:
        return Answer("size", q, "The study has no uniform Q4_K_M map to compare with (add "
                      "quantmaps/uniform_q4km.json, or name a reference with [analysis] "
                      "reference_map).", UNANSWERABLE)
    h = rd.headline()
    epi = {c: (number(h.loc[c, "epi"]), number(h.loc[c, "epi_ci_lo"]),
               number(h.loc[c, "epi_ci_hi"])) for c in h.index
           if all(_finite(h.loc[c, k]) for k in ("epi", "epi_ci_lo", "epi_ci_hi"))}
    sizes = {c: number(rd.models.loc[c, "size_bytes"]) for c in rd.models.index
             if _finite(rd.models.loc[c, "size_bytes"])} if len(rd.models) else {}
    v = size_vs_reference(epi, sizes, ref)
    if v is None:
        return Answer("size", q, "No configuration has an EPI with an interval and a known "
                      f"file size beside {ref}'s, so the optimum cannot be placed (needs "
                      "accuracy and valid runs for every configuration).", UNANSWERABLE)
    members = ", ".join(f"{c} ({v.ratios[c]:.2f}× {ref}'s size)" for c in v.optimum)
    if v.status == DECIDED:
        text = (f"{v.optimum[0]} has the lowest EPI and no other configuration's EPI interval "
                f"reaches it: it is {v.answer} than {ref} ({members}).")
    else:
        text = (f"The EPI optimum cannot be told from {len(v.optimum) - 1} other "
                f"configuration(s) ({members}); across that set the answer is {v.answer}. "
                "What would decide it: more accuracy items or more rounds, narrowing the EPI "
                "intervals until one configuration stands alone.")
    return Answer("size", q, text, DECIDED if v.status == DECIDED else UNDECIDED)


def _phase_rate(windows: pd.DataFrame, phase: str, tokens: str) -> dict[str, float]:
    if windows.empty or not {"config", "kind", "duration_s", tokens} <= set(windows.columns):
        return {}
    w = windows[windows["kind"] == phase]
    out = {}
    for cfg, g in w.groupby("config"):
        t = float(g[tokens].astype(float).sum())
        if t > 0:
            out[str(cfg)] = float(g["duration_s"].astype(float).sum()) / t
    return out


def work_answer(rd: ReportData) -> Answer:
    q = ("Does the energy benefit of mixed quantization come from reduced memory bandwidth, "
         "reduced compute, or both?")
    r = rd.results
    dec = headline_rows(r, rd.basis, phase=Phase.DECODE)
    j = {str(row["config"]): number(row["j_per_token_median"]) for _, row in dec.iterrows()
         if _finite(row["j_per_token_median"])}
    sizes = {c: number(rd.models.loc[c, "size_bytes"]) for c in rd.models.index
             if _finite(rd.models.loc[c, "size_bytes"])} if len(rd.models) else {}
    compute = _phase_rate(rd.windows, "prefill", "n_prompt_tokens")
    d = decompose(j, sizes, compute)
    if d is None:
        have = len([c for c in j if c in sizes and c in compute])
        return Answer("work", q, f"{have} configuration(s) have a decode J/token, a file size "
                      "and a measured prefill time: the decomposition needs at least 4 (what "
                      "would decide it: valid decode figures for more maps).", UNANSWERABLE)
    lvl = f"{d.level:.0%}"
    terms = (f"bandwidth term {d.a * 1e9:+.3g} nJ per byte per token "
             f"[{d.a_ci[0] * 1e9:.3g}, {d.a_ci[1] * 1e9:.3g}], compute term "
             f"{d.b:+.3g} J per prefill-second per token [{d.b_ci[0]:.3g}, {d.b_ci[1]:.3g}] "
             f"({lvl} intervals, n={d.n}, R² {d.r2:.2f}, correlation of the two terms "
             f"{d.corr:+.2f}, variance inflation {d.vif:.1f})")
    if d.answer == "cannot be told apart":
        text = (f"Cannot be told apart: across these maps the bytes streamed and the compute "
                f"per token move together ({terms}); what would decide it: maps that change "
                "one without the other (e.g. the same size with a costlier kernel type).")
    elif d.answer == "neither term resolved":
        text = (f"Undecided: neither term's interval excludes 0 ({terms}); what would decide "
                "it: more rounds (narrower decode J/token) or more maps.")
    else:
        text = f"{d.answer.capitalize()}: decode J/token is explained by {terms}."
    text += (" Terms: bytes = the model file's size streamed per decoded token (dense model; "
             "an upper bound); compute = this node's measured prefill time per prompt token.")
    status = DECIDED if d.status == DECIDED else UNDECIDED
    return Answer("work", q, text, status)


