"""Each search candidate's settled comparison with the best hand-made map.

Every search round after round 0 is a campaign with a `[decide]` table (docs/campaign.md)
whose baseline is the best hand-made map measured so far: the campaign measures the candidates
and that map in interleaved, seeded rounds, and keeps adding rounds for the candidates whose
comparison is still undecided until each is decided or the round budget is spent. This module
states the outcome per candidate from the same per-round values, with the campaign's own
functions (host.campaign.adaptive: paired savings per round, Lai's anytime-valid confidence
sequence of host.analysis.sequential) — no second statistical method:

- *decided*: the candidate uses less (or more) energy than the best hand-made map, with the
  interval of the paired saving (% of the hand-made map's J/token), its coverage and rounds;
- *equivalent*: the interval lies inside ± the smallest difference worth resolving;
- *undecided*: after the budget, with the rounds it would need at the noise measured, or the
  stated reason it cannot say (no valid paired round; fewer than the 3 a finite interval needs).

The comparison is of J per generated token: that is what more rounds resolve. Accuracy is
scored once per map (a fixed item set), so more rounds do not change it; it is stated beside
the verdict, never folded into the interval.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TypedDict

from host.analysis.sequential import State
from host.campaign import adaptive as ad
from host.campaign.adaptive import Comparison, DecisionRules
from host.search.measure import Measured

FIRST_FINITE_ROUND = 3  # Lai's sequence (DEFAULT_C) has no finite interval before round 3


class _VerdictFigures(TypedDict):
    """A candidate verdict's figures, in the order search.json and summary.json hold them."""

    config: str
    against: str
    state: State
    measure: str
    saving_pct: float | None
    interval_pct: list[float | None]
    coverage: float
    paired_rounds: int
    rounds_done: int
    margin_pct: float
    method: str
    rounds_needed: int | None
    reason: str
    direction: str | None
    per_round_saving_pct: list[float]


class _VerdictText(_VerdictFigures):
    text: str


class CandidateVerdict(_VerdictText, total=False):
    """A candidate's settled comparison (search.json `verdicts`, summary.json `comparisons`);
    built with `within_margin` before `text`, the order the files hold them in."""

    within_margin: bool  # decided ones only


def per_round_values(m: Measured) -> dict[int, float | None]:
    """Round (1-based) → the mean J/token of that round's valid run, None where invalid."""
    return {k + 1: v for k, v in enumerate(m.per_round_j)}


def candidate_verdict(best_hand: Measured, cand: Measured, rules: DecisionRules,
                      rounds_done: int) -> CandidateVerdict:
    """The settled comparison of `cand` with `best_hand`, measured in the same campaign.

    `rounds_done`: the rounds that campaign ran (the decision rounds included). The campaign
    has finished, so a comparison still undecided is undecided *after its budget*.
    """
    values = {best_hand.config: per_round_values(best_hand),
              cand.config: per_round_values(cand)}
    comp = Comparison("baseline", best_hand.config, cand.config)
    saving = ad.paired_savings_pct(values, best_hand.config, cand.config)
    found = ad.assess(rules, [comp], values, rounds_done, out_of_time=True)[0]
    v = found.verdict
    decided, undecided = v.state == State.DECIDED, v.state == State.UNDECIDED
    reason = _undecided_reason(v.n, best_hand, cand, rules) if undecided else ""
    figures = _VerdictFigures(
        config=cand.config, against=best_hand.config, state=v.state,
        measure="J per generated token, paired saving per round (% of the hand-made map's)",
        saving_pct=_finite(v.mean), interval_pct=[_finite(v.lo), _finite(v.hi)],
        coverage=1.0 - v.alpha, paired_rounds=v.n, rounds_done=rounds_done,
        margin_pct=v.margin, method=v.method,
        rounds_needed=v.rounds_needed if undecided else None, reason=reason,
        direction=("less energy" if v.direction > 0 else "more energy") if decided else None,
        per_round_saving_pct=[float(x) for x in saving],
    )
    text = _text(found, figures, cand, best_hand)
    if decided:
        return CandidateVerdict(**figures, within_margin=v.within_margin, text=text)
    return CandidateVerdict(**figures, text=text)


def _finite(x: float) -> float | None:
    return float(x) if math.isfinite(x) else None


def _undecided_reason(n: int, best: Measured, cand: Measured, rules: DecisionRules) -> str:
    """Why an undecided comparison stayed undecided, in words."""
    if n == 0:
        why = [f"{m.config}: {m.reason or 'no valid run'}" for m in (cand, best)
               if not any(v is not None for v in m.per_round_j)]
        return ("no valid paired round (a round counts only when both maps' runs in it are "
                "valid" + ("; " + "; ".join(why) if why else "") + ")")
    if n < FIRST_FINITE_ROUND:
        return (f"only {n} valid paired round(s): the confidence sequence has no finite "
                f"interval before {FIRST_FINITE_ROUND}")
    return f"the budget ({rules.max_rounds} rounds) was spent before the interval settled"


def _text(found: ad.Assessment, doc: _VerdictFigures, cand: Measured,
          best: Measured) -> str:
    """One line: the campaign's own comparison text, the reason, and the accuracies."""
    line = found.text()
    if doc["state"] == State.UNDECIDED and doc["paired_rounds"] < FIRST_FINITE_ROUND:
        line += f"; why: {doc['reason']}"
    acc = (f"; accuracy {cand.accuracy:.3g} vs {best.accuracy:.3g} (scored once, not "
           "resolved by rounds)" if math.isfinite(cand.accuracy) and
           math.isfinite(best.accuracy) else "")
    return line + acc


def verdict_counts(verdicts: Sequence[CandidateVerdict]) -> dict[str, int]:
    """decided / equivalent / undecided → how many candidates."""
    out: dict[str, int] = {}
    for v in verdicts:
        out[v["state"]] = out.get(v["state"], 0) + 1
    return out


def best_hand_made(latest: Mapping[str, Measured], hand_made: Sequence[str]) -> str:
    """The hand-made map the candidates are compared with: the lowest measured EPI; without
    one, the lowest measured J/token; without that, the first hand-made map."""
    return best_hand_made_by(latest, hand_made)[0]


def best_hand_made_by(latest: Mapping[str, Measured], hand_made: Sequence[str]
                      ) -> tuple[str, str]:
    """best_hand_made and the rule that chose it, in words for the search's log: a fallback
    (no valid EPI, or nothing measured validly at all) must not read like a measured best."""
    usable = [latest[c] for c in hand_made if c in latest]
    by_epi = [m for m in usable if m.usable and math.isfinite(m.epi)]
    if by_epi:
        return min(by_epi, key=lambda m: m.epi).config, "the lowest measured EPI"
    by_j = [m for m in usable if math.isfinite(m.j_per_token)]
    if by_j:
        return (min(by_j, key=lambda m: m.j_per_token).config,
                "no hand-made map has a valid EPI: the lowest measured J/token")
    return hand_made[0], ("no hand-made map has a valid measurement yet: the first one given "
                          "(its comparisons rest on the rounds measured from now on)")
