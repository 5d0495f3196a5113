"""Soak the meter daemon on the system clock with every fault kind injected in turn.

Four emulated chips on constant loads, the daemon at its default rate, faults reset, checksum,
absent, stuck, bit-errors (0.001 and 0.002), partial-frames one after the other
(meter/emulation/fault_soak.py), on the direct SPI path and then on the bridge path (the same
chips behind the emulated MCU; `--path`).
The trace is read back; per channel, its energy is compared with the emulator's true energy
less exactly the intervals the trace declares unmetered. Prints that error, the declared
intervals and the rows no event explains, then BENCH lines (the over-declaration check among
them, judged in bench/goals.py). ``--seconds`` (default 600) per path.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchlib import emit, machine_line

from meter.emulation.fault_soak import fault_schedule, run_fault_soak


def _soak(path: str, seconds: float, tmp: Path) -> None:
    """One soak on one path ("direct" or "bridge"), its report and BENCH lines."""
    bridge = path == "bridge"
    prefix = "fault-soak-bridge" if bridge else "fault-soak"
    t0 = time.monotonic()
    res = run_fault_soak(tmp / f"trace-{path}", seconds, bridge=bridge)
    wall = time.monotonic() - t0
    print(f"[{path}] {seconds:g} s on the system clock ({wall:.0f} s wall) at "
          f"{res.rate_hz:g} Hz: {res.sweeps} sweeps, {res.skipped_sweeps} skipped, "
          f"{res.rows} rows")
    print("events: " + ", ".join(f"{k} {n}" for k, n in sorted(res.events.items())))
    for ch, e in sorted(res.energy.items()):
        print(f"  ch{ch}: trace {e.trace_j:.3f} J vs truth {e.truth_j:.3f} J "
              f"({e.error * 100:+.4f} %); truth = emulator {e.model_j:.3f} J over "
              f"{(e.t1_mono_ns - e.t0_mono_ns) / 1e9:.1f} s − {e.declared_j:.3f} J over "
              f"{e.declared_s:.3f} s declared unmetered by {len(e.declared)} gap(s), "
              f"{e.declared_counted_s:.3f} s of it metered before a checksum fault; "
              f"trace vs everything the load drew {e.raw_error * 100:+.4f} %; declared "
              f"away from any injected fault: {len(e.undeclared_fault)}")
    print(f"rows 0 W/0 V: {res.zero_rows}; rows off the load with no event: "
          f"{len(res.unexplained_rows)}")
    for r in res.unexplained_rows[:5]:
        print(f"  unexplained: {r}")
    err = res.max_energy_error
    chs = list(res.energy_rel_error.values())
    emit(f"{prefix}-energy-error", err, 1, [min(chs), max(chs)] if chs else None,
         f"one {seconds:g} s {path} soak; max over channels, spread = min-max over channels")
    emit(f"{prefix}-unexplained-rows", len(res.unexplained_rows) + res.zero_rows, 1, None,
         f"one {seconds:g} s {path} soak; rows off the load without an event + rows at 0 W/0 V")
    # judged in bench/goals.py like every figure (it used to print FAIL and exit 0)
    emit(f"{prefix}-overdeclared-intervals", res.undeclared_fault_intervals, 1, None,
         f"one {seconds:g} s {path} soak; unmetered intervals declared where no fault was "
         "injected, all channels")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=600.0)
    parser.add_argument("--path", choices=("direct", "bridge", "both"), default="both",
                        help="which path to soak (both: one after the other)")
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-fault-soak-"))
    try:
        print(machine_line("bench_fault_soak.py"), flush=True)
        print("faults: " + ", ".join(fault_schedule(args.seconds)))
        for path in (("direct", "bridge") if args.path == "both" else (args.path,)):
            _soak(path, args.seconds, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
