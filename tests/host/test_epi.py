"""Statistics, EPI, Pareto, matched pairs and layer groups (host.analysis.statistics)."""

from __future__ import annotations

import numpy as np
import pytest

from host.analysis import statistics as epi


def test_repeat_stats_median_cv_and_ci():
    v = np.array([1.00, 1.02, 0.98, 1.01, 0.99])
    s = epi.repeat_stats(v, n_boot=4000, seed=1)
    assert s.median == 1.00 and s.n == 5
    assert s.cv == pytest.approx(np.std(v, ddof=1) / np.mean(v))
    assert s.ci_lo <= s.median <= s.ci_hi and s.ci_lo >= 0.98 and s.ci_hi <= 1.02
    assert s.reason == ""
    # reproducible with the same seed
    assert epi.repeat_stats(v, n_boot=4000, seed=1) == s


def test_repeat_stats_nulls_never_zero():
    one = epi.repeat_stats([2.0])
    assert one.median == 2.0 and np.isnan(one.cv) and "one repeat" in one.reason
    none = epi.repeat_stats([])
    assert np.isnan(none.median) and none.reason == "no valid repeats"
    bad = epi.repeat_stats([1.0, np.nan, 1.1])
    assert np.isnan(bad.median) and "1 of 3 repeats are null" in bad.reason


def test_bootstrap_ci_covers_the_true_median_about_95_percent():
    rng = np.random.default_rng(0)
    hits = 0
    for i in range(200):
        v = rng.normal(10.0, 1.0, 15)
        lo, hi = epi.bootstrap_median_ci(v, n_boot=500, seed=i)
        hits += lo <= 10.0 <= hi
    assert 0.85 <= hits / 200 <= 1.0


def test_epi_and_its_interval():
    acc = epi.Accuracy(0.5, 0.45, 0.55, "composite acc_norm")
    e, lo, hi, why = epi.epi(0.2, 0.18, 0.22, acc)
    assert (e, why) == (pytest.approx(0.4), "")
    assert lo == pytest.approx(0.18 / 0.55) and hi == pytest.approx(0.22 / 0.45)
    assert np.isnan(epi.epi(0.2, 0.1, 0.3, None)[0])
    assert "not in (0, 1]" in epi.epi(0.2, 0.1, 0.3, epi.Accuracy(1.5, np.nan, np.nan, "x"))[3]
    assert "null" in epi.epi(np.nan, np.nan, np.nan, acc)[3]


def test_pareto_front():
    acc = np.array([0.50, 0.55, 0.52, 0.40, np.nan, 0.55])
    jpt = np.array([0.20, 0.30, 0.35, 0.10, 0.05, 0.31])
    front = epi.pareto_front(acc, jpt)
    # 2 is dominated by 1 (more accurate, cheaper); 5 by 1; 4 has no accuracy
    assert list(front) == [True, True, False, True, False, False]


def test_perplexity_pairs():
    pairs = epi.perplexity_pairs(
        ["a", "b", "c"], np.array([10.0, 10.05, 12.0]), np.array([0.2, 0.3, 0.1]),
        np.array([0.19, 0.28, 0.09]), np.array([0.21, 0.32, 0.11]), rel_tol=0.01)
    assert len(pairs) == 1
    p = pairs[0]
    assert (p["cheaper"], p["dearer"]) == ("a", "b")
    assert p["saving_pct"] == pytest.approx(100 / 3)
    # overlapping intervals: not a pair
    assert epi.perplexity_pairs(["a", "b"], np.array([10.0, 10.0]), np.array([0.2, 0.21]),
                                np.array([0.18, 0.19]), np.array([0.22, 0.23]),
                                rel_tol=0.01) == []


def test_differential_groups_attributes_one_group():
    types = {"base": {"early": "Q4", "middle": "Q4", "late": "Q4"},
             "late8": {"early": "Q4", "middle": "Q4", "late": "Q8"},
             "both": {"early": "Q8", "middle": "Q4", "late": "Q8"}}
    rng = np.random.default_rng(2)
    vals = {"base": 0.20 + rng.normal(0, 0.002, 5), "late8": 0.23 + rng.normal(0, 0.002, 5),
            "both": 0.26 + rng.normal(0, 0.002, 5)}
    rows = epi.differential_groups(types, vals, n_boot=2000, seed=0)
    by = {(r["config_a"], r["config_b"]): r for r in rows}
    assert set(by) == {("base", "late8"), ("both", "late8")}  # base/both differ in 2 groups
    r = by[("base", "late8")]
    assert r["group"] == "late" and r["delta_j_per_token"] == pytest.approx(0.03, abs=0.004)
    assert r["ci_lo"] < r["delta_j_per_token"] < r["ci_hi"] and r["ci_lo"] > 0.02
    r2 = by[("both", "late8")]
    assert r2["group"] == "early" and r2["delta_j_per_token"] == pytest.approx(-0.03, abs=0.004)


def test_differential_needs_repeats():
    rows = epi.differential_groups({"a": {"g": "Q4"}, "b": {"g": "Q8"}},
                                   {"a": np.array([0.2]), "b": np.array([0.3, 0.31])})
    assert np.isnan(rows[0]["ci_lo"]) and "≥ 2 valid repeats" in rows[0]["reason"]


def test_time_share_split_is_proportional_and_labelled():
    out = epi.time_share_split(0.3, {"early": 1.0, "late": 2.0})
    assert out == {"early": pytest.approx(0.1), "late": pytest.approx(0.2)}
    assert "estimate" in epi.TIME_SHARE_LABEL
    assert all(np.isnan(v) for v in epi.time_share_split(np.nan, {"a": 1.0}).values())
