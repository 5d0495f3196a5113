"""Benchmark `epi analyze` at the paper study's scale: time end to end and peak memory.

The study's trace: 148 h at 20 Hz on 4 channels (~42.6 M sample rows), written as the daemon
writes it — many segments (1–2 h each, a restart gap between them), `gap` events with sweeps
missing, `bus_error` events — plus token logs for 72 runs (docs/formats.md §1, §2). Values
are generated with numpy (power follows each run's idle / prefill / decode schedule, with
noise; the counter integrates it), so generation takes about a minute, and is cached under
~/.cache/epi/bench/analyze-scale (about 3 GB; `--regenerate` rewrites it).

`epi analyze` runs as a child process, twice: cold (no columnar cache: every CSV row parsed
and checked, the Parquet cache written beside the segments) and warm (the cache read). Each
run's wall time and peak resident memory (the child's own rusage) are reported with the
machine's load; the goals (bench/goals.py) are for the whole command on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "host"))
from benchlib import emit, machine_line  # bench/benchlib.py
from conftest import make_schedule, write_run  # the tests' token-log writer (formats.md §2)

from epi.formats.trace import SAMPLE_COLUMNS
from host.analysis.trace_cache import CACHE_DIRNAME

ROOT = Path(__file__).resolve().parents[1]
NS = 1_000_000_000
CACHE = Path.home() / ".cache" / "epi" / "bench" / "analyze-scale"
HOURS = 148.0
RATE_HZ = 20.0
CHANNELS = 4
RUNS = 72
REAL_OFFSET_NS = 1_700_000_000 * NS
T0_NS = 1_000 * NS
LEVELS_W = {"idle": 2.7, "prefill": 9.0, "decode": 7.5}
FORMAT_VERSION = 2  # of this generator: a cached trace of another version is rewritten


def schedules(rng: np.random.Generator, hours: float, runs: int) -> list:
    """`runs` runs spread over the study, each 3 prompts × 3 repeats (+1 warm-up round)."""
    span = int(hours * 3600 * NS)
    return [make_schedule(T0_NS + k * span // runs + int(rng.uniform(60, 600) * NS),
                          n_repeats=3, prompts=3, warmups=1, idle_s=20.0, prefill_s=1.5,
                          decode_s=6.0, gap_s=1.0, n_prompt=300, n_gen=256, seed=k)
            for k in range(runs)]


def power_levels(scheds: list) -> tuple[np.ndarray, np.ndarray]:
    """Step profile of the whole study: (change times, level from each change on)."""
    t = [0]
    lv = [LEVELS_W["idle"]]
    for s in scheds:
        for r in s.requests:
            t += [r["start"], r["first"], r["end"]]
            lv += [LEVELS_W["prefill"], LEVELS_W["decode"], LEVELS_W["idle"]]
    return np.array(t, np.int64), np.array(lv, np.float64)


def segment_spans(rng: np.random.Generator, hours: float) -> list[tuple[int, int]]:
    """Segments of 1–2 h separated by a 5 s restart gap, covering the study."""
    end = T0_NS + int(hours * 3600 * NS)
    spans, t = [], T0_NS
    while t < end:
        stop = min(end, t + int(rng.uniform(3600, 7200) * NS))
        spans.append((t, stop))
        t = stop + 5 * NS
    return spans


def write_segment(root: Path, number: int, span: tuple[int, int], steps: tuple,
                  rng: np.random.Generator) -> int:
    """One segment's three files; returns its sample rows."""
    period = int(NS / RATE_HZ)
    sweeps = np.arange(span[0], span[1], period, dtype=np.int64)
    events = [f"{span[0]},{span[0] + REAL_OFFSET_NS},,start,daemon start"]
    keep = np.ones(len(sweeps), bool)
    for _ in range(2):  # a stalled bus: 1–3 s without sweeps, declared by a gap event
        i = int(rng.integers(100, len(sweeps) - 100))
        n = int(rng.integers(20, 60))
        keep[i:i + n] = False
        a, b = int(sweeps[i - 1]), int(sweeps[i + n])
        events.append(f"{a},{a + REAL_OFFSET_NS},,gap,end_mono_ns={b} "
                      f"end_real_ns={b + REAL_OFFSET_NS}; bus stalled")
    i = int(rng.integers(0, len(sweeps)))
    events.append(f"{sweeps[i]},{sweeps[i] + REAL_OFFSET_NS},{int(rng.integers(CHANNELS))},"
                  "bus_error,no answer")
    events.sort(key=lambda line: int(line.split(",")[0]))
    sweeps = sweeps[keep]
    seq = np.flatnonzero(keep).astype(np.int64)
    n = len(sweeps)
    t = (sweeps[:, None] + np.arange(CHANNELS, dtype=np.int64)[None, :] * 1_000_000
         + rng.integers(0, 2_000_001, (n, CHANNELS)))
    st, lv = steps
    p = lv[np.searchsorted(st, t, side="right") - 1] * (1 + 0.1 * np.arange(CHANNELS))
    p = np.round(p + rng.normal(0, 0.03, p.shape), 3)
    dt = np.diff(t, axis=0, prepend=t[:1]) / NS
    e = np.round(np.cumsum(p * dt, axis=0), 3)
    table = pa.table({
        "seq": np.repeat(seq, CHANNELS), "channel": np.tile(np.arange(CHANNELS), n),
        "t_mono_ns": t.ravel(), "t_real_ns": t.ravel() + REAL_OFFSET_NS,
        "power_w": p.ravel(), "voltage_v": np.round(rng.normal(230, 0.5, n * CHANNELS), 2),
        "current_a": np.round(p.ravel() / 230.0, 5), "power_factor": np.full(n * CHANNELS, 0.98),
        "frequency_hz": np.full(n * CHANNELS, 50.0), "energy_j": e.ravel(),
        "status": np.zeros(n * CHANNELS, np.int64)})
    stem = root / f"seg-{number:06d}"
    with open(f"{stem}.samples.csv", "wb") as f:
        f.write((",".join(SAMPLE_COLUMNS) + "\n").encode())
        pacsv.write_csv(table, f, pacsv.WriteOptions(include_header=False,
                                                     quoting_style="none"))
    Path(f"{stem}.events.csv").write_text(
        "t_mono_ns,t_real_ns,channel,kind,detail\n" + "\n".join(events) + "\n")
    meta = {"format": "epi-trace", "format_version": 1, "segment": number,
            "daemon_version": "bench", "host": "meter", "boot_id": "meter-boot-study",
            "started_mono_ns": span[0], "started_real_ns": span[0] + REAL_OFFSET_NS,
            "emulated": True, "power_model": {"kind": "bench-steps", "modelled": True},
            "sample_period_s": 1.0 / RATE_HZ, "stats": {"clean_stop": True},
            "channels": [{"channel": c, "name": f"ch{c}", "node": f"n{c}",
                          "meter_constant_imp_per_kwh": 3200.0, "ct": None}
                         for c in range(CHANNELS)]}
    Path(f"{stem}.meta.json").write_text(json.dumps(meta))
    return n * CHANNELS


