"""RQ4 and RQ5 (host/analysis/questions.py) against cases built with known answers."""

from __future__ import annotations

import numpy as np
import pytest

from host.analysis.questions import decompose, epi_optimal_set, size_vs_reference

SIZES = {"uniform_q4km": 100.0, "small": 80.0, "big": 130.0, "same": 100.5}


@pytest.mark.parametrize(("epi", "answer", "status"), [
    # one clear optimum, smaller than the reference
    ({"small": (1.0, 0.9, 1.1), "big": (2.0, 1.8, 2.2), "uniform_q4km": (1.6, 1.5, 1.7)},
     "smaller", "decided"),
    # one clear optimum, larger
    ({"small": (2.0, 1.9, 2.1), "big": (1.0, 0.9, 1.1), "uniform_q4km": (1.6, 1.5, 1.7)},
     "larger", "decided"),
    # the optimum cannot be told from a larger rival: undecided, both named
    ({"small": (1.0, 0.8, 1.3), "big": (1.1, 0.9, 1.4), "uniform_q4km": (1.6, 1.5, 1.7)},
     "on both sides", "undecided"),
    # the reference-sized optimum
    ({"same": (1.0, 0.95, 1.05), "small": (2.0, 1.9, 2.1), "uniform_q4km": (1.5, 1.4, 1.6)},
     "the same size", "decided"),
])
def test_size_against_the_reference(epi: dict[str, tuple[float, float, float]], answer: str,
                                    status: str) -> None:
    v = size_vs_reference(epi, SIZES, "uniform_q4km")
    assert v is not None and v.answer == answer and v.status == status
    assert v.optimum[0] == min(epi, key=lambda c: epi[c][0])


def test_the_optimal_set_holds_every_rival_whose_interval_reaches_the_optimum() -> None:
    epi = {"a": (1.0, 0.9, 1.2), "b": (1.15, 1.1, 1.3), "c": (1.25, 1.21, 1.3)}
    assert epi_optimal_set(epi) == ("a", "b")  # c's lower end 1.21 is above a's 1.2
    assert size_vs_reference({"a": (1.0, 0.9, 1.1)}, {"a": 1.0}, "missing") is None


A, B = 2e-9, 0.5  # J per byte streamed per token, J per compute-second per token


def _sim(rng: np.random.Generator, corr_noise: float, n: int = 12
         ) -> tuple[dict[str, float], dict[str, float], dict[str, float]]:
    bytes_ = rng.uniform(0.5e8, 1.5e8, n)
    compute = rng.uniform(0.01, 0.03, n) + corr_noise * (bytes_ - 1e8) / 1e10
    # noise sd 1.5 mJ/token against a compute term spanning 10 mJ/token and a bandwidth term
    # spanning 200 mJ/token: both effects well above the noise (the test is of the method,
    # at a signal a 12-configuration study can resolve)
    j = A * bytes_ + B * compute + 0.01 + rng.normal(0, 0.0015, n)
    names = [f"c{i}" for i in range(n)]
    return (dict(zip(names, j, strict=True)), dict(zip(names, bytes_, strict=True)),
            dict(zip(names, compute, strict=True)))


def test_the_decomposition_recovers_both_terms_in_seeded_simulations() -> None:
    """energy = a·bytes + b·compute + noise: both terms named 'both' in ≥ 95 % of 200 runs,
    and the true a and b inside their 95 % intervals about as often as the level says."""
    named, a_in, b_in = 0, 0, 0
    for seed in range(200):
        d = decompose(*_sim(np.random.default_rng(seed), 0.0))
        assert d is not None
        named += d.answer == "both"
        a_in += d.a_ci[0] <= A <= d.a_ci[1]
        b_in += d.b_ci[0] <= B <= d.b_ci[1]
    assert named >= 190
    assert a_in >= 180 and b_in >= 180  # 95 % intervals: at least 90 % of 200 (binomial slack)


def test_one_term_alone_is_named_alone() -> None:
    rng = np.random.default_rng(7)
    n = 12
    bytes_ = rng.uniform(0.5e8, 1.5e8, n)
    compute = rng.uniform(0.01, 0.03, n)
    names = [f"c{i}" for i in range(n)]
    only_bw = A * bytes_ + 0.01 + rng.normal(0, 0.003, n)
    d = decompose(dict(zip(names, only_bw, strict=True)), dict(zip(names, bytes_, strict=True)),
                  dict(zip(names, compute, strict=True)))
    assert d is not None and d.answer == "bandwidth" and d.status == "decided"


def test_collinear_terms_are_reported_as_cannot_be_told_apart() -> None:
    rng = np.random.default_rng(3)
    n = 10
    bytes_ = rng.uniform(0.5e8, 1.5e8, n)
    compute = bytes_ * 2e-10 + rng.normal(0, 1e-5, n)  # compute follows the bytes
    j = A * bytes_ + B * compute + rng.normal(0, 0.003, n)
    names = [f"c{i}" for i in range(n)]
    d = decompose(dict(zip(names, j, strict=True)), dict(zip(names, bytes_, strict=True)),
                  dict(zip(names, compute, strict=True)))
    assert d is not None and d.answer == "cannot be told apart" and d.status == "undecided"
    assert abs(d.corr) > 0.95 and d.vif > 10


def test_fewer_than_four_configurations_give_no_decomposition() -> None:
    three = {"a": 1.0, "b": 2.0, "c": 3.0}
    assert decompose(three, three, three) is None
