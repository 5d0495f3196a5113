"""Each search candidate's comparison with the best hand-made map (host.search.decide), on
synthetic per-round J/token whose true difference is known.

Expected figures come from outside the code under test: the paired saving per round by plain
arithmetic, and the confidence sequence's interval from the closed form of Lai's t-mixture
(docs/analysis.md): CS_n = x̄ ± √(K·V / (n·(n − K))), K = (n + c)(1 − 1/B),
B = (√((n + c)/c)/α)^(2/n), c = 0.05, V = Σ(x − x̄)².
"""

from __future__ import annotations

import math
import random

import numpy as np
import pytest

from host.campaign.adaptive import DecisionRules
from host.search.decide import best_hand_made, best_hand_made_by, candidate_verdict
from host.search.measure import Measured

RULES = DecisionRules(("baseline",), min_rounds=3, max_rounds=8, margin_pct=2.0)


def measured(cfg: str, rounds: list[float | None], acc: float = 0.5,
             reason: str = "") -> Measured:
    ok = [v for v in rounds if v is not None]
    j = float(np.median(ok)) if ok else math.nan
    return Measured(cfg, 1, None, 1000, j, (j, j), acc, j / acc, (j / acc, j / acc),
                    "modelled (test)", reason, per_round_j=tuple(rounds))


def lai_interval(x: np.ndarray, alpha: float = 0.05, c: float = 0.05) -> tuple[float, float]:
    n = len(x)
    v = float(np.sum((x - x.mean()) ** 2))
    b = (math.sqrt((n + c) / c) / alpha) ** (2.0 / n)
    k = (n + c) * (1.0 - 1.0 / b)
    if k >= n:
        return -math.inf, math.inf
    half = math.sqrt(k * v / (n * (n - k)))
    return x.mean() - half, x.mean() + half


def noisy_pair(saving_pct: float, sd_pct: float, n: int, seed: int
               ) -> tuple[list[float | None], list[float | None]]:
    """Hand-made J/token per round around 1.0 (a slow drift shared by both maps, as a machine
    warming up), the candidate (1 − saving)·hand·(1 + noise)."""
    rng = random.Random(seed)
    hand, cand = [], []
    for r in range(n):
        level = 1.0 + 0.02 * r
        hand.append(level)
        cand.append(level * (1 - saving_pct / 100) * (1 + rng.gauss(0, sd_pct / 100)))
    return list(hand), list(cand)


def test_a_clear_saving_is_decided_with_the_closed_form_interval() -> None:
    hand, cand = noisy_pair(10.0, 1.0, 5, seed=1)
    v = candidate_verdict(measured("hand", hand), measured("cand", cand), RULES, 5)
    x = np.array([(a - b) / a * 100 for a, b in zip(hand, cand, strict=True)])  # type: ignore
    lo, hi = lai_interval(x)
    assert v["state"] == "decided" and v["direction"] == "less energy"
    assert v["saving_pct"] == pytest.approx(x.mean(), rel=1e-12)
    assert v["interval_pct"] == pytest.approx([lo, hi], rel=1e-9)
    assert lo > 0 and lo < 10.0 < hi  # the known true saving lies inside
    assert v["paired_rounds"] == 5 and v["coverage"] == pytest.approx(0.95)
    assert v["against"] == "hand" and "Lai" in v["method"]
    assert "decided: cand uses less energy than hand" in v["text"]
    assert "95 % anytime-valid, n=5" in v["text"] and "accuracy 0.5 vs 0.5" in v["text"]


def test_verdict_keys_keep_their_file_order() -> None:
    """search.json and summary.json are rewritten byte for byte: the keys' order is part of
    the format (a decided verdict carries within_margin, just before the closing text)."""
    head = ["config", "against", "state", "measure", "saving_pct", "interval_pct", "coverage",
            "paired_rounds", "rounds_done", "margin_pct", "method", "rounds_needed", "reason",
            "direction", "per_round_saving_pct"]
    hand, cand = noisy_pair(10.0, 1.0, 5, seed=1)
    decided = candidate_verdict(measured("hand", hand), measured("cand", cand), RULES, 5)
    assert list(decided) == [*head, "within_margin", "text"]
    undecided = candidate_verdict(measured("hand", hand[:2]), measured("cand", cand[:2]),
                                  RULES, 2)
    assert undecided["state"] == "undecided" and list(undecided) == [*head, "text"]


def test_a_dearer_candidate_is_decided_the_other_way() -> None:
    hand, cand = noisy_pair(-8.0, 1.0, 4, seed=2)
    v = candidate_verdict(measured("hand", hand), measured("cand", cand), RULES, 4)
    assert v["state"] == "decided" and v["direction"] == "more energy"
    assert v["interval_pct"][1] < 0