def generate(root: Path, hours: float, runs: int) -> dict[str, object]:
    """The whole study (trace + 72 token logs) under `root`; returns its description."""
    shutil.rmtree(root, ignore_errors=True)
    (root / "trace").mkdir(parents=True)
    rng = np.random.default_rng(33)
    scheds = schedules(rng, hours, runs)
    steps = power_levels(scheds)
    rows = 0
    spans = segment_spans(rng, hours)
    for number, span in enumerate(spans, start=1):
        rows += write_segment(root / "trace", number, span, steps, rng)
    for k, s in enumerate(scheds):
        write_run(root / "runs" / f"run{k:02d}", s, offset_ns=123_456_789,
                  nodes=[f"n{c}" for c in range(CHANNELS)], run_id=f"run{k:02d}",
                  map_id=f"map{k % 12}", sha256=f"{k % 12:064x}",
                  real_offset_ns=REAL_OFFSET_NS)
    info = {"version": FORMAT_VERSION, "rows": rows, "segments": len(spans), "runs": runs,
            "hours": hours, "channels": CHANNELS, "rate_hz": RATE_HZ}
    (root / "study.json").write_text(json.dumps(info))
    return info


def analyze(root: Path, out: Path, profile: Path | None = None
            ) -> tuple[float, float, float, str]:
    """(wall s, CPU s, peak RSS MB, last output line) of one `epi analyze` child process;
    with `profile`, the child runs under cProfile and writes its statistics there."""
    runs = sorted(str(p) for p in (root / "runs").iterdir())
    prof = ["-m", "cProfile", "-o", str(profile)] if profile else []
    cmd = [sys.executable, *prof, "-m", "epi", "analyze", *runs, "--trace",
           str(root / "trace"), "--out", str(out)]
    t = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=ROOT)
    assert proc.stdout is not None
    text = proc.stdout.read().decode(errors="replace")
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode:
        raise SystemExit(f"epi analyze failed ({proc.returncode}):\n{text[-3000:]}")
    lines = [ln for ln in text.splitlines() if ln.strip()]
    cpu = usage.ru_utime + usage.ru_stime
    return wall, cpu, usage.ru_maxrss / 1024.0, lines[-1] if lines else ""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cache-dir", type=Path, default=CACHE)
    ap.add_argument("--regenerate", action="store_true")
    ap.add_argument("--hours", type=float, default=HOURS, help="traced time (the study: 148)")
    ap.add_argument("--runs", type=int, default=RUNS, help="token logs (the study: 72)")
    ap.add_argument("--profile", type=Path, default=None, metavar="DIR",
                    help="run each `epi analyze` under cProfile, writing DIR/cold.prof and "
                         "DIR/warm.prof (read them with `python -m pstats`); the times then "
                         "include the profiler's overhead")
    args = ap.parse_args()
    if args.profile:
        args.profile.mkdir(parents=True, exist_ok=True)
    print(machine_line("bench_analyze_scale.py"), flush=True)
    root = args.cache_dir
    info_p = root / "study.json"
    info = json.loads(info_p.read_text()) if info_p.is_file() else {}
    if args.regenerate or (info.get("version"), info.get("hours"), info.get("runs")) != (
            FORMAT_VERSION, args.hours, args.runs):
        t = time.perf_counter()
        info = generate(root, args.hours, args.runs)
        print(f"generated in {time.perf_counter() - t:.0f} s: {root}", flush=True)
    size = sum(p.stat().st_size for p in (root / "trace").glob("seg-*"))
    print(f"study: {info['rows']:,} sample rows ({info['hours']} h, {info['channels']} "
          f"channels, {info['rate_hz']} Hz) in {info['segments']} segments ({size / 1e9:.2f} GB "
          f"of CSV), {info['runs']} runs", flush=True)
    shutil.rmtree(root / "trace" / CACHE_DIRNAME, ignore_errors=True)
    out = root / "analysis"
    figures = {}
    for phase in ("cold", "warm"):
        load = os.getloadavg()[0]
        wall, cpu, rss, last = analyze(root, out, args.profile / f"{phase}.prof"
                                       if args.profile else None)
        end = os.getloadavg()[0]
        figures[phase] = (wall, rss, load, cpu, end)
        print(f"  {phase:<5} epi analyze: {wall:6.1f} s wall, {cpu:6.1f} s CPU, peak RSS "
              f"{rss:6.0f} MB (load at start {load:.2f}, at end {end:.2f}); "
              f"{last[:80]}", flush=True)
    note = (f"{info['rows']} rows, {info['segments']} segments, {info['runs']} runs; "
            f"CPU s (user+sys, all threads) cold {figures['cold'][3]:.1f}, warm "
            f"{figures['warm'][3]:.1f}; load start→end cold {figures['cold'][2]:.2f}→"
            f"{figures['cold'][4]:.2f}, warm {figures['warm'][2]:.2f}→{figures['warm'][4]:.2f}"
            + ("; under cProfile" if args.profile else "")
            + ("" if (args.hours, args.runs) == (HOURS, RUNS) else
               "; NOT the study's size (--hours/--runs): not a figure for the goal"))
    emit("analyze-study-scale-cold-s", round(figures["cold"][0], 1), 1, None, note)
    emit("analyze-study-scale-warm-s", round(figures["warm"][0], 1), 1, None, note)
    emit("analyze-study-scale-peak-mb", round(max(f[1] for f in figures.values())), 2,
         [round(figures["cold"][1]), round(figures["warm"][1])],
         note + "; spread = [cold, warm] peak RSS")


if __name__ == "__main__":
    main()
