"""Benchmark the aligner: 10^8 samples (4 channels) against 10^6 token windows.

Prints, measured side by side in one run:
* the aligner's time (window_energy on every channel: trapezoid + counter energy,
  sample counts and reasons for all windows) as a ratio to one numpy pass over the same samples
  (np.cumsum of every channel's power: one read and one write of each sample, the least any
  exact integration must do; a read-only np.sum is printed too);
* the speed-up over a per-window Python loop (searchsorted + np.trapezoid per window, the
  obvious implementation), timed on a subset of windows and scaled to all of them;
* peak memory (tracemalloc: numpy's allocations) as a multiple of the input size.

Times are the best of several runs in process CPU time (all of it single-threaded).

`--samples` and `--windows` scale it down for a quick run; the defaults are the issue's size.
"""

from __future__ import annotations

import argparse
import gc
import time
import tracemalloc

import numpy as np

from host.analysis.align import ChannelSeries, window_energy

NS = 1_000_000_000


def make_channel(n: int, rng: np.random.Generator, t_start: int) -> ChannelSeries:
    """A 10 Hz channel with jitter, power between 2 and 9 W, and its cumulative counter."""
    t = np.empty(n, dtype=np.int64)
    t[0] = t_start
    np.cumsum(rng.integers(90_000_000, 110_000_000, n - 1), out=t[1:])
    t[1:] += t_start
    p = rng.uniform(2.0, 9.0, n)
    e = np.empty(n)
    e[0] = 0.0
    np.cumsum(p[1:] * 0.1, out=e[1:])
    return ChannelSeries(0, t, p, e)


def make_windows(t_lo: int, t_hi: int, n: int, rng: np.random.Generator
                 ) -> tuple[np.ndarray, np.ndarray]:
    """n adjacent token windows over the traced span (one per generated token)."""
    edges = np.sort(rng.integers(t_lo, t_hi, n + 1))
    return edges[:-1].copy(), edges[1:].copy()


def loop_baseline(s: ChannelSeries, t0: np.ndarray, t1: np.ndarray) -> np.ndarray:
    """The per-window loop this module replaces (same edge model: hold the inside samples)."""
    out = np.full(len(t0), np.nan)
    t, p, e = s.t_mono_ns, s.power_w, s.energy_j
    for i in range(len(t0)):  # the baseline: one Python iteration per window
        j = np.searchsorted(t, t0[i], side="left")
        m = np.searchsorted(t, t1[i], side="right") - 1
        if m - j + 1 < 2:
            continue
        xs = np.concatenate([[t0[i]], t[j:m + 1], [t1[i]]]).astype(np.float64)
        ys = np.concatenate([[p[j]], p[j:m + 1], [p[m]]])
        out[i] = np.trapezoid(ys, xs) / NS
        _ = e[m] - e[j]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=float, default=1e8, help="total samples (all channels)")
    ap.add_argument("--channels", type=int, default=4)
    ap.add_argument("--windows", type=float, default=1e6, help="token windows")
    ap.add_argument("--loop-windows", type=int, default=2000,
                    help="windows per channel timed with the per-window loop (then scaled)")
    ap.add_argument("--repeat", type=int, default=3, help="timing repeats (best is kept)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    n_total, n_win = int(args.samples), int(args.windows)
    n_ch = args.channels
    rng = np.random.default_rng(args.seed)
    per = n_total // n_ch
    chans = [make_channel(per, rng, 1_000 * NS) for _ in range(n_ch)]
    t_lo = max(int(c.t_mono_ns[0]) for c in chans)
    t_hi = min(int(c.t_mono_ns[-1]) for c in chans)
    t0, t1 = make_windows(t_lo, t_hi, n_win, rng)
    input_bytes = sum(c.t_mono_ns.nbytes + c.power_w.nbytes + c.energy_j.nbytes for c in chans)
    input_bytes += t0.nbytes + t1.nbytes
    print(f"input: {per * n_ch:,} samples ({n_ch} channels × {per:,}), {n_win:,} windows, "
          f"{input_bytes / 2**30:.2f} GiB")

    def best(fn, repeat: int) -> float:
        """Best CPU time of this process (the machine may be shared; everything here is
        single-threaded, so CPU time is the time the work takes)."""
        times = []
        for _ in range(repeat):
            gc.collect()
            t = time.process_time()
            fn()
            times.append(time.process_time() - t)
        return min(times)

    t_sum = best(lambda: [np.sum(c.power_w) for c in chans], args.repeat)
    t_cumsum = best(lambda: [np.cumsum(c.power_w) for c in chans], args.repeat)
    results = {}

    def ours() -> None:
        results["r"] = [window_energy(c, t0, t1) for c in chans]

    t_ours = best(ours, args.repeat)
    k = min(args.loop_windows, n_win)
    pick = np.sort(rng.choice(n_win, k, replace=False))
    t_loop_k = best(lambda: [loop_baseline(c, t0[pick], t1[pick]) for c in chans], 2)
    t_loop = t_loop_k * n_win / k
    # correctness: the loop and the vectorised aligner agree on the subset
    ref = loop_baseline(chans[0], t0[pick], t1[pick])
    got = results["r"][0].energy_j[pick]
    both = ~np.isnan(ref)
    assert np.array_equal(np.isnan(got), ~both), "null windows disagree"
    max_rel = float(np.max(np.abs(got[both] / ref[both] - 1))) if both.any() else 0.0
    del results["r"]
    gc.collect()
    tracemalloc.start()
    tracemalloc.reset_peak()
    base, _ = tracemalloc.get_traced_memory()
    _keep = [window_energy(c, t0, t1) for c in chans]
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    out_bytes = sum(r.energy_j.nbytes * 3 + r.reason.nbytes * 2 + r.code.nbytes for r in _keep)
    del _keep
    work = peak - base
    print(f"aligner ({n_ch} channels, all windows): {t_ours:.3f} s CPU")
    print(f"one numpy pass, np.cumsum(power_w): {t_cumsum:.3f} s  -> ratio ours/pass = "
          f"{t_ours / t_cumsum:.2f}  (goal ≤ 3)")
    print(f"one numpy pass, np.sum(power_w):    {t_sum:.3f} s  -> ratio ours/pass = "
          f"{t_ours / t_sum:.2f}  (read-only pass, for reference)")
    print(f"per-window loop: {t_loop_k:.3f} s for {k:,} windows × {n_ch} channels, scaled to "
          f"{n_win:,}: {t_loop:.1f} s  -> ours is {t_loop / t_ours:.0f}× faster  (goal ≥ 50×)")
    print(f"agreement with the loop on {int(both.sum())} windows: max relative difference "
          f"{max_rel:.2e}")
    print(f"peak memory: input {input_bytes / 2**30:.2f} GiB + aligner working set "
          f"{work / 2**30:.3f} GiB (of which results {out_bytes / 2**30:.3f} GiB) = "
          f"{(input_bytes + work) / input_bytes:.3f} × input")


if __name__ == "__main__":
    main()
