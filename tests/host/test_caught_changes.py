"""Tests that catch small, realistic wrong changes a mutation audit found surviving the suite.
Each expected figure is a closed form built into the test's own data."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from epi.formats.trace import infer_period_s
from host.analysis.paired import newcombe_paired_interval
from host.analysis.windows import idle_power


def test_the_inferred_period_is_the_smallest_channel_median() -> None:
    """Two channels at 10 Hz and 2 Hz in one segment: the period is 0.1 s (the fastest
    channel's median spacing), not 0.5 s (the largest median)."""
    rows = [(0, k * 100_000_000) for k in range(21)] + [(1, k * 500_000_000) for k in range(5)]
    columns = {"channel": [c for c, _ in rows], "t_mono_ns": [t for _, t in rows]}
    assert infer_period_s(columns) == pytest.approx(0.1)


def test_idle_power_is_a_ratio_of_sums_not_a_mean_of_ratios() -> None:
    """Two idle windows: 10 J over 10 s and 1 J over 0.1 s. Ratio of sums: 11 J / 10.1 s =
    1.089 W; the mean of ratios would be (1 + 10) / 2 = 5.5 W."""
    win = pd.DataFrame({"kind": ["idle", "idle"], "scope": ["all", "all"],
                        "energy_j": [10.0, 1.0], "duration_s": [10.0, 0.1],
                        "valid": [True, True], "reason": ["", ""]})
    power, _ = idle_power(win)
    assert power["all"] == pytest.approx(11.0 / 10.1)


def _wilson(x: int, n: int, z: float = 1.959963984540054) -> tuple[float, float]:
    p = x / n
    den = 1 + z * z / n
    mid = (p + z * z / (2 * n)) / den
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / den
    return mid - half, mid + half


@pytest.mark.parametrize("table", [(12, 9, 2, 21), (30, 1, 10, 9), (5, 0, 3, 40),
                                   (50, 10, 10, 30)])
def test_newcombe_paired_interval_matches_method_10_written_out(
        table: tuple[int, int, int, int]) -> None:
    """Newcombe (1998), method 10, written out here from the paper for Δ = p_B − p_A: each
    proportion's Wilson limits combined through the phi correlation of the paired table.
    Dropping any of the three terms under the square roots moves a limit."""
    a, b, c, d = table  # both right, A only, B only, both wrong
    n = a + b + c + d
    p_b, p_a = (a + c) / n, (a + b) / n
    lb, ub = _wilson(a + c, n)
    la, ua = _wilson(a + b, n)
    phi = (a * d - b * c) / math.sqrt((a + b) * (c + d) * (a + c) * (b + d))
    theta = p_b - p_a
    lo = theta - math.sqrt((p_b - lb) ** 2 - 2 * phi * (p_b - lb) * (ua - p_a) + (ua - p_a) ** 2)
    hi = theta + math.sqrt((ub - p_b) ** 2 - 2 * phi * (ub - p_b) * (p_a - la) + (p_a - la) ** 2)
    got = newcombe_paired_interval(a, b, c, d)
    assert got == (pytest.approx(theta, abs=1e-12), pytest.approx(max(lo, -1.0), abs=1e-12),
                   pytest.approx(min(hi, 1.0), abs=1e-12))


@pytest.mark.parametrize("ending", ["done", "failed"])
def test_a_step_that_ends_is_no_longer_interrupted(tmp_path, ending: str) -> None:
    """Journal: started → done (or failed) leaves nothing interrupted; a step only started is
    the interrupted one, and its attempt is counted."""
    from host.campaign.journal import Done, Failed, Journal, Session, Started

    j = Journal(tmp_path)
    j.append(Session("s.toml", None, str(tmp_path)))
    j.append(Started("run:a:1", 1))
    j.append(Done("run:a:1", 1, {}) if ending == "done" else Failed("run:a:1", 1, 1, "x"))
    j.append(Started("run:b:1", 1))
    state = j.read()
    assert set(state.interrupted) == {"run:b:1"}
    assert state.attempts == {"run:a:1": 1, "run:b:1": 1}
    assert ("run:a:1" in state.done) == (ending == "done")
