"""The answer block at the top of the report: the study's five questions answered in words.

1. Which configurations would perplexity-only evaluation miss (same perplexity, different
   joules)?
2. Which configurations are on the accuracy–J/token frontier?
3. Which layer groups are most sensitive to quantization depth in energy terms?
4. Is the EPI-optimal mix smaller or larger than uniform Q4_K_M? (host/report/work_answers.py)
5. Does the energy benefit come from bandwidth, compute or both? (the same module)

Each answer names the configurations, the figure, its interval (with coverage and n) and
whether the paired comparison behind it is *decided* (its interval excludes 0) or not. The
figures are the analysis' own (results.csv, comparisons, perplexity-matched pairs, the layer-
group differential): this module words them, it computes no statistic of its own. A last
entry says plainly what the study cannot tell.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np
import pandas as pd

from epi.core.text import as_number, format_number
from epi.formats.json_types import JSONObject
from host.analysis.intervals import finite as _finite
from host.analysis.intervals import format_interval, pct
from host.analysis.paired import items_to_tell_apart
from host.analysis.power_source import MODELLED
from host.analysis.vocabulary import WindowKind
from host.report import instrument
from host.report.answer_model import (
    DECIDED,
    PARTLY,
    UNANSWERABLE,
    UNDECIDED,
    Answer,
    AnswerBlock,
)
from host.report.data import ReportData
from host.report.sequential import limit_line, load_decisions
from host.report.split_table import split_answer
from host.report.transfer_answer import transfer_answer
from host.report.work_answers import size_answer, work_answer

# a map's only layer group when it quantizes the whole model alike (quantmaps/)
WHOLE_MODEL_GROUP = "all"


def _rows(doc: Mapping[str, object], key: str) -> list[JSONObject]:
    value = doc.get(key)
    return [r for r in value if isinstance(r, dict)] if isinstance(value, list) else []


def _sequential(rd: ReportData, a: str, b: str) -> tuple[str, str] | None:
    """The campaign's anytime-valid (state, line) for the comparison of `a` and `b`: when
    the campaign decided adaptively, that is the one verdict of the comparison everywhere."""
    decisions = load_decisions(rd.analysis_dir)
    return decisions.verdict(a, b) if decisions is not None else None


def _combine(statuses: list[str]) -> str:
    if not statuses:
        return UNDECIDED
    if all(s == DECIDED for s in statuses):
        return DECIDED
    return PARTLY if DECIDED in statuses else UNDECIDED


def frontier_answer(rd: ReportData) -> Answer:
    """Q1 from the analysis' Pareto frontier and its 'frontier neighbours' comparisons."""
    q = "Which configurations are on the accuracy–J/token frontier?"
    h = rd.headline()
    front = [c for c in (rd.doc.get("pareto") or []) if isinstance(c, str) and c in h.index]
    front.sort(key=lambda c: float(h.loc[c, "j_per_token_median"]))
    no_valid = [c for c in rd.configs if c not in h.index
                or not _finite(h.loc[c, "j_per_token_median"])]
    tail = (f" {', '.join(no_valid)} had no valid run and cannot be placed." if no_valid
            else "")
    if not front:
        return Answer("frontier", q, "No frontier: no configuration has both a valid J/token "
                      "and an accuracy." + tail, UNANSWERABLE)
    parts = []
    for c in front:
        r = h.loc[c]
        jpt = format_interval(r["j_per_token_median"], r["j_per_token_ci_lo"],
                              r["j_per_token_ci_hi"], r.get("ci_coverage"), n=r.get("n_repeats"))
        acc = format_interval(r["accuracy"], r["accuracy_ci_lo"], r["accuracy_ci_hi"], 0.95,
                              fmt=".3f")
        parts.append(f"{c} ({rd.basis} J/token {jpt}; accuracy {acc})")
    text = (f"{len(front)} of {len(h.index)} configuration(s), cheapest first: "
            + "; ".join(parts) + ".")
    statuses = []
    if len(front) == 1:
        text += (" It is the only point on the frontier: it is at least as cheap and as "
                 "accurate as every other configuration on the medians; no paired comparison "
                 "tests that dominance; what would decide it: its J/token and accuracy told "
                 "apart from every other configuration's in paired comparisons ([decide] "
                 "compare = [\"all_pairs\"], and more accuracy items).")
        statuses.append(UNDECIDED)
    for r in _rows(rd.doc, "comparisons"):
        if r.get("comparison") != "frontier neighbours":
            continue
        a, b = str(r.get("config_a")), str(r.get("config_b"))
        e, acc_d = r.get("energy_distinguishable"), r.get("accuracy_distinguishable")
        delta = format_interval(r.get("energy_delta_j_per_token"), r.get("energy_delta_ci_lo"),
                                r.get("energy_delta_ci_hi"), r.get("energy_ci_coverage"),
                                n=r.get("n_pairs") or None, fmt="+.3g")
        energy = ("told apart on energy" if e is True else "not told apart on energy"
                  if e is False else "no energy interval")
        seq = _sequential(rd, a, b)
        if seq is not None:  # the campaign's sequential verdict is the verdict
            e = seq[0] == DECIDED
            energy = (f"energy {seq[0]} by the campaign's sequential test (the fixed-sample "
                      "Δ is descriptive)")
        accuracy = ("told apart on accuracy" if acc_d is True else "not told apart on accuracy"
                    if acc_d is False else "accuracy not compared per item")
        text += f" {a} → {b}: Δ J/token {delta}, {energy}; {accuracy}"
        remedy = _neighbour_remedy(r, energy_decided=e is True, sequential=seq is not None)
        text += f"; what would decide it: {remedy}." if remedy else "."
        statuses.append(DECIDED if e is True and acc_d is True else UNDECIDED)
    if len(front) > 1 and not statuses:
        text += " The analysis made no paired comparison of the frontier's neighbours."
        statuses.append(UNDECIDED)
    return Answer("frontier", q, text + tail, _combine(statuses))


