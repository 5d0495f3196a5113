"""Transfer of a map ranking across two models, on simulated studies with a known truth.

Each model's per-round J/token is (the map's true value) × (a round factor shared by every map
of that model in the round) × lognormal noise: the truth is known by construction, so a ranking
that holds must come out "transfers", and two maps whose order differs must come out "it does
not", naming them.
"""

from __future__ import annotations

import numpy as np
import pytest

from host.analysis.transfer import (
    interaction_p,
    rows_by_round,
    sign_flip_rounds_needed,
    spearman,
    transfer,
)

MAPS = ("q8", "q6", "mix_a", "mix_b", "q4")


def _study(truth_a: dict[str, float], truth_b: dict[str, float], rounds: int, noise: float,
           seed: int) -> dict[str, dict[str, dict[int, float]]]:
    rng = np.random.default_rng(seed)
    out: dict[str, dict[str, dict[int, float]]] = {}
    for model, truth in (("dense", truth_a), ("moe", truth_b)):
        drift = rng.lognormal(0.0, 0.05, rounds)  # a round's conditions, shared by its maps
        out[model] = {m: {r: truth[m] * drift[r] * rng.lognormal(0.0, noise)
                          for r in range(rounds)} for m in truth}
    return out


DENSE = {"q8": 1.00, "q6": 0.90, "mix_a": 0.80, "mix_b": 0.72, "q4": 0.65}
SAME_ORDER = {m: 20.0 * v for m, v in DENSE.items()}  # another scale, the same ranking
SWAPPED = {**SAME_ORDER, "mix_a": 20.0 * 0.70, "mix_b": 20.0 * 0.82}  # mix_a and mix_b swap


def test_spearman_is_the_closed_form_on_ranks() -> None:
    x = np.array([1.0, 2.0, 3.0, 4.0])
    assert spearman(x, x * 10) == pytest.approx(1.0)
    assert spearman(x, -x) == pytest.approx(-1.0)
    # one adjacent swap among 4: 1 - 6·Σd²/(n(n²-1)) = 1 - 6·2/60 = 0.8
    assert spearman(x, np.array([1.0, 3.0, 2.0, 4.0])) == pytest.approx(0.8)


def test_a_ranking_that_holds_transfers_in_most_simulations() -> None:
    answers = [transfer(_study(DENSE, SAME_ORDER, 8, 0.01, seed)) for seed in range(40)]
    got = [a.answer for a in answers if a is not None]
    assert len(got) == 40
    assert got.count("the ranking transfers") >= 36  # a 5 % test: a few false alarms at most
    assert got.count("it does not") <= 4


def test_two_maps_that_swap_are_named() -> None:
    answers = [transfer(_study(DENSE, SWAPPED, 8, 0.01, seed)) for seed in range(20)]
    assert all(a is not None for a in answers)
    decided = [a for a in answers if a is not None and a.answer == "it does not"]
    assert len(decided) >= 19
    for a in decided:
        assert set(a.moved[:2]) == {"mix_a", "mix_b"}
        assert a.status == "decided"


def test_noise_larger_than_the_differences_is_undecided() -> None:
    a = transfer(_study(DENSE, SWAPPED, 3, 0.5, 3))
    assert a is not None
    assert a.answer == "undecided"
    assert a.status == "undecided"


def test_three_rounds_cannot_reject_and_the_test_says_how_many_could() -> None:
    # closed form: the smallest sign-flip p-value over n rounds is 2/2^n
    rng = np.random.default_rng(0)
    a = rng.lognormal(0, 0.01, (4, 3)) * np.array([[1.0], [2.0], [3.0], [4.0]])
    b = a[::-1].copy()  # a complete reversal: the strongest interaction there is
    assert interaction_p(a, b) == pytest.approx(2 / 2**3)
    assert sign_flip_rounds_needed(3, 0.05) == 6  # 2/2^6 = 0.031 ≤ 0.05 < 2/2^5


def test_too_few_maps_or_rounds_give_no_answer() -> None:
    two = {"dense": {"a": {0: 1.0, 1: 1.0}, "b": {0: 2.0, 1: 2.0}},
           "moe": {"a": {0: 1.0, 1: 1.0}, "b": {0: 2.0, 1: 2.0}}}
    assert transfer(two) is None
    one_round = _study(DENSE, SAME_ORDER, 1, 0.01, 0)
    assert transfer(one_round) is None


def test_rows_are_grouped_by_model_map_and_round() -> None:
    rows = [("d", "q8", 1, 1.0), ("d", "q8", 1, 3.0), ("d", "q4", 1, 5.0)]
    assert rows_by_round(rows) == {"d": {"q8": {1: 2.0}, "q4": {1: 5.0}}}
