"""One adaptive decision: from an analysis of the rounds so far to the next round's configurations.

`decide_after_round` reads an analysis directory (results.csv, repeats.csv, runs.csv;
formats.md §5), names the comparisons the study's [decide] table asks for (frontier
neighbours from the accuracy and J/token it finds, savings against the baseline,
perplexity-matched pairs, all pairs), gives each its sequential verdict over the paired
per-round savings (`host.campaign.adaptive`), and says which configurations the next round
measures — none once every comparison is settled or the budget is spent. It writes the
result to `decisions.json` beside the analysis and reads it back on a second call, so a
resumed campaign repeats the decision it took (a time budget is not reproducible) instead of
taking a new one.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from epi.core.files import write_json_atomic
from host.analysis.headline import headline_rows
from host.analysis.vocabulary import EnergyBasis
from host.campaign import adaptive as ad

DECISIONS_JSON = "decisions.json"


ASSESS = "assess"


def assess_dir(root: Path, round_k: int) -> Path:
    return root / ASSESS / f"round-{round_k}"


def decided_rounds(root: Path, min_rounds: int) -> list[tuple[int, tuple[str, ...]]]:
    """(round, its configurations) for every round a recorded decision added, in order:
    the decision after round K (`assess/round-K/decisions.json` under the campaign directory
    `root`) names round K + 1's configurations."""
    out: list[tuple[int, tuple[str, ...]]] = []
    k = min_rounds
    while True:
        try:
            doc = json.loads((assess_dir(root, k) / DECISIONS_JSON).read_text())
            nxt = tuple(str(c) for c in doc["next_configs"])
        except (OSError, ValueError, KeyError, TypeError):
            return out
        if not nxt:
            return out
        k += 1
        out.append((k, nxt))


def finished(root: Path, min_rounds: int) -> bool:
    """Whether the recorded decisions already ended the adaptive rounds."""
    rounds = decided_rounds(root, min_rounds)
    last = rounds[-1][0] if rounds else min_rounds
    try:
        doc = json.loads((assess_dir(root, last) / DECISIONS_JSON).read_text())
        return not doc["next_configs"]
    except (OSError, ValueError, KeyError, TypeError):
        return False


@dataclass(frozen=True)
class RoundDecision:
    """After `rounds_done` rounds: every comparison's verdict and the next round's configs."""

    rounds_done: int
    lines: tuple[str, ...]  # one per comparison (decided / equivalent / undecided …), notes
    next_configs: tuple[str, ...]  # empty: the campaign stops adding rounds
    states: dict[str, int]  # "decided"/"equivalent"/"undecided" → count
    budget_spent: bool
    # open comparisons that max_rounds cannot settle at the spread so far, as "A → B (about
    # N rounds)": no round is added for them alone (host.campaign.adaptive.out_of_reach)
    out_of_reach: tuple[str, ...] = ()


def _headline(results: pd.DataFrame, basis: str) -> pd.DataFrame:
    h = headline_rows(results, basis)
    return h.drop_duplicates("config").set_index("config")


def _column(h: pd.DataFrame, col: str) -> dict[str, float]:
    if col not in h.columns:
        return {}
    v = pd.to_numeric(h[col], errors="coerce")
    return {str(c): float(x) for c, x in v.items() if math.isfinite(x)}


def decide_after_round(analysis_dir: Path, rules: ad.DecisionRules, configs: Sequence[str],
                       round_of_run: Mapping[str, int], rounds_done: int, *,
                       baseline: str | None, basis: str = EnergyBasis.GROSS,
                       ppl_tolerance: float = 0.01, measured_s: float = 0.0,
                       per_run_s: float | None = None) -> RoundDecision:
    """The decision after `rounds_done` rounds (see the module docstring).

    Time budget: with `rules.time_budget_s`, the next round is only scheduled when its runs,
    at `per_run_s` each, still fit after the `measured_s` already spent measuring; otherwise
    the budget counts as spent.
    """
    saved = analysis_dir / DECISIONS_JSON
    if saved.is_file():
        try:
            d = json.loads(saved.read_text())
            notes = d.get("notes", [])
            return RoundDecision(int(d["rounds_done"]), tuple(d["lines"]) + tuple(notes),
                                 tuple(d["next_configs"]), dict(d["states"]),
                                 bool(d["budget_spent"]),
                                 tuple(str(x) for x in d.get("out_of_reach", [])))
        except (OSError, ValueError, KeyError, TypeError):
            pass  # unreadable: decide again
    results = pd.read_csv(analysis_dir / "results.csv")
    h = _headline(results, basis)
    comps, notes = ad.comparisons(rules, list(configs), baseline=baseline,
                                  accuracy=_column(h, "accuracy"),
                                  j_per_token=_column(h, "j_per_token_median"),
                                  ppl=_column(h, "perplexity"), ppl_tolerance=ppl_tolerance)
    values = ad.round_values(pd.read_csv(analysis_dir / "repeats.csv"),
                             pd.read_csv(analysis_dir / "runs.csv"), round_of_run, basis=basis)
    spent = rounds_done >= rules.max_rounds
    found = ad.assess(rules, comps, values, rounds_done, out_of_time=spent)
    n_next = len(ad.configs_to_measure(found, rules.max_rounds))
    if (not spent and n_next and rules.time_budget_s is not None and per_run_s is not None
            and measured_s + per_run_s * n_next > rules.time_budget_s):
        spent = True  # the next round would not fit: the budget is spent now
        found = ad.assess(rules, comps, values, rounds_done, out_of_time=True)
    states: dict[str, int] = {}
    for s in found:
        states[s.verdict.state] = states.get(s.verdict.state, 0) + 1
    nxt = () if spent else tuple(ad.configs_to_measure(found, rules.max_rounds))
    beyond = ad.out_of_reach(found, rules.max_rounds)
    n_open = sum(1 for s in found if not s.verdict.settled)
    # all open ones beyond reach: every one is measured as before, none is set aside
    far = () if spent or len(beyond) == n_open else tuple(
        f"{s.comparison.reference} → {s.comparison.candidate} ("
        + (f"about {s.verdict.rounds_needed} rounds" if s.verdict.rounds_needed
           else "no round count") + ")"
        for s in beyond)
    decision = RoundDecision(rounds_done, tuple([s.text() for s in found] + notes), nxt,
                             states, spent, far)
    # "lines": one verdict per comparison (the report checks them against "states");
    # "notes": what could not be compared (e.g. "frontier neighbours: no pair to compare")
    write_json_atomic(saved, {"rounds_done": rounds_done,
                              "lines": [s.text() for s in found], "notes": list(notes),
                              # the same verdicts as records: the report's one verdict per
                              # comparison, wherever a comparison of these two appears
                              "comparisons": [{"kind": s.comparison.kind,
                                               "a": s.comparison.reference,
                                               "b": s.comparison.candidate,
                                               "state": s.verdict.state,
                                               "rounds_needed": s.verdict.rounds_needed,
                                               "text": s.text()}
                                              for s in found],
                              "next_configs": list(decision.next_configs),
                              "out_of_reach": list(far),
                              "states": states, "budget_spent": spent,
                              "method": ad.sequential.METHOD,
                              "margin_pct": rules.margin_pct, "alpha": rules.alpha})
    return decision