def _accuracy_remedy(r: Mapping[str, object]) -> str | None:
    """What would tell two configurations apart on accuracy, from their paired items: the
    item count at the observed difference (Connor's closed form), or why none follows."""
    if r.get("accuracy_distinguishable") is True:
        return None
    delta = as_number(r.get("accuracy_delta"))
    if not math.isfinite(delta):
        return "per-item accuracy outcomes for both (an accuracy file with its items)"
    n_items, disc = as_number(r.get("accuracy_n_items")), as_number(r.get("accuracy_discordant"))
    if not (math.isfinite(n_items) and math.isfinite(disc)):
        return "more accuracy items (the analysis recorded no item counts)"
    n, d = int(n_items), int(disc)
    need = items_to_tell_apart(delta, n, d)
    if need is None:
        return (f"nothing in these items: the two answered the same on all {n} or differ "
                f"on {d} items with no net difference, so they may be equally accurate; "
                "more items would show a difference only if there is one")
    if need <= n:
        return (f"more accuracy items: the observed difference sits at the edge of what "
                f"{n} items resolve (about {need} give 80 % power at it)")
    return (f"about {need} paired accuracy items (80 % power at the observed difference; "
            f"{n} scored)")


def _neighbour_remedy(r: Mapping[str, object], *, energy_decided: bool,
                      sequential: bool) -> str:
    """The clause that says what would settle an undecided pair of frontier neighbours."""
    parts = []
    if not energy_decided:
        parts.append("more paired rounds on energy (the campaign's decide line gives their "
                     "number)" if sequential else
                     "more paired rounds on energy ([decide] in the study file sizes them)")
    acc = _accuracy_remedy(r)
    if acc is not None:
        parts.append(acc)
    return "; ".join(parts)


