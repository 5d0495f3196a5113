"""A soak of the daemon with every fault kind injected in turn, checked against closed form.

Four emulated channels draw constant loads (3, 4, 5, 6 W at PF 0.8 on 230 V), so the truth is
known without the emulator: every row should read the channel's load, and the energy over
the run is P·t. The faults (reset, checksum, absent, stuck, bit-errors, partial-frames) are
spread over the run, one after the other, each on the next channel. Afterwards the trace is
read back and checked:

* every row within 1 % of its channel's load (power, voltage) and PF within 0.01 — or an
  event on that channel within ``EXPLAIN_WINDOW_S`` explains it; no 0 W / 0 V row at all;
* per channel, the energy the daemon counted lies within ``ENERGY_TOLERANCE`` of P·t, allowing
  for the intervals the chip could not meter (resets, checksum re-initialisations, reported
  as events with an estimate): the count must lie in [P·(t − unmetered), P·t] widened by the
  tolerance. Each unmetered window runs from the last good energy read to the
  re-initialisation; the chip metered part of it before a checksum error stopped it, so the
  truth lies inside the bracket, not at its lower end.

Used by tests/meter/test_fault_soak.py (a short run) and bench/bench_fault_soak.py (10 min).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from epi.formats.trace import read_trace
from meter.clock import Clock, SystemClock
from meter.daemon.service import DaemonOptions, MeterDaemon
from meter.emulation.power_models import ConstantPower

LOADS_W = (3.0, 4.0, 5.0, 6.0)
POWER_FACTOR = 0.8
VOLTAGE_V = 230.0
FAULT_KINDS = ("reset", "checksum", "absent", "stuck", "bit-errors", "partial-frames")
ENERGY_TOLERANCE = 0.002
EXPLAIN_WINDOW_S = 2.0
EXPLAINING_KINDS = frozenset(
    {"implausible", "bus_error", "chip_reset", "reinit", "checksum_error", "absent", "gap"}
)


def fault_schedule(duration_s: float, kinds: Sequence[str] = FAULT_KINDS) -> list[str]:
    """One fault of each kind, in turn, each on the next channel, spread over the run."""
    slot = duration_s / (len(kinds) + 1)
    specs = []
    for i, kind in enumerate(kinds):
        start = (i + 0.5) * slot
        ch = i % len(LOADS_W)
        if kind in ("reset", "checksum"):
            specs.append(f"{kind}:{ch}@{start:.3f}")
        else:
            specs.append(f"{kind}:{ch}@{start:.3f}+{slot / 2:.3f}")
    return specs


@dataclass
class SoakResult:
    duration_s: float
    rate_hz: float
    rows: int
    zero_rows: int
    unexplained_rows: list[dict[str, Any]]
    energy_rel_error: dict[int, float]  # per channel: distance outside the bracket / (P·t)
    energy_raw_error: dict[int, float]  # per channel: counted / (P·t) − 1 (losses included)
    unmetered_s: dict[int, float]
    events: dict[str, int] = field(default_factory=dict)
    skipped_sweeps: int = 0
    sweeps: int = 0

    @property
    def max_energy_error(self) -> float:
        return max(abs(e) for e in self.energy_rel_error.values())

    @property
    def ok(self) -> bool:
        return (not self.unexplained_rows and self.zero_rows == 0
                and self.max_energy_error <= ENERGY_TOLERANCE)


def run_fault_soak(out: Path, duration_s: float, clock: Clock | None = None,
                   rate_hz: float | None = None) -> SoakResult:
    """Run the daemon on emulated chips with every fault in turn; check the trace."""
    clock = clock or SystemClock()
    models = [ConstantPower(p, power_factor=POWER_FACTOR, voltage_v=VOLTAGE_V) for p in LOADS_W]
    opts = DaemonOptions(out_dir=out, emulate=True, duration_s=duration_s, listen=None,
                         clock=clock, power_model=models, rate_hz=rate_hz,
                         faults=fault_schedule(duration_s), n_emulated_channels=len(LOADS_W))
    daemon = MeterDaemon(opts, log=lambda _line: None)
    result = daemon.run()
    trace = read_trace(out)
    events = list(trace.events())
    explain: dict[int | None, list[int]] = {}
    counts: dict[str, int] = {}
    for e in events:
        counts[e["kind"]] = counts.get(e["kind"], 0) + 1
        if e["kind"] in EXPLAINING_KINDS and e["t_mono_ns"] is not None:
            explain.setdefault(e["channel"], []).append(e["t_mono_ns"])
    window = EXPLAIN_WINDOW_S * 1e9
    rows = list(trace.samples())
    unexplained, zero = [], 0
    for r in rows:
        p_true = LOADS_W[r["channel"]]
        bad = (
            r["power_w"] is None or abs(r["power_w"] - p_true) > 0.01 * p_true
            or r["voltage_v"] is None or abs(r["voltage_v"] - VOLTAGE_V) > 0.01 * VOLTAGE_V
            or r["power_factor"] is None or abs(r["power_factor"] - POWER_FACTOR) > 0.01
        )
        if not r["power_w"] or not r["voltage_v"]:
            zero += 1
        if bad and not any(abs(t - r["t_mono_ns"]) <= window
                           for t in explain.get(r["channel"], []) + explain.get(None, [])):
            unexplained.append(r)
    errors, raw, unmetered = {}, {}, {}
    for ch in daemon.channels:
        d = ch.driver
        p = LOADS_W[ch.index]
        assert d.energy_epoch_mono_ns is not None and d.energy_t_mono_ns is not None
        span_s = (d.energy_t_mono_ns - d.energy_epoch_mono_ns) / 1e9
        lost_s = sum((u["t1_mono_ns"] - u["t0_mono_ns"]) / 1e9 for u in d.unmetered)
        truth = p * span_s
        counted = d.energy_j
        low, high = p * (span_s - lost_s), truth
        outside = max(low - counted, counted - high, 0.0)
        errors[ch.index] = outside / truth
        raw[ch.index] = counted / truth - 1.0
        unmetered[ch.index] = lost_s
    return SoakResult(
        duration_s=duration_s, rate_hz=result.rate_hz, rows=len(rows), zero_rows=zero,
        unexplained_rows=unexplained, energy_rel_error=errors, energy_raw_error=raw,
        unmetered_s=unmetered,
        events=counts, skipped_sweeps=result.stats.skipped_sweeps, sweeps=result.stats.sweeps,
    )
