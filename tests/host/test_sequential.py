"""The sequential method's guarantees, checked from outside its own formulas.

* the closed-form interval is where the mixture likelihood ratio, integrated numerically from
  its definition, reaches 1/α;
* over thousands of simulated studies with known true differences, stopped by the campaign's
  own rule (after each round from the third, stop when decided or equivalent), the
  confidence sequence covers the truth at every look at least 1 − α of the time, and wrong
  verdicts occur no more often than α — while a fixed-n t interval looked at the same way
  does not (so the simulation can fail);
* the power analysis' round counts decide about as often as they say.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from host.analysis import sequential as sq
from host.analysis.intervals import student_t_ppf

ALPHA = 0.05
N_STUDIES = 4000
MAX_ROUNDS = 20
MIN_ROUNDS = 3


def _mixture_ratio(x: np.ndarray, mu: float, c: float) -> float:
    """M_n(μ) from its definition: ∫∫ Π N(xᵢ; μ + θσ, σ²) N(θ; 0, 1/c) dθ dσ/σ over the same
    integral at θ = 0, by quadrature on a grid (u = 1/σ), independent of the closed form."""
    y = x - mu
    n, s, t = len(y), float(y.sum()), float((y ** 2).sum())
    u = np.linspace(1e-6, 25.0 / math.sqrt(t / n), 1201)
    theta = np.linspace(-12.0 / math.sqrt(c), 12.0 / math.sqrt(c), 2001)
    # log integrand: (n−1)·log u − (T u² − 2θ S u + n θ²)/2 + log prior(θ)
    lu = (n - 1) * np.log(u)[:, None] - (t * u[:, None] ** 2 - 2 * theta[None, :] * s
                                         * u[:, None] + n * theta[None, :] ** 2) / 2
    lp = 0.5 * math.log(c / (2 * math.pi)) - c * theta ** 2 / 2
    a = lu + lp[None, :]
    m = a.max()
    num = np.trapezoid(np.trapezoid(np.exp(a - m), theta, axis=1), u) * math.exp(m)
    b = (n - 1) * np.log(u) - t * u ** 2 / 2
    mb = b.max()
    den = np.trapezoid(np.exp(b - mb), u) * math.exp(mb)
    return float(num / den)


@pytest.mark.parametrize("n", [3, 5, 9])
def test_interval_edge_is_where_the_mixture_ratio_reaches_one_over_alpha(n: int) -> None:
    rng = np.random.default_rng(n)
    x = rng.normal(0.4, 1.3, n)
    _, lo, hi = sq.sequence_bounds(x, ALPHA, sq.DEFAULT_C)
    for edge in (lo[-1], hi[-1]):
        assert _mixture_ratio(x, float(edge), sq.DEFAULT_C) == pytest.approx(1 / ALPHA, rel=0.01)
    inside = _mixture_ratio(x, float((lo[-1] + hi[-1]) / 2), sq.DEFAULT_C)
    assert inside < 1 / ALPHA


def _studies(seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(true means, margins, per-round differences) of simulated studies, scale varied."""
    rng = np.random.default_rng(seed)
    sd = rng.uniform(0.5, 4.0, N_STUDIES)  # per-round spread, e.g. % saving
    margin = sd * rng.choice([0.5, 1.0, 2.0], N_STUDIES)
    rel = rng.choice([0.0, 0.0, 0.25, 0.5, 0.99, 1.0, 1.5, 3.0], N_STUDIES)
    mu = rel * margin * rng.choice([-1.0, 1.0], N_STUDIES)
    x = mu[:, None] + sd[:, None] * rng.standard_normal((N_STUDIES, MAX_ROUNDS))
    return mu, margin, x


def _run_protocol(lo: np.ndarray, hi: np.ndarray, mu: np.ndarray, margin: np.ndarray
                  ) -> dict[str, float]:
    """Stop at the first look ≥ MIN_ROUNDS that is decided or equivalent; score the verdicts."""
    m = margin[:, None]
    decided = (lo > 0) | (hi < 0)
    equivalent = (lo > -m) & (hi < m)
    stop_now = decided | equivalent
    stop_now[:, : MIN_ROUNDS - 1] = False
    any_stop = stop_now.any(axis=1)
    at = np.where(any_stop, stop_now.argmax(axis=1), MAX_ROUNDS - 1)
    rows = np.arange(len(mu))
    lo_s, hi_s = lo[rows, at], hi[rows, at]
    dec, eqv = decided[rows, at] & any_stop, equivalent[rows, at] & any_stop & ~decided[rows, at]
    wrong_dir = dec & ((mu == 0) | ((lo_s > 0) & (mu < 0)) | ((hi_s < 0) & (mu > 0)))
    wrong_eqv = eqv & (np.abs(mu) >= margin)
    looks = np.arange(MAX_ROUNDS)[None, :] <= at[:, None]
    looks[:, : MIN_ROUNDS - 1] = False
    missed = ((lo > mu[:, None]) | (hi < mu[:, None])) & looks
    return {
        "coverage_at_stop": float(np.mean((lo_s <= mu) & (mu <= hi_s))),
        "coverage_all_looks": float(1 - np.mean(missed.any(axis=1))),
        "wrong": float(np.mean(wrong_dir | wrong_eqv)),
        "settled": float(np.mean(any_stop)),
        "false_decided_at_zero": float(np.mean(dec[mu == 0])),
    }


def test_coverage_and_wrong_verdicts_by_simulation() -> None:
    """≥ 1,000 studies (4,000) with known differences: the stated guarantees hold."""
    mu, margin, x = _studies(seed=20261125)
    _, lo, hi = sq.sequence_bounds(x, ALPHA)
    r = _run_protocol(lo, hi, mu, margin)
    print("confidence sequence:", r)
    assert r["coverage_all_looks"] >= 1 - ALPHA  # time-uniform: every look of every study
    assert r["coverage_at_stop"] >= 1 - ALPHA
    assert r["wrong"] <= ALPHA
    assert r["false_decided_at_zero"] <= ALPHA
    assert r["settled"] > 0.5  # it does decide things, not just stay wide