def perplexity_answer(rd: ReportData) -> Answer:
    """Q2 from the perplexity-matched pairs (same perplexity within the tolerance)."""
    q = "Which configurations would perplexity-only evaluation miss (same perplexity, " \
        "different joules)?"
    h = rd.headline()
    have_ppl = "perplexity" in h.columns and h["perplexity"].apply(_finite).any()
    tol = (rd.doc.get("options") or {}).get("ppl_tolerance", 0.01)
    tol_txt = pct(float(tol)) if _finite(tol) else "the tolerance"
    if not have_ppl:
        return Answer("perplexity", q, "No configuration has a perplexity in this study "
                      "(none was scored), so no pair can be matched on it.", UNANSWERABLE)
    pairs = _rows(rd.doc, "perplexity_matched_pairs")
    if not pairs:
        return Answer("perplexity", q, f"No two configurations have perplexities within "
                      f"{tol_txt} of each other: perplexity alone tells every configuration "
                      "apart here, so it misses none.", DECIDED)
    parts, statuses = [], []
    for p in pairs:
        saving = format_interval(p.get("saving_pct"), p.get("saving_pct_ci_lo"),
                                 p.get("saving_pct_ci_hi"), p.get("ci_coverage"),
                                 n=p.get("n_pairs") or None, fmt=".2f")
        dist = p.get("distinguishable")
        verdict = ("decided: different joules" if dist is True else
                   "undecided: the interval holds 0" if dist is False else
                   f"undecided: no interval ({p.get('reason') or 'too few repeats'})")
        seq = _sequential(rd, str(p.get("cheaper")), str(p.get("dearer")))
        if seq is not None:  # the campaign's sequential verdict is the verdict
            dist = seq[0] == DECIDED
            verdict = (f"{seq[0]} by the campaign's sequential test (the saving's "
                       "fixed-sample interval is descriptive)")
        parts.append(f"{p.get('cheaper')} (perplexity {_num(p.get('ppl_cheaper'))}) vs "
                     f"{p.get('dearer')} ({_num(p.get('ppl_dearer'))}): saving {saving} "
                     f"(percent of {p.get('dearer')}'s {rd.basis} J/token) — {verdict}")
        statuses.append(DECIDED if dist is True else UNDECIDED)
    missed = [p for p, s in zip(pairs, statuses, strict=True) if s == DECIDED]
    lead = (f"{len(pairs)} pair(s) with perplexities within {tol_txt}; perplexity-only "
            f"evaluation would miss the energy difference in {len(missed)} of them. ")
    return Answer("perplexity", q, lead + "; ".join(parts) + ".", _combine(statuses))


def _num(x: object) -> str:
    return format_number(x, ".3f")


def layer_group_answer(rd: ReportData) -> Answer:
    """Q3 from the differential: maps that differ in exactly one layer group's type."""
    q = "Which layer groups are most sensitive to quantization depth in energy terms?"
    lg = rd.doc.get("layer_groups")
    diff = pd.DataFrame(_rows(lg, "differential") if isinstance(lg, dict) else [])
    if diff.empty:
        return Answer("layer_groups", q, "No two configurations differ in exactly one layer "
                      "group, so no group's energy effect can be isolated (add maps that "
                      "change one group at a time).", UNANSWERABLE)
    diff = diff[diff["delta_j_per_token"].apply(_finite)]
    if diff.empty:
        return Answer("layer_groups", q, "Maps differing in one group exist, but none has a "
                      "Δ J/token (no valid runs on one side).", UNANSWERABLE)
    diff = diff.assign(size=diff["delta_j_per_token"].astype(float).abs())
    # a map's only group "all" is the whole model: reported, never ranked among layer groups
    whole = diff[diff["group"] == WHOLE_MODEL_GROUP]
    if len(whole) < len(diff):
        diff = diff[diff["group"] != WHOLE_MODEL_GROUP]
    best = diff.sort_values("size", ascending=False).groupby("group", sort=False).head(1)
    parts, statuses = [], []
    for r in best.to_dict("records"):
        d = format_interval(r["delta_j_per_token"], r.get("ci_lo"), r.get("ci_hi"),
                            r.get("ci_coverage"), fmt="+.3g")
        dist = r.get("distinguishable")
        state = ("decided (interval excludes 0)" if dist is True else
                 "undecided (interval holds 0)" if dist is False else
                 f"undecided (no interval: {r.get('reason') or 'too few repeats'})")
        seq = _sequential(rd, str(r["config_a"]), str(r["config_b"]))
        if seq is not None:  # the campaign's sequential verdict is the verdict
            dist = seq[0] == DECIDED
            state = (f"{seq[0]} by the campaign's sequential test (the fixed-sample interval "
                     "is descriptive)")
        # a map's only group "all" is the whole model, not a layer group to rank
        name = "the whole model" if r["group"] == WHOLE_MODEL_GROUP else str(r["group"])
        parts.append(f"{name}: {str(r['type_a']).split(' ')[0]}→"
                     f"{str(r['type_b']).split(' ')[0]} ({r['config_a']} vs {r['config_b']}) "
                     f"changes J/token by {d} — {state}")
        statuses.append(DECIDED if dist is True else UNDECIDED)
    top = best.iloc[0]
    if len(best) == 1 and top["group"] == WHOLE_MODEL_GROUP and len(whole) == len(best):
        lead = ("No layer group is varied on its own: the maps that differ in one group "
                "differ in the whole model (their only group), which says nothing about "
                "which layers are sensitive. ")
    else:
        lead = (f"Largest effect: the {top['group']} group. " if len(best) > 1 else
                f"Only the {top['group']} group is varied by maps that differ in one group; "
                "which group is most sensitive needs maps varying the others too. ")
    text = lead + "; ".join(parts) + "."
    if len(best) > 1:
        first, second = (_abs_range(best.iloc[i]) for i in (0, 1))
        separated = first[0] > second[1]
        text += (" The ranking of the groups is " + ("decided: their intervals of |Δ| do not "
                 "overlap." if separated else "undecided: their intervals overlap; what would "
                 "decide it: more rounds of the maps that differ in one group, narrowing those "
                 "intervals (they part only where the groups' effects differ)."))
        statuses.append(DECIDED if separated else UNDECIDED)
    return Answer("layer_groups", q, text, _combine(statuses))


