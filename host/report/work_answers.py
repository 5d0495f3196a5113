"""The report's answers to RQ4 (size of the EPI-optimal mix against uniform Q4_K_M) and RQ5
(bandwidth or compute), worded from host/analysis/questions.py's statistics.

RQ4's reference is `uniform_q4km` when the study has it, else the analysis's
`reference_map` option (`[analysis] reference_map`). RQ5's work terms, per configuration:

- bytes streamed per decoded token: the work account of the model file
  (host/analysis/work_account.py: every weight once, one embedding row; for a mixture of
  experts the shared tensors plus `n_expert_used / n_expert` of the experts, an expectation),
  when every configuration's GGUF can be read; otherwise the model file's size (an upper
  bound, stated);
- compute per token: the configuration's own measured prefill seconds per prompt token on
  this node (prefill is compute-bound: its time per token is the cost of that map's kernels
  here, measured, not assumed);

and the energy figure is decode J per generated token (the memory-bound phase).
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from epi.core.errors import UserError
from host.analysis.headline import headline_rows
from host.analysis.intervals import finite as _finite
from host.analysis.intervals import number
from host.analysis.questions import decompose, size_vs_reference
from host.analysis.vocabulary import Phase
from host.analysis.work_account import WorkAccount, work_account
from host.report.answer_model import DECIDED, UNANSWERABLE, UNDECIDED, Answer
from host.report.data import ReportData
from host.run.compute_probe import read_probe, weights_by_type
from host.run.perf_counters import CORTEX_A76_EVENTS, GENERIC_HW_EVENTS
from host.run.perf_log import JSON_NAME

HARDWARE = {e.name for e in (*CORTEX_A76_EVENTS, *GENERIC_HW_EVENTS)}

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


def work_accounts(rd: ReportData) -> dict[str, WorkAccount]:
    """Each configuration's work account, from the model file its runs name (where readable)."""
    out: dict[str, WorkAccount] = {}
    for run in rd.doc.get("runs") or []:
        cfg, model = run.get("config"), run.get("model") or {}
        path = model.get("path") if isinstance(model, dict) else None
        if not isinstance(cfg, str) or cfg in out or not isinstance(path, str):
            continue
        try:
            out[cfg] = work_account(Path(path))
        except UserError:
            continue  # moved or unreadable here: the file size stands in, said so
    return out


def bytes_per_token(rd: ReportData) -> tuple[dict[str, float], str]:
    """(bytes streamed per decoded token per configuration, how they were counted)."""
    sizes = {c: number(rd.models.loc[c, "size_bytes"]) for c in rd.models.index
             if _finite(rd.models.loc[c, "size_bytes"])} if len(rd.models) else {}
    accounts = work_accounts(rd)
    if sizes and all(c in accounts for c in sizes):
        moe = any(a.is_expectation for a in accounts.values())
        how = ("bytes = weight bytes streamed per decoded token from each GGUF's tensor table "
               "(every weight once, one embedding row" +
               ("; mixture of experts: shared tensors plus n_expert_used/n_expert of the "
                "experts, an expectation under uniform routing)" if moe else ")"))
        return {c: accounts[c].bytes_per_token for c in sizes}, how
    return sizes, ("bytes = the model file's size streamed per decoded token (the GGUF files "
                   "could not all be read here; dense model: an upper bound)")