def test_fixed_t_interval_looked_at_every_round_fails_the_same_simulation() -> None:
    """The simulation has teeth: peeking with a 95 % t interval inflates the error."""
    mu, margin, x = _studies(seed=20261125)
    n = np.arange(1, MAX_ROUNDS + 1)
    mean = np.cumsum(x, axis=1) / n
    sd = np.array([np.std(x[:, :k], axis=1, ddof=1) if k > 1 else np.full(len(x), np.inf)
                   for k in n]).T
    t = np.array([student_t_ppf(0.975, k - 1) if k > 1 else np.inf for k in n])
    half = t * sd / np.sqrt(n)
    r = _run_protocol(mean - half, mean + half, mu, margin)
    print("peeking t interval:", r)
    assert r["coverage_all_looks"] < 1 - ALPHA
    assert r["false_decided_at_zero"] > ALPHA


@pytest.mark.parametrize(("sd", "d"), [(1.0, 2.0), (3.0, 4.0)])
def test_power_analysis_round_count_decides_about_as_often_as_stated(sd: float, d: float
                                                                     ) -> None:
    n = sq.rounds_for(sd, d, power=0.8)
    assert n is not None and n >= 3
    rng = np.random.default_rng(7)
    x = d + sd * rng.standard_normal((4000, n))
    _, lo, _ = sq.sequence_bounds(x)
    p_at_n = float(np.mean(lo[:, -1] > 0))
    p_before = float(np.mean(lo[:, max(n - 3, 1)] > 0))
    # plug-in sd: a little below the target at small n, and clearly more than two rounds earlier
    assert 0.7 <= p_at_n <= 0.95
    assert p_before < p_at_n - 0.05
    # what a budget resolves is the inverse: n rounds resolve about d
    assert sq.resolvable(sd, n) <= d < sq.resolvable(sd, n - 1)


def test_width_shrinks_with_rounds_and_is_unbounded_at_two() -> None:
    g = sq.width_factor(np.arange(2, 30))
    assert math.isinf(g[0])  # no anytime-valid interval from 2 rounds at c = 0.05
    finite = g[1:] * np.sqrt(np.arange(3, 30) - 1.0)
    assert np.all(np.diff(finite) < 0)
    # wider than the fixed-n t interval (the price of looking at every round)
    assert finite[7] > student_t_ppf(0.975, 9) / math.sqrt(10)


def test_decide_states_and_texts() -> None:
    clear = sq.decide([-5.1, -4.8, -5.3, -4.9, -5.0], margin=1.0, max_rounds=10)
    assert clear.state == "decided" and clear.direction == -1 and clear.settled
    assert clear.text("q8", "q4", "saving").startswith("decided: saving is smaller (q4 vs q8)")
    same = sq.decide([0.01, -0.02, 0.015, 0.0, -0.01, 0.005], margin=1.0, max_rounds=10)
    assert same.state == "equivalent" and same.direction == 0
    noisy = sq.decide([1.0, -2.0, 3.0], margin=0.5, max_rounds=10)
    assert noisy.state == "undecided" and not noisy.budget_spent and not noisy.settled
    spent = sq.decide([0.8, 1.4, 0.2, 1.1], margin=0.1, max_rounds=4)
    assert spent.state == "undecided" and spent.budget_spent and spent.settled
    assert spent.rounds_needed is not None and spent.rounds_needed > 4
    assert "undecided after the budget" in spent.text()
    assert f"about {spent.rounds_needed} rounds" in spent.text()
    empty = sq.decide([], margin=1.0, max_rounds=4)
    assert empty.state == "undecided" and "no valid paired round yet" in empty.text()


@pytest.mark.parametrize("bad", [[1.0, math.nan], [[1.0, 2.0]], [1.0, math.inf]])
def test_decide_refuses_non_finite_or_shaped_input(bad: list) -> None:
    with pytest.raises(ValueError, match="finite numbers"):
        sq.decide(bad)


def test_parameters_are_checked() -> None:
    with pytest.raises(ValueError, match="alpha"):
        sq.width_factor(5, alpha=1.5)
    with pytest.raises(ValueError, match="margin"):
        sq.decide([1.0, 2.0], margin=-1.0)
    assert sq.power_lines(math.nan, 5, [1.0]) == ["power analysis: no per-round spread "
                                                  "measured yet"]


def test_energy_verdict_pairs_runs_like_the_paired_interval() -> None:
    """Five interleaved rounds of 3 repeats: B saves ~10 % every round → decided, B cheaper."""
    rng = np.random.default_rng(3)
    rounds = 5
    t = np.arange(rounds * 3, dtype=np.float64)
    block = np.repeat(np.arange(rounds), 3)
    drift = np.repeat(1 + rng.normal(0, 0.05, rounds), 3)  # shared by both in a round
    a = 0.10 * drift * (1 + rng.normal(0, 0.003, rounds * 3))
    b = 0.09 * drift * (1 + rng.normal(0, 0.003, rounds * 3))
    v = sq.energy_verdict(a, t * 2, b, t * 2 + 1, block_a=block, block_b=block, margin_pct=2.0)
    assert v is not None and v.n == rounds and v.state == "decided"
    assert v.lo > 0 and v.mean == pytest.approx(10.0, abs=1.0)  # saving of B, %
    # one configuration measured entirely after the other: no rounds to pair
    assert sq.energy_verdict(a, t, b, t + 100, block_a=block, block_b=block) is None
