"""The aligner's numpy core against per-window reference integrals and exact profiles."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from host.analysis.align import (
    FEW_SAMPLES,
    INVALID_DATA,
    OUTSIDE,
    ChannelSeries,
    ClockMap,
    Intervals,
    counter_energy_j,
    trapezoid_energy_j,
    window_energy,
)

NS = 1_000_000_000


def _reference(t: np.ndarray, p: np.ndarray, a: int, b: int, edge: str) -> float:
    """Per-window loop: the obvious implementation the vectorised one must agree with."""
    if a < t[0] or b > t[-1] or b < a:
        return float("nan")
    inside = (t >= a) & (t <= b)
    if not inside.any():
        return float("nan")
    xs = np.concatenate([[a], t[inside], [b]])
    if edge == "linear":
        ys = np.interp(xs, t, p)
    else:
        ys = np.concatenate([[p[inside][0]], p[inside], [p[inside][-1]]])
    return float(np.trapezoid(ys, xs.astype(np.float64)) / NS)


@pytest.fixture
def random_trace() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(7)
    n = 5000
    t = (np.cumsum(rng.integers(50_000_000, 150_000_000, n)) + 10**12).astype(np.int64)
    p = rng.uniform(1.0, 10.0, n)
    a = rng.integers(t[0] - NS, t[-1], 400)
    b = a + rng.integers(0, 5 * NS, 400)
    # edge cases: reaching before/after the trace, no sample inside, on samples exactly
    a = np.concatenate([a, [t[0] - 1, t[-1] - NS, t[5] + 1, t[0], t[10]]])
    b = np.concatenate([b, [t[0] + NS, t[-1] + 1, t[5] + 2, t[-1], t[10]]])
    return t, p, a, b


@pytest.mark.parametrize("edge", ["step", "linear"])
@pytest.mark.parametrize("chunk", [3, 64, 1 << 16])
def test_trapezoid_matches_per_window_reference(random_trace, edge, chunk):
    t, p, a, b = random_trace
    ref = np.array([_reference(t, p, x, y, edge) for x, y in zip(a, b, strict=True)])
    got = trapezoid_energy_j(t, p, a, b, edge=edge, chunk=chunk)
    assert np.array_equal(np.isnan(got), np.isnan(ref))
    assert np.isnan(ref).sum() >= 3 and (~np.isnan(ref)).sum() > 300  # both kinds exercised
    np.testing.assert_allclose(got[~np.isnan(ref)], ref[~np.isnan(ref)], rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("edge", ["step", "linear"])
def test_adjacent_token_windows_match_reference(random_trace, edge):
    """Token windows share edges (the chained fast path), some edges exactly on samples, some
    windows with fewer than 2 samples or nulled by a fault in window_energy."""
    t, p, _, _ = random_trace
    rng = np.random.default_rng(11)
    edges = np.sort(rng.integers(t[3], t[-3], 3000))
    edges[::50] = t[np.searchsorted(t, edges[::50])]  # some edges on samples exactly
    edges = np.unique(edges)
    a, b = edges[:-1], edges[1:]
    ref = np.array([_reference(t, p, x, y, edge) for x, y in zip(a, b, strict=True)])
    got = trapezoid_energy_j(t, p, a, b, edge=edge, chunk=97)
    ok = ~np.isnan(ref)
    np.testing.assert_allclose(got[ok], ref[ok], rtol=1e-9)
    e = np.concatenate([[0.0], np.cumsum(0.5 * (p[1:] + p[:-1]) * np.diff(t) / NS)])
    bad = Intervals.build([a[700]], [a[700] + 1], ["bus_error event"])
    s = ChannelSeries(0, t, p, e, invalid=bad)
    r = window_energy(s, a, b, edge=edge, chunk=97)
    fine = (r.n_samples >= 2) & (r.code == 0)
    assert r.code[700] == INVALID_DATA and (r.code == FEW_SAMPLES).sum() > 100
    np.testing.assert_allclose(r.energy_j[fine], ref[fine], rtol=1e-9)
    assert np.isnan(r.energy_j[~fine]).all()


def test_step_edges_exact_for_steps_at_window_edges():
    """A load stepping exactly at the window edges is integrated exactly by the step model,
    and with a bias toward the neighbours by linear interpolation."""
    t = np.arange(0, 10 * NS, NS // 10, dtype=np.int64) + 37_000_000  # 10 Hz, off-grid
    a, b = 3 * NS, 3 * NS + NS // 2  # a 0.5 s phase at 8 W between 3 W
    p = np.where((t >= a) & (t < b), 8.0, 3.0)
    step = trapezoid_energy_j(t, p, np.array([a]), np.array([b]), edge="step")[0]
    lin = trapezoid_energy_j(t, p, np.array([a]), np.array([b]), edge="linear")[0]
    assert step == pytest.approx(4.0, rel=1e-12)
    assert lin < 4.0 * 0.99  # linear smears the steps into the neighbours


def test_linear_exact_for_ramp():
    t = np.arange(0, 10 * NS, NS // 10, dtype=np.int64) + 37_000_000
    p = 2.0 + 0.5 * t / NS  # ramp: linear interpolation is exact
    a, b = np.array([1_234_567_890]), np.array([7_654_321_000])
    exact = (2.0 * (b - a) / NS + 0.25 * ((b / NS) ** 2 - (a / NS) ** 2))[0]
    assert trapezoid_energy_j(t, p, a, b, edge="linear")[0] == pytest.approx(exact, rel=1e-12)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.floats(0.5, 50.0), min_size=3, max_size=60), st.integers(1, 10**9))
def test_additivity_of_adjacent_windows(levels, cut):
    """∫[a,c] = ∫[a,b] + ∫[b,c] whenever b is a sample (any edge model)."""
    n = len(levels)
    t = np.arange(n, dtype=np.int64) * 100_000_000 + cut
    p = np.array(levels)
    mid = t[n // 2]
    for edge in ("step", "linear"):
        whole = trapezoid_energy_j(t, p, np.array([t[0]]), np.array([t[-1]]), edge=edge)[0]
        left = trapezoid_energy_j(t, p, np.array([t[0]]), np.array([mid]), edge=edge)[0]
        right = trapezoid_energy_j(t, p, np.array([mid]), np.array([t[-1]]), edge=edge)[0]
        assert whole == pytest.approx(left + right, rel=1e-12)
        assert whole == pytest.approx(np.trapezoid(p, t / NS), rel=1e-12)


def test_counter_energy_inner_edges_and_steps():
    rng = np.random.default_rng(3)
    t = (np.cumsum(rng.integers(80_000_000, 120_000_000, 300)) + NS).astype(np.int64)
    p = rng.uniform(2, 9, len(t))
    # A counter that is the exact trapezoid integral: on sample-aligned windows both agree.
    e = np.concatenate([[0.0], np.cumsum(0.5 * (p[1:] + p[:-1]) * np.diff(t) / NS)])
    a, b = t[5:200:7], t[35:230:7]
    np.testing.assert_allclose(counter_energy_j(t, e, a, b, edge="step"),
                               trapezoid_energy_j(t, p, a, b), rtol=1e-12)
    a, b = a + 1_000_000, b - 2_000_000
    lin = counter_energy_j(t, e, a, b, edge="linear")
    np.testing.assert_allclose(lin, np.interp(b, t, e) - np.interp(a, t, e), rtol=1e-12)
    # A load stepping at the window edges, counted exactly: the step model recovers it.
    edges = np.array([t[99] + 30_000_000, t[159] + 50_000_000])  # steps between samples
    bp = np.concatenate([[t[0]], edges, [t[-1]]])
    lv = np.array([3.0, 8.0, 3.0])
    cum = np.concatenate([[0.0], np.cumsum(np.diff(bp) / NS * lv)])
    k = np.searchsorted(bp, t, side="right") - 1
    e_true = cum[np.minimum(k, 2)] + lv[np.minimum(k, 2)] * (t - bp[np.minimum(k, 2)]) / NS
    got = counter_energy_j(t, e_true, edges[:1], edges[1:], edge="step")[0]
    assert got == pytest.approx(8.0 * (edges[1] - edges[0]) / NS, rel=1e-12)


def test_intervals_merge_and_overlap():
    iv = Intervals.build([10, 5, 40, 12], [20, 11, 50, 15], ["a", "b", "c", "d"])
    assert list(iv.start_ns) == [5, 40] and list(iv.end_ns) == [20, 50]
    assert iv.reason[0] == "b; a; d"
    hit = iv.overlapping(np.array([0, 0, 20, 21, 45, 50]), np.array([5, 6, 30, 39, 46, 60]))
    # open intervals: touching at an end point is not an overlap
    assert list(hit) == [-1, 0, -1, -1, 1, -1]


def _series(t, p, e=None, invalid=None, seg=None) -> ChannelSeries:
    return ChannelSeries(0, np.asarray(t, np.int64), np.asarray(p, float),
                         None if e is None else np.asarray(e, float),
                         seg_start_idx=np.asarray(seg if seg is not None else [0], np.int64),
                         invalid=invalid or Intervals())


def test_window_energy_reasons():
    t = np.arange(0, 100, dtype=np.int64) * 100_000_000  # 10 Hz, 0 .. 9.9 s
    p = np.full(len(t), 5.0)
    e = np.concatenate([np.cumsum(np.full(50, 0.5)) - 0.5, np.cumsum(np.full(50, 0.5)) - 0.5])
    bad = Intervals.build([4_000_000_000], [4_200_000_000], ["bus_error event"])
    s = _series(t, p, e, bad, seg=[0, 50])
    t0 = np.array([1 * NS, 3_950_000_000, 6 * NS, -NS, 2 * NS, 4_800_000_000])
    t1 = np.array([2 * NS, 4_050_000_000, 6_150_000_000, NS, 2_050_000_000, 5_200_000_000])
    r = window_energy(s, t0, t1)
    assert r.energy_j[0] == pytest.approx(5.0)
    assert r.energy_counter_j[0] == pytest.approx(5.0)
    assert r.code[1] == INVALID_DATA and "bus_error" in r.reason[1]
    assert np.isnan(r.energy_j[1])
    assert r.code[2] == 0 and r.n_samples[2] == 2  # samples at 6.0 and 6.1 s: enough
    assert r.energy_j[2] == pytest.approx(0.75)
    assert r.code[3] == OUTSIDE and "outside" in r.reason[3]
    assert r.code[4] == FEW_SAMPLES and r.n_samples[4] == 1  # one sample (2.0): null, not 0
    assert np.isnan(r.energy_j[4]) and "fewer than 2" in r.reason[4]
    # window 5 crosses a segment boundary: power fine, counter refused with a reason
    assert r.energy_j[5] == pytest.approx(2.0)
    assert np.isnan(r.energy_counter_j[5]) and "segment" in r.counter_reason[5]


def test_clock_map_offsets_and_drift():
    sync = [{"t_local_mono_ns": 1_000 * NS, "offset_ns": 5 * NS, "uncertainty_ns": 1000,
             "when": "start"},
            {"t_local_mono_ns": 1_100 * NS, "offset_ns": 5 * NS + 10_000, "uncertainty_ns": 3000,
             "when": "end"}]
    cm = ClockMap.from_run(sync, "host", "meter")
    assert cm.basis == "clock_sync" and cm.uncertainty_ns == 3000
    assert cm.drift_ppm == pytest.approx(0.1)
    got = cm.to_meter(np.array([1_000 * NS, 1_050 * NS, 1_100 * NS, 1_200 * NS]))
    assert list(got) == [1_005 * NS, 1_055 * NS + 5_000, 1_105 * NS + 10_000,
                         1_205 * NS + 10_000]


def test_clock_map_same_host_and_flagged():
    same = ClockMap.from_run([], "boot-a", "boot-a")
    assert same.basis == "same_host" and "same host" in same.note
    assert list(same.to_meter(np.array([42]))) == [42]
    none = ClockMap.from_run([{"t_local_mono_ns": 1, "offset_ns": None}], "a", "b")
    assert none.basis == "none" and not none.usable
    with pytest.raises(ValueError, match="no usable clock offset"):
        none.to_meter(np.array([1]))
    one = ClockMap.from_run([{"t_local_mono_ns": 10, "offset_ns": -7, "uncertainty_ns": 1}],
                            None, None)
    assert "drift not corrected" in one.note and list(one.to_meter(np.array([20]))) == [13]