def counters_line(rd: ReportData) -> str:
    """Which kernel counters the runs recorded (perf_counters.json beside each token log)."""
    counted: set[str] = set()
    missing: dict[str, str] = {}
    seen = 0
    for run in rd.doc.get("runs") or []:
        path = run.get("path") if isinstance(run, dict) else None
        info = Path(str(path)) / JSON_NAME if isinstance(path, str) else None
        if info is None or not info.is_file():
            continue
        try:
            doc = json.loads(info.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        seen += 1
        counted.update(e for e in doc.get("events") or [] if isinstance(e, str))
        missing.update({k: str(v) for k, v in (doc.get("unavailable") or {}).items()})
    if not seen:
        return " Hardware counters: none recorded with these runs; the work account stands alone."
    hw = sorted(e for e in counted if e in HARDWARE)
    if hw:
        return (f" Hardware counters recorded per request and phase: {', '.join(hw)} "
                "(perf_counters.csv beside each token log).")
    why = sorted({missing[e] for e in missing if e in HARDWARE})
    return (" Hardware counters: not available on these nodes (" + ("; ".join(why) or
            "no PMU") + "); software counters only, so the work account stands alone.")


def probe_path(rd: ReportData) -> Path:
    """Where a campaign keeps its compute probe: OUT/probes/compute.json beside OUT/analysis."""
    return Path(rd.analysis_dir).parent / "probes" / "compute.json"


def compute_per_token(rd: ReportData) -> tuple[dict[str, float], str]:
    """(compute seconds per decoded token per configuration, how they were counted): from the
    node's compute probe where the campaign ran one and it covers every type, else each
    configuration's measured prefill seconds per prompt token."""
    fallback = (_phase_rate(rd.windows, "prefill", "n_prompt_tokens"),
                "compute = this node's measured prefill time per prompt token (no compute "
                "probe covers these maps: `[analysis] compute_probe = true` measures one)")
    path = probe_path(rd)
    if not path.is_file():
        return fallback
    try:
        probe = read_probe(path)
    except UserError:
        return fallback
    out: dict[str, float] = {}
    for run in rd.doc.get("runs") or []:
        cfg, model = run.get("config"), run.get("model") or {}
        gguf = model.get("path") if isinstance(model, dict) else None
        if not isinstance(cfg, str) or cfg in out or not isinstance(gguf, str):
            continue
        try:
            value = probe.compute_s_per_token(weights_by_type(Path(gguf)))
        except UserError:
            return fallback
        if value is None:
            return fallback
        out[cfg] = value
    resident = all(c.cache_resident for c in probe.costs.values())
    return out, ("compute = Σ block weights × this node's cost per weight of their type, "
                 f"measured cache-resident by the compute probe ({probe.threads} thread(s), "
                 f"{probe.build}" + ("" if resident else "; some types' working set exceeded "
                                     "the cache, so their cost includes memory traffic") + ")")


def work_answer(rd: ReportData) -> Answer:
    q = ("Does the energy benefit of mixed quantization come from reduced memory bandwidth, "
         "reduced compute, or both?")
    r = rd.results
    dec = headline_rows(r, rd.basis, phase=Phase.DECODE)
    j = {str(row["config"]): number(row["j_per_token_median"]) for _, row in dec.iterrows()
         if _finite(row["j_per_token_median"])}
    sizes, how = bytes_per_token(rd)
    compute, compute_how = compute_per_token(rd)
    d = decompose(j, sizes, compute)
    if d is None:
        have = len([c for c in j if c in sizes and c in compute])
        return Answer("work", q, f"{have} configuration(s) have a decode J/token, a file size "
                      "and a measured prefill time: the decomposition needs at least 4 (what "
                      "would decide it: valid decode figures for more maps).", UNANSWERABLE)
    lvl = f"{d.level:.0%}"
    terms = (f"bandwidth term {d.a * 1e9:+.3g} nJ per byte per token "
             f"[{d.a_ci[0] * 1e9:.3g}, {d.a_ci[1] * 1e9:.3g}], compute term "
             f"{d.b:+.3g} J per compute-second per token [{d.b_ci[0]:.3g}, {d.b_ci[1]:.3g}] "
             f"({lvl} intervals, n={d.n}, R² {d.r2:.2f}, correlation of the two terms "
             f"{d.corr:+.2f}, variance inflation {d.vif:.3g})")
    if d.answer == "cannot be told apart":
        text = (f"Cannot be told apart: across these maps the bytes streamed and the compute "
                f"per token move together ({terms}); what would decide it: maps that change "
                "one without the other (e.g. the same size with a costlier kernel type).")
    elif d.answer == "neither term resolved":
        text = (f"Undecided: neither term's interval excludes 0 ({terms}); what would decide "
                "it: more rounds (narrower decode J/token) or more maps.")
    else:
        text = f"{d.answer.capitalize()}: decode J/token is explained by {terms}."
    text += f" Terms: {how}; {compute_how}."
    text += counters_line(rd)
    status = DECIDED if d.status == DECIDED else UNDECIDED
    return Answer("work", q, text, status)


