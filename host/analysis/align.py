"""The aligner: token-log times into the meter clock, and exact energy over many windows at once.

Two jobs, both pure numpy so notebooks and the benchmark can call them without pandas:

* `ClockMap` maps inference-host monotonic times to meter monotonic times with the offsets the
  token log recorded (`offset_ns = meter − local`), interpolating drift linearly between sync
  points. Runs without a usable offset are flagged (`basis == "none"`), never assumed zero; the
  one exception is a run whose host shares the meter's boot id (same machine, one monotonic
  clock), which is labelled `basis == "same_host"`.
* `window_energy` gives a channel's energy over any number of windows at once, two ways: the
  trapezoid of the power readings, and the difference of the cumulative `energy_j` counter
  (where the window lies within one segment), each with the two edge pieces under an edge model
  (`step`: the load changes at the window edge; `linear`: it ramps through it) and never
  extrapolated beyond the trace. Windows crossing an invalid interval (fault, gap, bad status)
  or holding fewer than 2 samples get NaN with a reason.

How it stays fast (docs/analysis.md, bench/bench_align.py): window edges are found with one
searchsorted per edge (adjacent token windows share theirs); the running integral is built in
one pass over the samples, chunk by chunk (a Python loop over ~64 K-sample chunks, never over
samples or windows), so temporaries stay in cache and no full-length cumulative array is
allocated — np.add.reduceat sums each chunk between the wanted indices only; the edge pieces
are computed for blocks of ~32 K windows so that neighbouring samples are gathered from cache.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from host.analysis.vocabulary import ClockBasis, EdgeModel

NS_PER_S = 1_000_000_000
INT64_MIN = np.iinfo(np.int64).min
INT64_MAX = np.iinfo(np.int64).max
DEFAULT_CHUNK = 1 << 16


# --------------------------------------------------------------------------- invalid intervals
@dataclass(frozen=True)
class Intervals:
    """Open time intervals (start_ns, end_ns) with no valid data, each with a reason.

    A window [t0, t1] is invalid when it overlaps any interval: t0 < end and t1 > start.
    """

    start_ns: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    end_ns: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    reason: np.ndarray = field(default_factory=lambda: np.empty(0, object))

    def __len__(self) -> int:
        return len(self.start_ns)

    @staticmethod
    def build(
        start_ns: Sequence[int] | np.ndarray,
        end_ns: Sequence[int] | np.ndarray,
        reason: Sequence[str] | np.ndarray,
    ) -> Intervals:
        """Sort and merge overlapping intervals (vectorised); merged reasons are joined."""
        start = np.asarray(start_ns, dtype=np.int64)
        end = np.asarray(end_ns, dtype=np.int64)
        why = np.asarray(reason, dtype=object)
        if len(start) == 0:
            return Intervals()
        order = np.argsort(start, kind="stable")
        start, end, why = start[order], end[order], why[order]
        run_end = np.maximum.accumulate(end)
        new_group = np.ones(len(start), dtype=bool)
        new_group[1:] = start[1:] >= run_end[:-1]
        first = np.flatnonzero(new_group)
        last = np.append(first[1:], len(start)) - 1
        reasons = np.empty(len(first), dtype=object)
        for g, (lo, hi) in enumerate(zip(first, last + 1, strict=True)):  # per merged interval
            uniq = list(dict.fromkeys(why[lo:hi]))
            reasons[g] = "; ".join(uniq[:3]) + (f"; +{len(uniq) - 3} more" if len(uniq) > 3 else "")
        return Intervals(start[first], run_end[last], reasons)

    def union(self, other: Intervals) -> Intervals:
        return Intervals.build(
            np.concatenate([self.start_ns, other.start_ns]),
            np.concatenate([self.end_ns, other.end_ns]),
            np.concatenate([self.reason, other.reason]),
        )

    def overlapping(self, t0_ns: np.ndarray, t1_ns: np.ndarray) -> np.ndarray:
        """Index of an interval each window overlaps, or −1 (intervals must be merged)."""
        out = np.full(len(t0_ns), -1, dtype=np.int64)
        if len(self) == 0:
            return out
        # First interval whose end is after t0; overlap iff it also starts before t1.
        idx = np.searchsorted(self.end_ns, t0_ns, side="right")
        inside = idx < len(self)
        hit = inside.copy()
        hit[inside] = self.start_ns[idx[inside]] < t1_ns[inside]
        out[hit] = idx[hit]
        return out


# --------------------------------------------------------------------------- channel series
@dataclass(frozen=True)
class ChannelSeries:
    """One channel's readings in one meter clock domain, joined over segments.

    `t_mono_ns` strictly increasing; `energy_j` cumulative since its segment's start;
    `seg_start_idx[i]` is the first sample index of the i-th segment present; `invalid` holds
    intervals where power (and counter) data are not valid, `counter_invalid` those where only the
    counter is not (e.g. the chip's energy metering was frozen by a CalErr status).
    """

    channel: int
    t_mono_ns: np.ndarray
    power_w: np.ndarray
    energy_j: np.ndarray | None = None
    seg_start_idx: np.ndarray = field(default_factory=lambda: np.zeros(1, np.int64))
    invalid: Intervals = field(default_factory=Intervals)
    counter_invalid: Intervals = field(default_factory=Intervals)
    counter_resolution_j: float = float("nan")
    # Why the series is empty when the channel itself is at fault (a dead channel), so that its
    # windows are reported as invalid data, not as "outside the trace"; None otherwise.
    dead_reason: str | None = None


# --------------------------------------------------------------------------- energy
@dataclass
class _Plan:
    """One index list's share of the chunked running-integral pass."""

    order: np.ndarray | None  # sorting permutation (None: already sorted)
    body: np.ndarray  # wanted indices before the last sample
    offs: np.ndarray  # reduceat offsets, per chunk
    gstart: np.ndarray  # where each chunk's group of offsets starts
    gbound: np.ndarray  # group bounds (gstart + the end)
    sums: np.ndarray  # the running sums
    zero: np.ndarray  # partial sums reduceat repeats (zeroed)
    carry: float = 0.0  # the running sum at the end of the last chunk


def _running_integral_at(
    t_ns: np.ndarray, power_w: np.ndarray, idx_lists: Sequence[np.ndarray], chunk: int
) -> list[np.ndarray]:
    """2·∫P dt (W·ns) from t[base] to t[idx] for every index of every array, in one chunked
    pass; `base` is the smallest index wanted (callers take differences only, so the pass
    covers just the samples between the first and last wanted index: a run's windows in a
    study's trace of 10 M samples per channel touch a few thousand of them).

    Per chunk of samples: the trapezoid terms (in cache), then np.add.reduceat sums them
    between consecutive wanted indices (SIMD pairwise sums; numpy's cumsum goes one element at
    a time and is several times slower per sample). One cumulative sum over those partial sums,
    all chunks together, gives the running integral at every wanted index. The factor 0.5e-9
    (trapezoid ½, ns → s) is applied by the caller.
    """
    outs = [np.zeros(len(ix), dtype=np.float64) for ix in idx_lists]
    wanted = [ix for ix in idx_lists if len(ix)]
    if not wanted:
        return outs
    base = min(int(ix.min()) for ix in wanted)
    top = max(int(ix.max()) for ix in wanted)
    if base > 0 or top < len(t_ns) - 1:
        t_ns, power_w = t_ns[base:top + 1], power_w[base:top + 1]
        idx_lists = [ix - base for ix in idx_lists]
    n = len(t_ns)
    if n < 2:
        return outs
    starts = np.arange(0, n - 1, chunk, dtype=np.int64)
    n_chunks = len(starts)
    plans: list[_Plan] = []
    for ix in idx_lists:
        order = None if len(ix) < 2 or bool(np.all(ix[1:] >= ix[:-1])) else np.argsort(
            ix, kind="stable")
        ks = ix if order is None else ix[order]
        body = ks < n - 1  # index n − 1 (the last sample) is the grand total
        kb = ks[body]
        bounds = np.searchsorted(kb, starts, side="left")
        # Every chunk's group of reduceat indices starts with 0 (the chunk's first term).
        offs = np.insert(kb - (kb // chunk) * chunk, bounds, 0)
        gstart = bounds + np.arange(n_chunks)
        gbound = np.append(gstart, len(offs))
        # reduceat gives seg[i] (not 0) for a repeated index: those partial sums are zeroed.
        zero = np.zeros(len(offs), dtype=bool)
        zero[:-1] = offs[1:] == offs[:-1]
        zero[gstart[1:] - 1] = False
        plans.append(_Plan(order, body, offs, gstart, gbound, np.empty(len(offs), np.float64),
                           zero))
    buf = np.empty(chunk, dtype=np.float64)
    dbuf = np.empty(chunk, dtype=np.int64)
    for ci, s in enumerate(starts):  # loop over chunks of samples, not samples or windows
        e = min(int(s) + chunk, n - 1)
        m = e - int(s)
        seg = buf[:m]
        np.add(power_w[s + 1 : e + 1], power_w[s:e], out=seg)
        np.subtract(t_ns[s + 1 : e + 1], t_ns[s:e], out=dbuf[:m])
        np.multiply(seg, dbuf[:m], out=seg)
        for plan in plans:
            lo, hi = plan.gbound[ci], plan.gbound[ci + 1]
            part = plan.sums[lo:hi]
            np.add.reduceat(seg, plan.offs[lo:hi], out=part)
            np.copyto(part, 0.0, where=plan.zero[lo:hi])
            # Running sums restart per chunk (short, pairwise-summed pieces: little rounding).
            np.cumsum(part, out=part)
            part += plan.carry
            plan.carry = float(part[-1])
    for out, p in zip(outs, plans, strict=True):
        order, body, offs, gstart, csum = p.order, p.body, p.offs, p.gstart, p.sums
        keep = np.ones(len(offs), dtype=bool)
        keep[gstart] = False
        vals = np.empty(len(body), dtype=np.float64)
        vals[body] = csum[np.flatnonzero(keep) - 1]
        vals[~body] = csum[-1]
        if order is None:
            out[:] = vals
        else:
            out[order] = vals
    return outs


def searchsorted_blocked(t_ns: np.ndarray, x: np.ndarray, side: Literal["left", "right"],
                         block: int = 4096) -> np.ndarray:
    """np.searchsorted(t_ns, x, side), about twice as fast for many keys into a long array.

    Each block of keys is searched within the slice of t its smallest and largest key bound,
    which stays in cache (plain searchsorted walks ~log2(n) cache lines per key).
    """
    nx = len(x)
    if nx < 4 * block or len(t_ns) < 16 * block:
        return np.searchsorted(t_ns, x, side=side)
    starts = np.arange(0, nx, block)
    lo = np.searchsorted(t_ns, np.minimum.reduceat(x, starts), side=side)
    hi = np.searchsorted(t_ns, np.maximum.reduceat(x, starts), side=side)
    out = np.empty(nx, dtype=np.int64)
    for i, s in enumerate(starts):  # blocks of keys, not single keys
        e = min(int(s) + block, nx)
        np.add(np.searchsorted(t_ns[lo[i]:hi[i]], x[s:e], side=side), lo[i], out=out[s:e])
    return out


EDGE_MODELS = ("step", "linear")


def _inside(t_ns: np.ndarray, t0: np.ndarray, t1: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(j, m): first sample index ≥ t0 and last ≤ t1; m − j + 1 samples lie in the window.

    Adjacent windows (each starting where the previous ended, as token windows do) share
    their edges, so those are searched once.
    """
    n = len(t_ns)
    if len(t0) > 1 and n and np.array_equal(t0[1:], t1[:-1]):
        left = searchsorted_blocked(t_ns, np.concatenate([t0[:1], t1]), "left")
        end = left[1:]
        on_sample = t_ns[np.minimum(end, n - 1)] == t1
        on_sample &= end < n
        return left[:-1], end + on_sample - 1
    return searchsorted_blocked(t_ns, t0, "left"), searchsorted_blocked(t_ns, t1, "right") - 1


def _usable(t_ns: np.ndarray, t0: np.ndarray, t1: np.ndarray, j: np.ndarray,
            m: np.ndarray) -> np.ndarray:
    """Windows inside the trace (no extrapolation) with at least one sample in them."""
    return (t0 >= t_ns[0]) & (t1 <= t_ns[-1]) & (t1 >= t0) & (m >= j)


def _check_edge(edge: str) -> None:
    if edge not in EDGE_MODELS:
        raise ValueError(f"edge model must be one of {EDGE_MODELS}, not {edge!r}")


def _pairs(x: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(x[rows], x[rows + 1]) with rows clipped to [0, n − 2] (two plain gathers: numpy's take
    is faster than one gather of pairs through a strided view)."""
    r = np.clip(rows, 0, max(len(x) - 2, 0))
    return np.take(x, r), np.take(x, np.minimum(r + 1, len(x) - 1))


WINDOW_BLOCK = 1 << 15


def _energies(t_ns: np.ndarray, power_w: np.ndarray, energy_j: np.ndarray | None,
              a: np.ndarray, b: np.ndarray, j: np.ndarray, m: np.ndarray, edge: str,
              chunk: int, *, trapezoid: bool = True) -> tuple[np.ndarray | None,
                                                              np.ndarray | None]:
    """(trapezoid J, counter J) of usable windows (m ≥ j) from their inside ranges j..m.

    The running integral comes from one chunked pass over the samples; the edge pieces are
    then computed for blocks of windows (a loop over blocks of ~32 K windows, not windows),
    so neighbouring samples gathered for the same window are still in cache. Edge pieces:
    step — the window's own nearest sample (trapezoid) or its first/last interval's counter
    rate (counter) held out to the edge, exact for a load that changes at the edge; linear —
    power, or the counter, interpolated across the edge, exact for a load that ramps through it.
    """
    k = len(j)
    energy = np.empty(k) if trapezoid else None
    counter = np.empty(k) if energy_j is not None else None
    chain = None
    if trapezoid:
        # Adjacent windows (token after token) share an edge: the running integral at a
        # window's first sample follows from the previous window's last one, so only those
        # not chained need a lookup (half the lookups for token windows).
        if k > 1 and bool(np.all(b[:-1] <= a[1:])):
            need = np.ones(k, dtype=bool)
            need[1:] = a[1:] != b[:-1]
            if not need.all():
                chain = need
        if chain is None:
            cum_j, cum_m = _running_integral_at(t_ns, power_w, [j, m], chunk)
        else:
            inter = np.empty(2 * k, dtype=np.int64)
            inter[0::2], inter[1::2] = j, m
            sel = np.ones(2 * k, dtype=bool)
            sel[0::2] = chain
            cum = np.empty(2 * k)
            cum[sel] = _running_integral_at(t_ns, power_w, [inter[sel]], chunk)[0]
            cum_j, cum_m = cum[0::2], cum[1::2]
        assert energy is not None  # made above when trapezoid
        energy[:] = cum_m
    for s in range(0, k, WINDOW_BLOCK):  # blocks of windows
        sl = slice(s, min(s + WINDOW_BLOCK, k))
        link = None
        if chain is not None:
            p = max(s - 1, 0)
            link = (chain[sl], cum_j[sl], cum_m[max(s - 1, 0):sl.stop - 1],
                    np.take(power_w, m[p]), np.take(t_ns, m[p]), m[p])
        _edges_block(t_ns, power_w, energy_j, a[sl], b[sl], j[sl], m[sl], edge,
                     None if energy is None else energy[sl],
                     None if counter is None else counter[sl], link,
                     None if chain is not None or energy is None else cum_j[sl])
    if energy is not None:
        energy /= NS_PER_S
    return energy, counter


def _edges_block(t_ns: np.ndarray, power_w: np.ndarray, energy_j: np.ndarray | None,
                 a: np.ndarray, b: np.ndarray, j: np.ndarray, m: np.ndarray, edge: str,
                 energy: np.ndarray | None, counter: np.ndarray | None,
                 link: tuple | None, cum_j: np.ndarray | None) -> None:
    """Finish `energy` (holds 2·∫ to each window's last sample, W·ns; made 2·∫ over the window
    plus edge pieces, still W·ns) and fill `counter` (J) for one block of windows.

    `cum_j` is the running integral at each window's first sample; with `link` (chained
    adjacent windows) it is completed here from the previous window's last sample.
    """
    n = len(t_ns)
    one = m == j  # a single sample inside: no interval of its own
    if edge == EdgeModel.STEP:
        tj, tj1 = _pairs(t_ns, j)
        tm1, tm = _pairs(t_ns, m - 1)
        tm = np.where(one, tj, tm)
        tj1 = np.where(one, tj, tj1)
    else:
        tjp, tj = _pairs(t_ns, j - 1)
        tm, tmn = _pairs(t_ns, m)
        tj = np.where(j == 0, t_ns[0], tj)
        tm = np.where(m == n - 1, t_ns[-1], tm)
    dl = (tj - a).astype(np.float64)  # ns from the window start to its first sample
    dr = (b - tm).astype(np.float64)  # ns from its last sample to the window end
    pj = np.take(power_w, j)
    pm = np.take(power_w, m)
    if edge == EdgeModel.LINEAR:
        span_l = (tj - tjp).astype(np.float64)
        span_r = (tmn - tm).astype(np.float64)
        fl = np.divide(dl, span_l, out=np.zeros(len(j)), where=span_l > 0)
        fr = np.divide(dr, span_r, out=np.zeros(len(m)), where=span_r > 0)
    if energy is not None:
        if link is not None:
            need, cj, cm_prev, pm_first, tm_first, m_first = link
            # previous window's last sample: its power, time and index, for every window
            pm_prev = np.concatenate([[pm_first], pm[:-1]])
            tm_prev = np.concatenate([[tm_first], tm[:-1]])
            m_prev = np.concatenate([[m_first], m[:-1]])
            chained = ~need
            step = (pm_prev + pj) * (tj - tm_prev).astype(np.float64)
            step[j == m_prev] = 0.0  # the shared edge sits on a sample
            if len(cm_prev) < len(j):  # the very first window is never chained
                cm_prev = np.concatenate([[0.0], cm_prev])
            cj[chained] = cm_prev[chained] + step[chained]
            cum_j = cj
        energy -= cum_j
        energy *= 0.5
        if edge == EdgeModel.STEP:
            energy += pj * dl
            energy += pm * dr
        else:
            pjp = np.take(power_w, np.maximum(j - 1, 0))
            pmn = np.take(power_w, np.minimum(m + 1, n - 1))
            energy += 0.5 * (2.0 * pj + (pjp - pj) * fl) * dl
            energy += 0.5 * (2.0 * pm + (pmn - pm) * fr) * dr
    if counter is None or energy_j is None:
        return
    if edge == EdgeModel.STEP:
        ej, ej1 = _pairs(energy_j, j)
        em1, em = _pairs(energy_j, m - 1)
        em = np.where(one, ej, em)
        with np.errstate(divide="ignore", invalid="ignore"):
            rate_l = (ej1 - ej) / (tj1 - tj)
            rate_r = (em - em1) / (tm - tm1)
        if one.any():  # one sample inside: hold its power reading instead
            rate_l[one] = pj[one] / NS_PER_S
            rate_r[one] = pm[one] / NS_PER_S
        np.subtract(em, ej, out=counter)
        counter += rate_l * dl
        counter += rate_r * dr
        return
    ejp, ej = _pairs(energy_j, j - 1)
    em, emn = _pairs(energy_j, m)
    ej = np.where(j == 0, energy_j[0], ej)
    em = np.where(m == n - 1, energy_j[-1], em)
    counter[:] = em - ej + (ej - ejp) * fl + (emn - em) * fr


def _prepare(t_ns: np.ndarray, t0_ns: np.ndarray, t1_ns: np.ndarray
             ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    t0 = np.asarray(t0_ns, dtype=np.int64)
    t1 = np.asarray(t1_ns, dtype=np.int64)
    j, m = _inside(t_ns, t0, t1)
    return t0, t1, j, m, _usable(t_ns, t0, t1, j, m)


def trapezoid_energy_j(
    t_ns: np.ndarray,
    power_w: np.ndarray,
    t0_ns: np.ndarray,
    t1_ns: np.ndarray,
    *,
    edge: str = "step",
    chunk: int = DEFAULT_CHUNK,
) -> np.ndarray:
    """Integral (J) of the sampled power over each window [t0, t1].

    Trapezoid between the samples inside the window, plus the two edge pieces under the edge
    model (see `_energies`). Windows reaching outside [t[0], t[-1]] (no extrapolation) or with
    no sample inside get NaN. Vectorised: one chunked pass over the samples, then searchsorted
    and gathers over the window edges.
    """
    _check_edge(edge)
    out = np.full(len(t0_ns), np.nan)
    if len(t_ns) == 0 or len(t0_ns) == 0:
        return out
    t0, t1, j, m, ok = _prepare(t_ns, t0_ns, t1_ns)
    out[ok] = _energies(t_ns, power_w, None, t0[ok], t1[ok], j[ok], m[ok], edge, chunk)[0]
    return out


def counter_energy_j(
    t_ns: np.ndarray,
    energy_j: np.ndarray,
    t0_ns: np.ndarray,
    t1_ns: np.ndarray,
    *,
    power_w: np.ndarray | None = None,
    edge: str = "step",
) -> np.ndarray:
    """Energy (J) from the cumulative counter over each window (NaN outside the trace).

    The counter difference between the first and last sample inside the window, plus the edge
    pieces: with edge="step" the counter's mean power over the first/last sample interval inside
    the window held out to the edge (with one sample inside, the held `power_w` reading, NaN
    without it), with edge="linear" the counter interpolated linearly at the edges.
    """
    _check_edge(edge)
    out = np.full(len(t0_ns), np.nan)
    if len(t_ns) == 0 or len(t0_ns) == 0:
        return out
    t0, t1, j, m, ok = _prepare(t_ns, t0_ns, t1_ns)
    p = power_w if power_w is not None else np.full(len(t_ns), np.nan)
    out[ok] = _energies(t_ns, p, energy_j, t0[ok], t1[ok], j[ok], m[ok], edge, DEFAULT_CHUNK,
                        trapezoid=False)[1]
    return out


# Why a window's energy is null (the first cause found wins).
OK, BAD_WINDOW, OUTSIDE, INVALID_DATA, FEW_SAMPLES = 0, 1, 2, 3, 4
REASON_CODES = {OK: "ok", BAD_WINDOW: "bad_window", OUTSIDE: "outside_trace",
                INVALID_DATA: "fault_or_gap", FEW_SAMPLES: "few_samples"}
# Counter-only causes (the power figure may still be fine).
C_SEGMENTS, C_INVALID, C_MISSING, C_NONE = 10, 11, 12, 13


@dataclass(frozen=True)
class WindowEnergy:
    """Per-window results of one channel (arrays aligned with the windows given).

    `energy_j` is the trapezoid figure (the primary one); `energy_counter_j` the counter-based one
    (NaN where the counter does not cover the window); `reason` / `counter_reason` say why a value
    is NaN ("" when it is not) and `code` classifies `reason` (see REASON_CODES); `edge` is the
    edge model used.
    """

    energy_j: np.ndarray
    energy_counter_j: np.ndarray
    n_samples: np.ndarray
    reason: np.ndarray
    counter_reason: np.ndarray
    code: np.ndarray
    edge: str = "step"

    @property
    def counter_minus_trapezoid_j(self) -> np.ndarray:
        return self.energy_counter_j - self.energy_j


def _flag(code: np.ndarray, mask: np.ndarray, value: int) -> None:
    """Set `code` where mask is set and no earlier cause was recorded (first cause wins)."""
    code[mask & (code == 0)] = value


def _flag_intervals(iv: Intervals, t0: np.ndarray, t1: np.ndarray, code: np.ndarray,
                    value: int) -> np.ndarray:
    """Flag windows overlapping an interval; returns the interval index per window (−1)."""
    if not len(iv):
        return np.full(len(t0), -1, dtype=np.int64)
    hit = iv.overlapping(t0, t1)
    _flag(code, hit >= 0, value)
    return hit


def _texts(code: np.ndarray, fixed: dict[int, str], hit: dict[int, tuple[np.ndarray, Intervals]]
           ) -> np.ndarray:
    """Reason strings from codes, built only for the flagged windows."""
    out = np.full(len(code), "", dtype=object)
    flagged = code != 0
    if not flagged.any():
        return out
    for value in np.unique(code[flagged]):
        sel = code == value
        if int(value) in hit:
            idx, iv = hit[int(value)]
            out[sel] = iv.reason[idx[sel]]
        else:
            out[sel] = fixed[int(value)]
    return out


def window_energy(
    series: ChannelSeries,
    t0_ns: np.ndarray,
    t1_ns: np.ndarray,
    *,
    edge: str = "step",
    min_samples: int = 2,
    chunk: int = DEFAULT_CHUNK,
) -> WindowEnergy:
    """Energy of one channel over every window [t0, t1] (meter clock), with reasons for NaNs."""
    _check_edge(edge)
    t = series.t_mono_ns
    n_win = len(t0_ns)
    if len(t) == 0:
        why = series.dead_reason or f"channel {series.channel}: no samples"
        reason = np.full(n_win, why, dtype=object)
        nan = np.full(n_win, np.nan)
        dead = INVALID_DATA if series.dead_reason else OUTSIDE
        return WindowEnergy(nan, nan.copy(), np.zeros(n_win, np.int64), reason, reason.copy(),
                            np.full(n_win, dead, dtype=np.int8), edge)
    t0, t1, j, m, _ = _prepare(t, t0_ns, t1_ns)
    n_samples = np.maximum(m - j + 1, 0)
    code = np.zeros(n_win, dtype=np.int8)
    _flag(code, t1 < t0, BAD_WINDOW)
    _flag(code, (t0 < t[0]) | (t1 > t[-1]), OUTSIDE)
    hit = _flag_intervals(series.invalid, t0, t1, code, INVALID_DATA)
    _flag(code, n_samples < min_samples, FEW_SAMPLES)
    good = code == 0  # implies usable
    every = bool(good.all())
    a, b, jg, mg = (t0, t1, j, m) if every else (t0[good], t1[good], j[good], m[good])
    e_good, c_good = _energies(t, series.power_w, series.energy_j, a, b, jg, mg, edge, chunk)
    assert e_good is not None  # trapezoid=True: always computed
    if every:
        energy = e_good
        counter = c_good if c_good is not None else np.full(n_win, np.nan)
    else:
        energy = np.full(n_win, np.nan)
        counter = np.full(n_win, np.nan)
        energy[good] = e_good
        if c_good is not None:
            counter[good] = c_good
    fixed = {BAD_WINDOW: "window ends before it starts",
             OUTSIDE: "window reaches outside the trace (no extrapolation)",
             FEW_SAMPLES: f"fewer than {min_samples} samples in window (see n_samples)"}
    reason = _texts(code, fixed, {INVALID_DATA: (hit, series.invalid)})

    ccode = code.copy()
    if series.energy_j is None:
        _flag(ccode, np.ones(n_win, bool), C_NONE)
        chit = hit
    else:
        if len(series.seg_start_idx) > 1:
            last = len(t) - 1
            seg_j = np.searchsorted(series.seg_start_idx, np.clip(j, 0, last), "right")
            seg_m = np.searchsorted(series.seg_start_idx, np.clip(m, 0, last), "right")
            _flag(ccode, seg_j != seg_m, C_SEGMENTS)
        chit = _flag_intervals(series.counter_invalid, t0, t1, ccode, C_INVALID)
        _flag(ccode, np.isnan(counter), C_MISSING)
        if not every or ccode.any():
            counter[ccode != 0] = np.nan
    cfixed = {**fixed, C_SEGMENTS: "window spans more than one segment",
              C_MISSING: "energy_j missing", C_NONE: "no energy_j counter"}
    counter_reason = _texts(ccode, cfixed, {INVALID_DATA: (hit, series.invalid),
                                            C_INVALID: (chit, series.counter_invalid)})
    return WindowEnergy(energy, counter, n_samples.astype(np.int64), reason, counter_reason,
                        code, edge)


# --------------------------------------------------------------------------- clock mapping
@dataclass(frozen=True)
class ClockMap:
    """Local (inference host) monotonic ns → meter monotonic ns.

    basis: "clock_sync" (offsets measured by the run, drift interpolated linearly between sync
    points and held constant outside them), "same_host" (equal boot ids: one monotonic clock,
    offset exactly 0) or "none" (no usable offset: the run is flagged and not measured).
    """

    basis: ClockBasis
    sync_local_ns: np.ndarray
    sync_offset_ns: np.ndarray
    uncertainty_ns: float
    note: str

    @property
    def usable(self) -> bool:
        return self.basis != ClockBasis.NONE

    @property
    def drift_ppm(self) -> float:
        """Slope of the offset between the first and last sync points, ppm (NaN if < 2)."""
        if len(self.sync_local_ns) < 2:
            return float("nan")
        span = float(self.sync_local_ns[-1] - self.sync_local_ns[0])
        return float(self.sync_offset_ns[-1] - self.sync_offset_ns[0]) / span * 1e6

    def to_meter(self, t_local_ns: np.ndarray) -> np.ndarray:
        """Map local times to the meter clock (int64 ns); refuses when no offset is known."""
        t = np.asarray(t_local_ns, dtype=np.int64)
        if self.basis == ClockBasis.NONE:
            raise ValueError(f"no usable clock offset: {self.note}")
        if self.basis == ClockBasis.SAME_HOST:
            return t.copy()
        xs, os_ = self.sync_local_ns, self.sync_offset_ns
        if len(xs) == 1:
            return t + os_[0]
        k = np.clip(np.searchsorted(xs, t, side="right") - 1, 0, len(xs) - 2)
        span = (xs[k + 1] - xs[k]).astype(np.float64)
        frac = np.clip((t - xs[k]).astype(np.float64) / span, 0.0, 1.0)
        step = np.rint((os_[k + 1] - os_[k]).astype(np.float64) * frac).astype(np.int64)
        return t + os_[k] + step

    @staticmethod
    def from_run(
        clock_sync: Sequence[dict], run_boot_id: str | None, trace_boot_id: str | None,
        *, trace_clock_simulated: bool = False,
    ) -> ClockMap:
        """Build the map from run.json's `clock_sync` list and the two machines' boot ids.

        Measured offsets win when present; equal boot ids give the same-host exception (not
        for a trace written with a simulated clock: its times are not the machine's clock);
        otherwise the map is flagged unusable (never silently zero).
        """
        rows = []
        for entry in clock_sync:
            off, unc, t_loc = (entry.get(k) for k in ("offset_ns", "uncertainty_ns",
                                                       "t_local_mono_ns"))
            if off is None or t_loc is None:
                continue
            rows.append((int(t_loc), int(off), float(unc) if unc is not None else float("nan")))
        if rows:
            rows.sort()
            xs = np.array([r[0] for r in rows], dtype=np.int64)
            os_ = np.array([r[1] for r in rows], dtype=np.int64)
            unc = np.array([r[2] for r in rows])
            # Several syncs at one local time: keep their mean offset.
            ux, inv = np.unique(xs, return_inverse=True)
            if len(ux) < len(xs):
                sums = np.bincount(inv, weights=os_.astype(np.float64))
                os_ = np.rint(sums / np.bincount(inv)).astype(np.int64)
                xs = ux
            u = float(np.nanmax(unc)) if np.isfinite(unc).any() else float("nan")
            whens = ", ".join(str(e.get("when", "?")) for e in clock_sync
                              if e.get("offset_ns") is not None)
            note = f"measured offsets at {len(xs)} point(s) ({whens})"
            if len(xs) == 1:
                note += "; single sync point: drift not corrected"
            return ClockMap(ClockBasis.CLOCK_SYNC, xs, os_, u, note)
        if trace_clock_simulated:
            return ClockMap(
                ClockBasis.NONE, np.zeros(0, np.int64), np.zeros(0, np.int64), float("nan"),
                "run.json clock_sync has no usable offset, and the trace's clock is simulated "
                "(not the machine's monotonic clock, whatever the boot ids say)",
            )
        if run_boot_id and trace_boot_id and run_boot_id == trace_boot_id:
            return ClockMap(
                ClockBasis.SAME_HOST, np.zeros(0, np.int64), np.zeros(0, np.int64), 0.0,
                "same host (equal boot_id): token log and meter share one monotonic clock",
            )
        return ClockMap(
            ClockBasis.NONE, np.zeros(0, np.int64), np.zeros(0, np.int64), float("nan"),
            "run.json clock_sync has no usable offset and the boot ids differ",
        )
