"""bench/bench_adaptive.py's simulation against figures worked out by hand."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"


def _bench() -> ModuleType:
    sys.path.insert(0, str(BENCH))
    spec = importlib.util.spec_from_file_location("bench_adaptive", BENCH / "bench_adaptive.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["bench_adaptive"] = mod  # dataclasses look their module up by name
    spec.loader.exec_module(mod)
    return mod


def test_runs_saved_when_one_comparison_settles_at_the_minimum() -> None:
    """Baseline A against B (the same J/token: never decided, never equivalent within 1 % at
    a 5 % spread in 6 rounds) and C (half of A's J/token: decided after round 3). Adaptive: 3
    rounds of A, B, C, then rounds 4–6 of A and B = 15 runs; fixed: 6 rounds × 3 = 18 runs;
    equal run times, assessments free → 15/18 — in every study but those where A–B is
    (wrongly) decided, which the confidence sequence allows in at most 5 % of them."""
    b = _bench()
    inp = b.Inputs("assumed: test", {"A": 0.10, "B": 0.10, "C": 0.05}, 5.0,
                   {"A": 10.0, "B": 10.0, "C": 10.0}, 0.0, 0.0, "A")
    ratios, same, ended = b.simulate(inp, b.rules_for(("baseline",)), 200)
    assert ended.get(6, 0) >= 190  # wrong decisions (stopping early) ≤ α = 5 %
    assert sum(r == pytest.approx(15 / 18, rel=1e-12) for r in ratios) >= 190
    assert float(np.median(ratios)) == pytest.approx(15 / 18, rel=1e-12)
    assert same > 0.9


def test_assessments_cost_time_when_nothing_settles_early() -> None:
    """Every comparison undecided to the budget: the same 18 runs, plus the assessments after
    rounds 3, 4 and 5 (the one after round 6 is the fixed protocol's analysis too):
    (18 × 10 + 3 × 6) / (18 × 10) = 1.1 — but where a comparison is wrongly decided (≤ 5 %
    each of the two) a configuration stops early."""
    b = _bench()
    inp = b.Inputs("assumed: test", {"A": 0.10, "B": 0.10, "C": 0.10}, 5.0,
                   {"A": 10.0, "B": 10.0, "C": 10.0}, 6.0, 0.0, "A")
    ratios, _, _ = b.simulate(inp, b.rules_for(("baseline",)), 200)
    assert sum(r == pytest.approx(1.1, rel=1e-12) for r in ratios) >= 180
    assert float(np.median(ratios)) == pytest.approx(1.1, rel=1e-12)
