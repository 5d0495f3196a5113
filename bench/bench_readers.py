"""Benchmark the one trace reader: stdlib parsing (epi.formats.trace) and the analysis's pandas
view (host.analysis.traces) against a bare `pandas.read_csv` of the same samples file.

`pandas.read_csv` (C parser, no checks) is the floor any reader of this CSV must approach; the
format reader also checks every field's type, range and finiteness and the per-channel time
order in pure Python, so the meter side needs no numpy or pandas. Printed side by side in one
run: rows per second of each, and the ratios to the floor (best of `--repeat` rounds in process
CPU time, all threads; the spread is the ratio of each round). The view's figure is its first
read of the trace (its columnar cache built, host/analysis/trace_cache.py); later reads (cache
read) and a read without the cache are printed beside it. Default size: 4 channels at 20 Hz
for one hour (288 000 rows), a typical energy study's trace.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import emit, machine_line  # bench/benchlib.py

from epi.formats.trace import read_trace as read_trace_stdlib
from host.analysis.trace_cache import CACHE_DIRNAME
from host.analysis.traces import read_trace as read_trace_view

HEADER = ("seq,channel,t_mono_ns,t_real_ns,power_w,voltage_v,current_a,power_factor,"
          "frequency_hz,energy_j,status")


def write_trace(root: Path, n_sweeps: int, n_channels: int, period_s: float) -> int:
    """A one-segment trace with realistic values; returns the number of sample rows."""
    rng = np.random.default_rng(0)
    meta = {"format": "epi-trace", "format_version": 1, "segment": 1, "boot_id": "b",
            "sample_period_s": period_s,
            "channels": [{"channel": c, "name": f"ch{c}", "node": f"n{c}",
                          "meter_constant_imp_per_kwh": 3200.0} for c in range(n_channels)]}
    (root / "seg-000001.meta.json").write_text(json.dumps(meta))
    t0 = 10**12
    lines = [HEADER]
    energy = [0.0] * n_channels
    p = rng.uniform(2.0, 9.0, (n_sweeps, n_channels)).tolist()
    for s in range(n_sweeps):
        for c in range(n_channels):
            t = t0 + s * int(period_s * 1e9) + c * 1000
            energy[c] += p[s][c] * period_s
            lines.append(f"{s},{c},{t},{t + 10**18},{p[s][c]!r},230.1,{p[s][c] / 230:.6f},"
                         f"0.98,50.0,{energy[c]!r},0")
    (root / "seg-000001.samples.csv").write_text("\n".join(lines) + "\n")
    (root / "seg-000001.events.csv").write_text("t_mono_ns,t_real_ns,channel,kind,detail\n")
    return n_sweeps * n_channels


def timed(fn, repeat: int) -> list[float]:
    """Process CPU time of each of `repeat` calls (the best is the figure)."""
    times = []
    for _ in range(repeat):
        t = time.process_time()
        fn()
        times.append(time.process_time() - t)
    return times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=3600.0, help="traced time (s)")
    ap.add_argument("--rate-hz", type=float, default=20.0)
    ap.add_argument("--channels", type=int, default=4)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    print(machine_line("bench_readers.py"), flush=True)
    with tempfile.TemporaryDirectory() as d:
        root = Path(d)
        rows = write_trace(root, int(args.seconds * args.rate_hz), args.channels,
                           1.0 / args.rate_hz)
        samples = root / "seg-000001.samples.csv"
        cache = root / CACHE_DIRNAME

        def view_cold() -> None:
            shutil.rmtree(cache, ignore_errors=True)  # the first read: the cache is built
            read_trace_view(root)

        floor_t = timed(lambda: pd.read_csv(samples), args.repeat)
        stdlib_t = timed(lambda: read_trace_stdlib(root), args.repeat)
        view_t = timed(view_cold, args.repeat)
        warm_t = timed(lambda: read_trace_view(root), args.repeat)
        plain_t = timed(lambda: read_trace_view(root, cache=False), args.repeat)
    floor, stdlib, view = min(floor_t), min(stdlib_t), min(view_t)
    print(f"{rows} sample rows ({args.channels} channels, {args.rate_hz:g} Hz, "
          f"{args.seconds:g} s), best of {args.repeat} (process CPU time)")
    for name, t in (("pandas.read_csv (no checks, floor)", floor),
                    ("epi.formats.trace.read_trace (stdlib, checked)", stdlib),
                    ("host.analysis.traces.read_trace, cache built (first read)", view),
                    ("  the same, cache read (later reads)", min(warm_t)),
                    ("  the same, cache=False (checked stdlib reader)", min(plain_t))):
        print(f"  {name:<58} {t:7.3f} s  {rows / t / 1e6:6.2f} M rows/s  {t / floor:5.1f}x floor")
    for key, times in (("trace-read-stdlib-vs-read_csv", stdlib_t),
                       ("trace-read-view-vs-read_csv", view_t)):
        per_round = [t / f for t, f in zip(times, floor_t, strict=True)]
        emit(key, round(min(times) / floor, 2), args.repeat,
             [round(min(per_round), 2), round(max(per_round), 2)],
             f"{rows} rows; best / best of {args.repeat} (process CPU time); spread = the "
             "ratio of each round")


if __name__ == "__main__":
    main()
