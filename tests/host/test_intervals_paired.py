"""Honest intervals and paired comparisons (host.analysis.intervals, host.analysis.paired).

Expected figures come from outside the code under test: binomial coverage in closed form,
Student-t quantiles from printed tables, McNemar p-values by hand, and coverage checked by
simulation against the truth the simulation drew from.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from host.analysis import paired
from host.analysis import statistics as stats
from host.analysis.intervals import (
    median_interval,
    order_stat_coverage,
    student_t_ppf,
    t_interval,
)


@pytest.mark.parametrize("n,coverage", [(3, 0.75), (4, 0.875), (5, 0.9375)])
def test_min_max_of_few_repeats_is_labelled_with_its_real_coverage(n, coverage):
    """[min, max] of n repeats covers the median with 1 − 2·0.5ⁿ, and never claims 95 %."""
    assert order_stat_coverage(n, 1) == pytest.approx(1 - 2 * 0.5 ** n)
    s = stats.repeat_stats(np.linspace(1.0, 2.0, n))
    assert (s.ci_lo, s.ci_hi) == (1.0, 2.0)
    assert s.ci_coverage == pytest.approx(coverage)
    assert s.ci_level_met is False and f"n={n}" in s.ci_note


@pytest.mark.parametrize("n", [6, 7, 8, 9, 10])
def test_from_six_repeats_the_interval_reaches_95_percent(n):
    iv = median_interval(np.arange(n, dtype=float))
    # closed form: 1 − 2·Σ_{i<k} C(n, i)/2ⁿ for the chosen k
    k = int(iv.lo) + 1
    expect = 1 - 2 * sum(math.comb(n, i) for i in range(k)) / 2 ** n
    assert iv.coverage == pytest.approx(expect) and iv.coverage >= 0.95 and iv.level_met
    assert iv.lo == n - 1 - iv.hi  # symmetric order statistics


@pytest.mark.parametrize("n", [3, 5, 6, 9])
def test_order_statistic_coverage_holds_in_simulation(n):
    """Skewed repeats (log-normal): the claimed coverage is what simulation finds."""
    rng = np.random.default_rng(n)
    true_median = 1.0  # median of exp(N(0, σ²))
    hits, trials = 0, 4000
    claimed = median_interval(np.arange(n, dtype=float)).coverage
    for _ in range(trials):
        iv = median_interval(np.exp(rng.normal(0.0, 0.5, n)))
        hits += iv.lo <= true_median <= iv.hi
    se = math.sqrt(claimed * (1 - claimed) / trials)
    assert abs(hits / trials - claimed) < 4 * se + 1e-9


def test_student_t_quantiles_match_the_tables():
    table = {1: 12.7062, 2: 4.3027, 3: 3.1824, 4: 2.7764, 5: 2.5706, 9: 2.2622, 30: 2.0423}
    for df, t in table.items():
        assert student_t_ppf(0.975, df) == pytest.approx(t, abs=1e-4)
    assert student_t_ppf(0.025, 4) == pytest.approx(-2.7764, abs=1e-4)


def test_t_interval_covers_95_percent_at_three_repeats():
    rng = np.random.default_rng(7)
    hits, trials = 0, 4000
    for _ in range(trials):
        iv = t_interval(rng.normal(5.0, 0.3, 3))
        hits += iv.lo <= 5.0 <= iv.hi
    assert abs(hits / trials - 0.95) < 4 * math.sqrt(0.95 * 0.05 / trials)


@given(st.lists(st.floats(0.01, 100.0, allow_nan=False), min_size=2, max_size=12))
@settings(max_examples=200, deadline=None)
def test_median_interval_brackets_the_median_and_never_overclaims(values):
    iv = median_interval(np.array(values))
    v, n = np.sort(values), len(values)
    ks = [k for k in range(1, n // 2 + 1)
          if 1 - 2 * sum(math.comb(n, i) for i in range(k)) / 2 ** n >= 0.95]
    k = max(ks) if ks else 1
    assert (iv.lo, iv.hi) == (v[k - 1], v[n - k])
    assert iv.lo <= float(np.median(values)) <= iv.hi
    assert iv.level_met == bool(ks) and iv.level_met == (iv.coverage >= 0.95)


# --------------------------------------------------------------------------- paired energy
def test_paired_rounds_resolve_what_independent_intervals_hide():
    """A shared round effect (the room warms up) dwarfs a steady 2 % saving."""
    rounds = np.array([1.00, 1.10, 0.95, 1.05, 1.20])
    a = 0.30 * rounds
    b = 0.294 * rounds * np.array([1.001, 0.999, 1.0, 1.002, 0.998])
    t = np.arange(5) * 100.0
    sa, sb = stats.repeat_stats(a), stats.repeat_stats(b)
    assert sa.ci_lo < sb.ci_hi and sb.ci_lo < sa.ci_hi  # the separate intervals overlap
    d = paired.energy_difference(a, t, b, t + 10)
    assert d["method"] == paired.PAIRED_ROUNDS and d["n_pairs"] == 5
    assert d["distinguishable"] is True and d["delta_ci_hi"] < 0
    assert d["saving_pct_ci_lo"] > 1.5 and d["saving_pct_ci_hi"] < 2.5


def test_repeats_inside_a_round_are_averaged_and_t_has_rounds_minus_one_df():
    """2 rounds × 3 repeats: only the rounds are independent, so n = 2 pairs and df = 1.

    By hand: round means A = (0.30, 0.33), B = (0.29, 0.31); d = (−0.01, −0.02), mean
    −0.015, s = 0.00707107, half-width t(0.975, 1) · s/√2 = 12.7062047 · 0.005 = 0.0635310.
    """
    a = np.array([0.29, 0.30, 0.31, 0.32, 0.33, 0.34])
    b = np.array([0.28, 0.29, 0.30, 0.30, 0.31, 0.32])
    t_a = np.array([0.0, 1, 2, 100, 101, 102])
    t_b = t_a + 10
    runs_a = np.array(["a1", "a1", "a1", "a2", "a2", "a2"], dtype=object)
    runs_b = np.array(["b1", "b1", "b1", "b2", "b2", "b2"], dtype=object)
    d = paired.energy_difference(a, t_a, b, t_b, block_a=runs_a, block_b=runs_b)
    assert d["method"] == paired.PAIRED_ROUNDS and d["n_pairs"] == 2
    assert d["delta"] == pytest.approx(-0.015)
    half = 12.7062047 * 0.005
    assert d["delta_ci_lo"] == pytest.approx(-0.015 - half, rel=1e-6)
    assert d["delta_ci_hi"] == pytest.approx(-0.015 + half, rel=1e-6)
    assert d["distinguishable"] is False  # two rounds cannot resolve it, honestly


def test_repeats_measured_one_config_after_the_other_are_not_paired():
    a, b = np.array([0.30, 0.31, 0.29]), np.array([0.25, 0.26, 0.24])
    d = paired.energy_difference(a, np.array([0.0, 1, 2]), b, np.array([10.0, 11, 12]))
    assert d["method"] == paired.UNPAIRED and d["n_pairs"] == 0
    assert d["delta"] == pytest.approx(-0.05) and d["distinguishable"] is True
    # Welch with equal variances and n: df = 4, half-width t(0.975, 4)·√(2·s²/3)
    half = 2.7764 * math.sqrt(2 * 0.0001 / 3)
    assert d["delta_ci_hi"] == pytest.approx(-0.05 + half, abs=1e-4)


def test_interleaving_rule():
    assert paired.interleaved(np.array([0, 10, 20]), np.array([5, 15, 25]))
    assert not paired.interleaved(np.array([0, 1, 2]), np.array([5, 15, 25]))
    assert not paired.interleaved(np.array([0, 10]), np.array([5, 15, 25]))


# --------------------------------------------------------------------------- paired accuracy
def test_mcnemar_exact_by_hand():
    assert paired.mcnemar_exact_p(0, 6) == pytest.approx(2 / 64)
    assert paired.mcnemar_exact_p(3, 3) == 1.0
    # b = 1, c = 7: 2·(1 + 8)/256
    assert paired.mcnemar_exact_p(1, 7) == pytest.approx(18 / 256)


def test_paired_items_resolve_a_difference_independent_wilson_intervals_hide():
    """200 items, B right on 10 more, only those 10 discordant: Wilson intervals overlap."""
    from host.accuracy.stats import wilson_interval

    rng = np.random.default_rng(3)
    a = (rng.random(200) < 0.5).astype(int)
    wrong = np.flatnonzero(a == 0)[:10]
    b = a.copy()
    b[wrong] = 1
    lo_b, _ = wilson_interval(int(b.sum()), 200)
    _, hi_a = wilson_interval(int(a.sum()), 200)
    assert lo_b < hi_a  # independent 95 % intervals overlap
    ids = [f"i{k}" for k in range(200)]
    ia = {"hellaswag": dict(zip(ids, a.tolist(), strict=True))}
    ib = {"hellaswag": dict(zip(ids, b.tolist(), strict=True))}
    r = paired.accuracy_difference(ia, ib, {"hellaswag": 1.0})
    assert r["delta"] == pytest.approx(10 / 200) and r["discordant"] == 10
    assert r["mcnemar_p"] == pytest.approx(2 / 1024) and r["distinguishable"] is True
    assert 0 < r["ci_lo"] < 0.05 < r["ci_hi"]


def test_newcombe_interval_covers_95_percent_in_simulation():
    """Coverage near 95 % both ways, and a width near the normal-theory one for this design:
    an interval of [−1, 1] covers everything, so coverage alone cannot tell a right interval.

    With probability 0.8 both answers come from one uniform u (a = u < 0.55, b = u < 0.60:
    then a = 1, b = 0 is impossible), else independently. The discordant rates are
    p10 = 0.2 · 0.55 · 0.40 and p01 = 0.8 · 0.05 + 0.2 · 0.45 · 0.60, so the difference's
    variance is (p10 + p01 − (p01 − p10)²) / n and the 95 % width 2 · 1.96 · its root."""
    rng = np.random.default_rng(11)
    n, trials, hits = 150, 1500, 0
    p_a, p_b, rho_share = 0.55, 0.60, 0.8
    widths = []
    for _ in range(trials):
        shared = rng.random(n) < rho_share
        u = rng.random(n)
        a = np.where(shared, u < p_a, rng.random(n) < p_a)
        b = np.where(shared, u < p_b, rng.random(n) < p_b)
        _, lo, hi = paired.newcombe_paired_interval(*paired.paired_table(a, b))
        hits += lo <= p_b - p_a <= hi
        widths.append(hi - lo)
    assert 0.93 < hits / trials < 0.97
    p10 = (1 - rho_share) * p_a * (1 - p_b)
    p01 = rho_share * (p_b - p_a) + (1 - rho_share) * (1 - p_a) * p_b
    width = 2 * 1.959964 * np.sqrt((p10 + p01 - (p01 - p10) ** 2) / n)
    assert float(np.mean(widths)) == pytest.approx(width, rel=0.10)


def test_composite_accuracy_difference_weights_benchmarks():
    ids = [f"i{k}" for k in range(100)]
    ones, zeros = dict.fromkeys(ids, 1), dict.fromkeys(ids, 0)
    half = {i: int(k < 50) for k, i in enumerate(ids)}
    r = paired.accuracy_difference({"x": zeros, "y": half}, {"x": half, "y": half},
                                   {"x": 0.25, "y": 0.75})
    assert r["delta"] == pytest.approx(0.25 * 0.5)
    assert "weighted" in r["method"]
    none = paired.accuracy_difference({"x": ones}, {"z": ones}, {"x": 1.0})
    assert none["distinguishable"] is None and "no per-item" in none["reason"]


def test_epi_interval_coverage_is_a_bonferroni_lower_bound():
    acc = stats.Accuracy(0.5, 0.45, 0.55, "x")
    assert stats.epi_coverage(0.75, acc) == pytest.approx(0.70)
    assert stats.epi_coverage(0.9688, acc) == pytest.approx(0.9188)
    # an accuracy given without an interval counts as exact
    assert stats.epi_coverage(0.75, stats.Accuracy(0.5, np.nan, np.nan, "cli")) == 0.75
    assert np.isnan(stats.epi_coverage(0.75, None))


def test_items_to_tell_apart_gives_80_percent_power_in_simulation():
    """Connor's item count, checked by simulation with the Newcombe interval: at the count it
    gives, the interval excludes 0 in about 80 % of studies with that difference and
    discordant share; at half the count clearly fewer do.

    Design: p10 = 0.05 (A right, B wrong), p01 = 0.15, so Δ = 0.10 and ψ = 0.20; written out,
    n = (1.959964·√0.2 + 0.841621·√(0.2 − 0.01))² / 0.01 = 154.6 → 155."""
    need = paired.items_to_tell_apart(0.10, 1000, 200)
    assert need == 155
    rng = np.random.default_rng(5)
    probs = [0.55, 0.05, 0.15, 0.25]  # both right, A only, B only, neither

    def power(n: int, trials: int = 1500) -> float:
        hits = 0
        for a, b, c, d in rng.multinomial(n, probs, size=trials):
            _, lo, hi = paired.newcombe_paired_interval(int(a), int(b), int(c), int(d))
            hits += lo > 0.0 or hi < 0.0
        return hits / trials

    assert 0.74 < power(need) < 0.87
    assert power(need // 2) < 0.60


def test_items_to_tell_apart_projects_nothing_without_a_difference():
    assert paired.items_to_tell_apart(0.0, 200, 12) is None  # equal: no count follows
    assert paired.items_to_tell_apart(0.05, 0, 0) is None
    assert paired.items_to_tell_apart(float("nan"), 200, 12) is None
