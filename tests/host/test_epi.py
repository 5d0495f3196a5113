"""Statistics, EPI, Pareto, matched pairs and layer groups (host.analysis.statistics)."""

from __future__ import annotations

import numpy as np
import pytest

from host.analysis import statistics as epi


def test_repeat_stats_median_cv_and_honest_interval():
    v = np.array([1.00, 1.02, 0.98, 1.01, 0.99])
    s = epi.repeat_stats(v)
    assert s.median == 1.00 and s.n == 5
    assert s.cv == pytest.approx(np.std(v, ddof=1) / np.mean(v))
    # n = 5: no 95 % interval of the median exists; [min, max] covers 1 − 2/32 = 93.75 %
    assert (s.ci_lo, s.ci_hi) == (0.98, 1.02)
    assert s.ci_coverage == pytest.approx(0.9375) and not s.ci_level_met
    assert "no 95 % interval" in s.ci_note and "n ≥ 6" in s.ci_note
    assert "order-statistic" in s.ci_method
    # the mean's t interval is a real 95 % one: mean ± t(0.975, 4)·s/√5, t from tables
    half = 2.776445 * np.std(v, ddof=1) / np.sqrt(5)
    assert s.mean_ci_lo == pytest.approx(1.0 - half, rel=1e-6)
    assert s.mean_ci_hi == pytest.approx(1.0 + half, rel=1e-6)
    assert s.reason == ""


def test_repeat_stats_nulls_never_zero():
    one = epi.repeat_stats([2.0])
    assert one.median == 2.0 and np.isnan(one.cv) and "one repeat" in one.reason
    none = epi.repeat_stats([])
    assert np.isnan(none.median) and none.reason == "no valid repeats"
    bad = epi.repeat_stats([1.0, np.nan, 1.1])
    assert np.isnan(bad.median) and "1 of 3 repeats are null" in bad.reason


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


def test_perplexity_pairs_carry_their_paired_difference():
    rounds = np.arange(3) * 10.0
    reps = {"a": (np.array([0.20, 0.21, 0.19]), rounds),
            "b": (np.array([0.30, 0.31, 0.29]), rounds + 1),
            "c": (np.array([0.10, 0.10, 0.10]), rounds + 2)}
    pairs = epi.perplexity_pairs(["a", "b", "c"], np.array([10.0, 10.05, 12.0]), reps,
                                 rel_tol=0.01)
    assert len(pairs) == 1
    p = pairs[0]
    assert (p.cheaper, p.dearer) == ("a", "b")
    assert p.saving_pct == pytest.approx(np.mean([10 / 30, 10 / 31, 10 / 29]) * 100)
    assert p.delta_j_per_token == pytest.approx(-0.10)
    assert p.distinguishable is True and p.ci_method.startswith("paired by round")
    # equal energies: reported, and said to be indistinguishable
    same = {"a": (np.array([0.20, 0.22, 0.19]), rounds),
            "b": (np.array([0.21, 0.20, 0.20]), rounds + 1)}
    q = epi.perplexity_pairs(["a", "b"], np.array([10.0, 10.0]), same, rel_tol=0.01)[0]
    assert q.distinguishable is False


def test_differential_groups_attributes_one_group():
    types = {"base": {"early": "Q4", "middle": "Q4", "late": "Q4"},
             "late8": {"early": "Q4", "middle": "Q4", "late": "Q8"},
             "both": {"early": "Q8", "middle": "Q4", "late": "Q8"}}
    rng = np.random.default_rng(2)
    t = np.arange(5) * 10.0
    vals = {"base": (0.20 + rng.normal(0, 0.002, 5), t),
            "late8": (0.23 + rng.normal(0, 0.002, 5), t + 1),
            "both": (0.26 + rng.normal(0, 0.002, 5), t + 2)}
    rows = epi.differential_groups(types, vals)
    by = {(r.config_a, r.config_b): r for r in rows}
    assert set(by) == {("base", "late8"), ("both", "late8")}  # base/both differ in 2 groups
    r = by[("base", "late8")]
    assert r.group == "late" and r.delta_j_per_token == pytest.approx(0.03, abs=0.004)
    assert r.ci_lo < r.delta_j_per_token < r.ci_hi and r.ci_lo > 0.02
    assert r.ci_coverage == 0.95 and r.ci_method.startswith("paired by round")
    r2 = by[("both", "late8")]
    assert r2.group == "early" and r2.delta_j_per_token == pytest.approx(-0.03, abs=0.004)


def test_differential_needs_repeats():
    rows = epi.differential_groups({"a": {"g": "Q4"}, "b": {"g": "Q8"}},
                                   {"a": (np.array([0.2]), np.array([0.0])),
                                    "b": (np.array([0.3, 0.31]), np.array([1.0, 2.0]))})
    assert np.isnan(rows[0].ci_lo) and "≥ 2 valid repeats" in rows[0].reason


def test_time_share_split_is_proportional_and_labelled():
    out = epi.time_share_split(0.3, {"early": 1.0, "late": 2.0})
    assert out == {"early": pytest.approx(0.1), "late": pytest.approx(0.2)}
    assert "estimate" in epi.TIME_SHARE_LABEL
    assert all(np.isnan(v) for v in epi.time_share_split(np.nan, {"a": 1.0}).values())