def test_no_true_difference_and_little_noise_is_equivalent_within_the_margin() -> None:
    hand, cand = noisy_pair(0.0, 0.1, 6, seed=3)
    v = candidate_verdict(measured("hand", hand), measured("cand", cand), RULES, 6)
    x = np.array([(a - b) / a * 100 for a, b in zip(hand, cand, strict=True)])  # type: ignore
    lo, hi = lai_interval(x)
    assert lo > -2.0 and hi < 2.0  # the closed form lies inside ± the 2 % margin
    assert v["state"] == "equivalent" and v["direction"] is None
    assert v["text"].startswith("savings vs baseline hand → cand: equivalent")


def test_a_small_difference_in_large_noise_is_undecided_after_its_budget() -> None:
    hand, cand = noisy_pair(1.0, 4.0, 4, seed=4)
    rules = DecisionRules(("baseline",), 3, 4, margin_pct=0.0)
    v = candidate_verdict(measured("hand", hand), measured("cand", cand), rules, 4)
    x = np.array([(a - b) / a * 100 for a, b in zip(hand, cand, strict=True)])  # type: ignore
    lo, hi = lai_interval(x)
    assert lo < 0 < hi  # the closed form straddles 0: nothing decided
    assert v["state"] == "undecided"
    assert "budget (4 rounds)" in v["reason"] and "undecided after the budget" in v["text"]
    # the rounds it would need: the smallest n with w(n) + z_0.8·s/√n ≤ |x̄| at the measured
    # spread s, w(n) = g(n)·√(n − 1)·s the closed-form half-width
    s, d = float(np.std(x, ddof=1)), abs(float(x.mean()))
    z = 0.8416212335729143
    n = 2
    while True:
        b = (math.sqrt((n + 0.05) / 0.05) / 0.05) ** (2.0 / n)
        k = (n + 0.05) * (1 - 1 / b)
        if k < n and math.sqrt(k / (n * (n - k))) * math.sqrt(n - 1) * s + z * s / math.sqrt(
                n) <= d:
            break
        n += 1
    assert v["rounds_needed"] == max(n, 5)
    assert f"about {v['rounds_needed']} rounds would resolve it" in v["text"]


def test_no_valid_paired_round_is_undecided_with_its_reason() -> None:
    hand = [1.0, 1.0, 1.0]
    cand = measured("cand", [None, None, None], reason="repeat CV 9.1 % > 3 %")
    v = candidate_verdict(measured("hand", hand), cand, RULES, 3)
    assert v["state"] == "undecided" and v["paired_rounds"] == 0
    assert v["reason"].startswith("no valid paired round")
    assert "cand: repeat CV 9.1 % > 3 %" in v["reason"]
    assert v["saving_pct"] is None and v["interval_pct"] == [None, None]


def test_rounds_pair_by_index_and_too_few_pairs_say_so() -> None:
    # the hand-made map is invalid in round 2, the candidate in round 3: one pair left of 3
    hand = measured("hand", [1.0, None, 1.0])
    cand = measured("cand", [0.9, 0.9, None])
    v = candidate_verdict(hand, cand, RULES, 3)
    assert v["paired_rounds"] == 1 and v["per_round_saving_pct"] == pytest.approx([10.0])
    assert v["state"] == "undecided" and v["reason"].startswith("only 1 valid paired round")
    assert "no finite interval before 3" in v["text"]


def test_wrong_directions_are_no_more_frequent_than_alpha() -> None:
    """Over 400 simulated candidates with a true saving of 1 % in 3 % per-round noise, a
    candidate decided to draw *more* energy is a wrong verdict: at most α = 5 % (the
    confidence sequence must miss the truth for it), with room for the simulation's own
    spread (binomial sd at 5 % of 400 is 1.1 %)."""
    wrong = 0
    decided = 0
    for seed in range(400):
        hand, cand = noisy_pair(1.0, 3.0, 8, seed=1000 + seed)
        v = candidate_verdict(measured("hand", hand), measured("cand", cand), RULES, 8)
        decided += v["state"] == "decided"
        wrong += v["direction"] == "more energy"
    assert wrong / 400 <= 0.05
    assert decided > 0  # the test exercises decisions, not only undecided ones


def test_the_best_hand_made_map_is_the_lowest_measured_epi() -> None:
    a = measured("a", [1.0, 1.0], acc=0.5)  # EPI 2.0
    b = measured("b", [1.2, 1.2], acc=0.8)  # EPI 1.5
    c = measured("c", [None, None], acc=0.9)  # no valid figures
    assert best_hand_made({"a": a, "b": b, "c": c}, ["a", "b", "c"]) == "b"
    assert best_hand_made({"c": c}, ["c", "a"]) == "c"


def test_a_fallback_best_hand_made_map_says_it_is_one() -> None:
    a = measured("a", [1.0, 1.0], acc=0.5)
    nothing = measured("n", [None, None], acc=0.9)
    assert best_hand_made_by({"a": a, "n": nothing}, ["n", "a"]) == ("a", "the lowest measured EPI")
    cfg, why = best_hand_made_by({"n": nothing}, ["n", "a"])
    assert cfg == "n" and why.startswith("no hand-made map has a valid measurement yet")
