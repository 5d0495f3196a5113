"""The report's split configurations: each split's per-phase J/token beside its parents', and
the study-level answer "does any split beat both of its parent maps?".

Figures: results.csv (median J per generated token per phase with its interval, the report's
basis); differences: analysis/splits.json (host/analysis/split_compare.py: the split minus
each parent, paired by campaign round). The answer is on J/token; a split's accuracy is scored
across the handover (docs/accuracy.md, "Split configurations"), and a split without it (no
accuracy file, or no entry for both its models) is named, its EPI null.
"""

from __future__ import annotations

from host.analysis import split_compare
from host.analysis.headline import headline_rows
from host.analysis.vocabulary import Phase
from host.report.answer_model import DECIDED, UNDECIDED, Answer
from host.report.data import ReportData
from host.report.tables import Table, _tail, with_ci

QUESTION = "Does any split configuration (prefill on one map, decode on another) beat both " \
    "of its parent maps?"


def _figure(rd: ReportData, config: str, phase: str) -> str:
    rows = headline_rows(rd.results, rd.basis, phase=phase,
                         unit=split_compare.phase_unit(phase))
    row = rows[rows["config"] == config]
    if row.empty:
        return "null (not measured)"
    r = row.iloc[0]
    return with_ci(r["j_per_token_median"], r["j_per_token_ci_lo"], r["j_per_token_ci_hi"],
                   coverage=r["ci_coverage"], n=r["n_repeats"])


def _unscored(rd: ReportData, splits: list[split_compare.SplitParents]) -> list[str]:
    """The splits whose accuracy results.csv lacks (their EPI is null)."""
    r = rd.results
    out = []
    for s in splits:
        acc = r[r["config"] == s.config]["accuracy"] if "accuracy" in r.columns else None
        if acc is None or not acc.notna().any():
            out.append(s.config)
    return out


def _accuracy_sentence(rd: ReportData, splits: list[split_compare.SplitParents]) -> str:
    missing = _unscored(rd, splits)
    if not missing:
        return ("A split's accuracy is scored across the handover (the context on the "
                "prefill map, the continuation on the decode map): its EPI is in the EPI table.")
    return (f"No accuracy for {', '.join(missing)} (no accuracy file entry for both its "
            "models), so its EPI is null.")


def _delta(d: split_compare.PhaseDifference) -> str:
    text = with_ci(d.delta_j_per_token, d.ci_lo, d.ci_hi, coverage=d.ci_coverage,
                   n=d.n_pairs)
    return text + ("" if d.decided else " (holds 0)")


def split_table(rd: ReportData) -> Table | None:
    """None when the study has no split configuration."""
    splits, diffs = split_compare.read(rd.analysis_dir)
    if not splits:
        return None
    rows = []
    for s in splits:
        for phase in split_compare.PHASES:
            by_role = {d.role: d for d in diffs if d.split == s.config and d.phase == phase}
            rows.append([s.config, str(phase), _figure(rd, s.config, phase),
                         f"{s.prefill}: {_figure(rd, s.prefill, phase)}",
                         f"{s.decode}: {_figure(rd, s.decode, phase)}",
                         _delta(by_role["prefill"]) if "prefill" in by_role else "null",
                         _delta(by_role["decode"]) if "decode" in by_role else "null"])
    caption = ("Each split configuration's J per token per phase (prefill: per prompt token; "
               "decode and the whole request: per generated token) beside its parents' "
               "(median [interval] coverage n), and the split minus each parent (mean "
               "difference of J/token paired by campaign round [interval] coverage n pairs). "
               "The handover is inside the split's decode window: its cost is counted. "
               + _accuracy_sentence(rd, splits) + _tail(rd))
    return Table("splits", "Split configurations beside their parents", caption,
                 ["split", "phase", "split J/token", "prefill parent", "decode parent",
                  "Δ vs prefill parent", "Δ vs decode parent"], rows)


def split_answer(rd: ReportData) -> Answer | None:
    """The study-level question, or None without a split configuration."""
    splits, diffs = split_compare.read(rd.analysis_dir)
    if not splits:
        return None
    parts, verdicts = [], []
    for s in splits:
        v = split_compare.verdict(diffs, s.config)
        verdicts.append(v)
        req = {d.role: d for d in diffs if d.split == s.config and d.phase == Phase.REQUEST}
        said = "; ".join(f"vs {d.parent} ({role} parent) Δ J/token {_delta(d)}"
                         for role, d in sorted(req.items()))
        parts.append(f"{s.config} (prefill {s.prefill}, decode {s.decode}): {v} on whole-"
                     f"request J/token ({said})")
    if "beats both" in verdicts:
        status, head = DECIDED, "Yes."
    elif all(v == "does not beat both" for v in verdicts):
        status, head = DECIDED, "No."
    else:
        status, head = UNDECIDED, "Undecided."
    text = f"{head} " + ". ".join(parts) + "."
    if status == UNDECIDED:
        text += (" What would decide it: more paired rounds of the splits and their parents "
                 "(`[decide] compare = [\"all_pairs\"]`, or a larger time budget).")
    missing = _unscored(rd, splits)
    text += (" On J/token; the splits' accuracy and EPI are in the EPI table." if not missing
             else f" On J/token only: {', '.join(missing)} has no accuracy, so EPI cannot "
             "rank it.")
    return Answer("split", QUESTION, text, status)
