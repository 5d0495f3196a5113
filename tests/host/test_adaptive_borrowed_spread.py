"""An undecided comparison with one valid paired round gets a round count from the study's
pooled spread, so that it is "undecided with the rounds it would need".

One valid paired round has no spread of its own (the demo under one busy core ended with three
such comparisons saying "the noise measured gives no round count"). The rounds it would need
then come from the per-round spread pooled over the comparisons that have ≥ 2 rounds, and its
line says whose spread that is. The expected figures: the pooled spread by hand (the sum of
squared deviations over the summed degrees of freedom), the round count from
`sequential.rounds_for` at that spread (its closed form is tested in test_sequential).
"""

from __future__ import annotations

import math

import numpy as np

from host.analysis import sequential
from host.campaign.adaptive import Comparison, DecisionRules, assess

# J/token per round; "b" has a valid run in round 1 only (its other rounds were invalid)
VALUES = {"base": {1: 1.00, 2: 1.02, 3: 0.99},
          "a": {1: 0.90, 2: 0.93, 3: 0.88},
          "b": {1: 0.95, 2: None, 3: None}}


def test_one_paired_round_borrows_the_pooled_spread_for_its_round_count() -> None:
    rules = DecisionRules(max_rounds=3)
    comps = [Comparison("baseline", "base", "a"), Comparison("baseline", "base", "b")]
    found = {s.comparison.candidate: s.verdict for s in assess(rules, comps, VALUES, 3)}
    own = np.array([(VALUES["base"][r] - VALUES["a"][r]) / VALUES["base"][r] * 100
                    for r in (1, 2, 3)])
    pooled = math.sqrt(float(np.sum((own - own.mean()) ** 2)) / (len(own) - 1))
    vb = found["b"]
    assert vb.state == "undecided" and vb.n == 1 and vb.budget_spent
    saving_b = (1.00 - 0.95) / 1.00 * 100
    assert vb.mean == saving_b and not math.isfinite(vb.lo)  # its interval stays its own
    want = sequential.rounds_for(pooled, saving_b, alpha=vb.alpha)
    assert want is not None and vb.rounds_needed == max(want, 2)
    line = next(s.text() for s in assess(rules, comps, VALUES, 3) if s.comparison.candidate == "b")
    assert f"about {vb.rounds_needed} rounds would resolve it at the study's pooled" in line
    assert f"({pooled:.3g} %)" in line
    # the comparison with its own spread keeps its own count (not the borrowed basis)
    assert found["a"].need_basis == "the noise measured"


def test_nothing_to_borrow_keeps_saying_so() -> None:
    rules = DecisionRules(max_rounds=3)
    only = {"base": {1: 1.0}, "b": {1: 0.95}}
    (s,) = assess(rules, [Comparison("baseline", "base", "b")], only, 3)
    assert s.verdict.rounds_needed is None
    assert "the noise measured gives no round count" in s.text()


def test_no_valid_paired_round_gets_the_rounds_for_the_margin_at_the_pooled_spread() -> None:
    """The idle demo of 2026-11-27 ended with demo_q4_0 never valid: its comparison had no
    paired round, so no difference to aim at and no round count. It now says how many valid
    paired rounds resolve any true difference of the margin worth resolving or more, at the
    pooled spread (expected: `rounds_for` at the margin and the hand-pooled spread)."""
    rules = DecisionRules(max_rounds=3, margin_pct=2.0)
    never = {**VALUES, "c": {1: None, 2: None, 3: None}}
    comps = [Comparison("baseline", "base", "a"), Comparison("baseline", "base", "c")]
    (_, sc) = assess(rules, comps, never, 3)
    own = np.array([(VALUES["base"][r] - VALUES["a"][r]) / VALUES["base"][r] * 100
                    for r in (1, 2, 3)])
    pooled = math.sqrt(float(np.sum((own - own.mean()) ** 2)) / (len(own) - 1))
    vc = sc.verdict
    assert vc.n == 0 and vc.state == "undecided" and vc.budget_spent
    want = sequential.rounds_for(pooled, 2.0, alpha=vc.alpha)
    assert want is not None and vc.rounds_needed == want
    line = sc.text()
    assert "no valid paired round yet" in line and "gives no round count" not in line
    assert f"about {want} rounds would resolve it at the study's pooled" in line
    assert "if its runs are valid, for a true difference of 2 % or more" in line
    # without a margin there is no difference to aim at: still no count, said so
    (_, s0) = assess(DecisionRules(max_rounds=3, margin_pct=0.0), comps, never, 3)
    assert s0.verdict.rounds_needed is None and "gives no round count" in s0.text()