def _abs_range(row: pd.Series) -> tuple[float, float]:
    """The range of |Δ| over a row's interval (the point alone when there is none)."""
    lo, hi = row.get("ci_lo"), row.get("ci_hi")
    if not (_finite(lo) and _finite(hi)):
        return 0.0, np.inf
    lo_f, hi_f = float(lo), float(hi)
    low = 0.0 if lo_f <= 0.0 <= hi_f else min(abs(lo_f), abs(hi_f))
    return low, max(abs(lo_f), abs(hi_f))


def limits(rd: ReportData) -> list[str]:
    """What this study cannot tell, in plain words."""
    out = []
    lab = rd.labels
    if lab.power_source == MODELLED:
        out.append("The power is modelled, not measured: these figures show what the "
                   "pipeline computes, not what real hardware draws.")
    out += instrument.limit_lines(rd)  # from the analysis's data, not a fixed line
    decisions = load_decisions(rd.analysis_dir)
    if decisions is not None:
        out.append(limit_line(decisions))
    h = rd.headline()
    if "accuracy_ci_lo" in h.columns:
        half = ((h["accuracy_ci_hi"] - h["accuracy_ci_lo"]) / 2).dropna()
        if len(half) and float(half.max()) > 0.05:
            out.append(f"Accuracy is known only to ±{float(half.max()):.2f} (95 % interval): "
                       "few items were scored, so accuracy differences smaller than that "
                       "cannot be told apart.")
    comps = _rows(rd.doc, "comparisons")
    if decisions is None and comps:  # with decisions, the sequential line above counts
        undecided = [r for r in comps if r.get("energy_distinguishable") is not True]
        out.append(f"{len(undecided)} of {len(comps)} paired energy comparisons are "
                   "undecided (their interval holds 0, or there is none).")
    if len(rd.per_run):
        req = rd.per_run[rd.per_run["phase"] == WindowKind.REQUEST]
        bad = int((~req["valid"].astype(bool)).sum())
        if bad:
            out.append(f"{bad} of {len(req)} runs are invalid and left out of every median, "
                       "interval and the frontier (shown below with their reasons).")
    return out


def build(rd: ReportData) -> AnswerBlock:
    """The study's five questions in its order (RQ1 same perplexity, different joules; RQ2
    the frontier; RQ3 layer groups; RQ4 size against uniform Q4_K_M; RQ5 bandwidth or
    compute), each with one status."""
    answers = [perplexity_answer(rd), frontier_answer(rd), layer_group_answer(rd),
               size_answer(rd), work_answer(rd)]
    moved = transfer_answer(rd)  # studies with two or more models only
    split = split_answer(rd)  # studies with split configurations only
    return AnswerBlock(answers + [a for a in (moved, split) if a is not None], limits(rd))
