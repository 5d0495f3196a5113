"""A soak of the daemon with every fault kind injected in turn, checked against the emulator.

Four emulated channels draw constant loads (3, 4, 5, 6 W at PF 0.8 on 230 V). The faults
(reset, checksum, absent, stuck, bit-errors, partial-frames) are spread over the run, one after
the other, each on the next channel. Afterwards the trace is read back with the project's one
trace reader (``epi.formats.trace``) and checked:

* rows: every row within 1 % of its channel's load (power, voltage) and PF within 0.01, or an
  event on that channel within ``EXPLAIN_WINDOW_S`` explains it; no 0 W / 0 V row at all;
* energy, per channel, over the span of its rows (first to last row):
  ``trace_j`` = the last row's ``energy_j`` − the first row's, as written in the trace;
  ``truth_j`` = the emulator's true energy over that span (``EmulatedChip.true_energy_j``, the
  energy the emulated chip meters while it is running) − the emulator's true energy over
  exactly the intervals the trace declares unmetered (``gap`` events whose reason begins
  ``UNMETERED_GAP_REASON``: the chip's counter was lost or stopped, from the last good energy
  read to the restart of metering). One correction comes from the emulator's side: a
  checksum fault stops the chip's metering at the instant the bit flips (the injector logs
  it), and the driver counts what the chip metered before; the part of a declared interval
  before that instant was metered and counted, so it is not subtracted (it is reported as
  ``declared_counted_s``: the declaration overstates the loss by that much). ``trace_j`` must
  lie within ``ENERGY_TOLERANCE`` of ``truth_j``. Nothing else is subtracted: energy the chip
  kept metering through a fault that needs no re-initialisation (bit errors, cut frames) must
  be in ``trace_j``, and energy the driver discards as implausible counts against it.
* every declared unmetered interval overlaps an injected fault on that channel (within
  ``EXPLAIN_WINDOW_S``): the daemon cannot hide a loss by declaring it where nothing happened.

Used by tests/meter/test_fault_soak.py (a short run) and bench/bench_fault_soak.py (10 min).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypedDict

from epi.formats.trace import GapSource, SampleRow, Trace, read_trace
from meter.bridge.daemon import prepare_bridge, run_bridge
from meter.clock import Clock, SystemClock
from meter.daemon.sampler import SamplerStats
from meter.daemon.service import DaemonOptions, MeterDaemon
from meter.daemon.trace import UNMETERED_GAP_REASON
from meter.emulation.chip_emulator import EmulatedChip
from meter.emulation.faults import FaultKind, parse_fault_specs
from meter.emulation.power_models import ConstantPower
from meter.recording.session import RecordingSession

LOADS_W = (3.0, 4.0, 5.0, 6.0)
POWER_FACTOR = 0.8
VOLTAGE_V = 230.0
# bit errors at the emulator's default rate (0.001 per bit) and twice it
FAULT_KINDS = ("reset", "checksum", "absent", "stuck", "bit-errors", "partial-frames",
               "bit-errors=0.002")
ENERGY_TOLERANCE = 0.002
EXPLAIN_WINDOW_S = 2.0
EXPLAINING_KINDS = frozenset(
    {"implausible", "bus_error", "chip_reset", "reinit", "checksum_error", "absent", "gap"}
)

TrueEnergy = Callable[[int, int, int], float]  # (channel, t0_mono_ns, t1_mono_ns) -> J


def fault_schedule(duration_s: float, kinds: Sequence[str] = FAULT_KINDS) -> list[str]:
    """One fault of each kind, in turn, each on the next channel, spread over the run."""
    slot = duration_s / (len(kinds) + 1)
    specs = []
    for i, kind in enumerate(kinds):
        start = (i + 0.5) * slot
        ch = i % len(LOADS_W)
        name, _, value = kind.partition("=")  # KIND=VALUE: the fault's rate
        if name in ("reset", "checksum"):
            specs.append(f"{name}:{ch}@{start:.3f}")
        else:
            specs.append(f"{name}:{ch}@{start:.3f}+{slot / 2:.3f}" + (f"={value}" if value
                                                                     else ""))
    return specs


@dataclass
class ChannelEnergy:
    """One channel's energy over the span of its rows: the trace against the emulator."""

    channel: int
    t0_mono_ns: int
    t1_mono_ns: int
    trace_j: float  # last row's energy_j − first row's, read back from the trace
    model_j: float  # the emulator's true energy over [t0, t1]
    declared: list[tuple[int, int]]  # unmetered intervals the trace declares, clipped, merged
    declared_j: float  # the emulator's true energy over the declared intervals, less the
    #                    parts the chip metered before a checksum fault stopped it
    undeclared_fault: list[tuple[int, int]]  # declared intervals with no injected fault near
    declared_counted_s: float = 0.0  # declared lost, but metered and counted (checksum)

    @property
    def truth_j(self) -> float:
        """What the trace should hold: everything the chip metered, less the declared loss."""
        return self.model_j - self.declared_j

    @property
    def error(self) -> float:
        """trace / truth − 1 (the headline: within ENERGY_TOLERANCE)."""
        return self.trace_j / self.truth_j - 1.0

    @property
    def raw_error(self) -> float:
        """trace / (everything the load drew) − 1: the declared losses included."""
        return self.trace_j / self.model_j - 1.0

    @property
    def declared_s(self) -> float:
        return sum(b - a for a, b in self.declared) / 1e9


@dataclass
class SoakResult:
    duration_s: float
    rate_hz: float
    rows: int
    zero_rows: int
    unexplained_rows: list[SampleRow]
    energy: dict[int, ChannelEnergy]
    events: dict[str, int] = field(default_factory=dict)
    skipped_sweeps: int = 0
    sweeps: int = 0
    metering_stopped: dict[int, list[int]] = field(default_factory=dict)  # checksum instants

    @property
    def energy_rel_error(self) -> dict[int, float]:
        """Per channel: trace energy / truth − 1."""
        return {ch: e.error for ch, e in self.energy.items()}

    @property
    def max_energy_error(self) -> float:
        return max(abs(e) for e in self.energy_rel_error.values())

    @property
    def undeclared_fault_intervals(self) -> int:
        return sum(len(e.undeclared_fault) for e in self.energy.values())

    @property
    def ok(self) -> bool:
        return (not self.unexplained_rows and self.zero_rows == 0
                and self.undeclared_fault_intervals == 0
                and self.max_energy_error <= ENERGY_TOLERANCE)


def _merge(intervals: list[tuple[int, int]]) -> list[tuple[int, int]]:
    merged: list[tuple[int, int]] = []
    for a, b in sorted(intervals):
        if merged and a <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], b))
        else:
            merged.append((a, b))
    return merged


def unmetered_intervals(trace: Trace, channel: int) -> list[tuple[int, int]]:
    """The intervals the trace declares unmetered for a channel (merged, in time order)."""
    return _merge([
        (g.start_mono_ns, g.end_mono_ns) for g in trace.gaps
        if g.source == GapSource.EVENT and g.channel == channel
        and g.reason.startswith(UNMETERED_GAP_REASON)
        and g.start_mono_ns is not None and g.end_mono_ns is not None
    ])


def fault_windows(trace: Trace, specs: Sequence[str]) -> dict[int, list[tuple[int, int]]]:
    """Injected faults per channel as [start, end] monotonic times (one-shot: start = end),
    placed by the schedule start the segment's meta records."""
    meta = trace.segments[0].meta
    sampler = meta.get("sampler")
    if isinstance(sampler, dict):  # the direct path: the sampler's schedule
        sched0 = int(sampler["schedule_start_mono_ns"])
    else:  # the bridge: faults count from the emulated port's start (meter/bridge/daemon.py)
        start = meta["fault_schedule_start_mono_ns"]
        if not isinstance(start, int):
            raise ValueError(f"meta.json fault_schedule_start_mono_ns: {start!r} is not an integer")
        sched0 = start
    windows: dict[int, list[tuple[int, int]]] = {}
    for spec in parse_fault_specs(specs):
        start = sched0 + round(spec.start_s * 1e9)
        end = start + round((spec.duration_s or 0.0) * 1e9)
        windows.setdefault(int(spec.channel), []).append((start, end))
    return windows


def _lost_part(a: int, b: int, metering_stopped: Sequence[int]) -> tuple[int, int]:
    """The part of a declared interval whose energy the chip really lost: from the instant a
    checksum fault stopped its metering, when one falls inside; else all of it."""
    for t in metering_stopped:
        if a <= t < b:
            return t, b
    return a, b


def channel_energy(trace: Trace, channel: int, true_energy: TrueEnergy,
                   faults: Sequence[tuple[int, int]],
                   metering_stopped: Sequence[int] = ()) -> ChannelEnergy:
    """Energy of one channel over the span of its rows, against the emulator's truth."""
    rows = sorted((r.t_mono_ns, r.energy_j) for r in _rows(trace)
                  if r.channel == channel and r.energy_j is not None and r.t_mono_ns is not None)
    if len(rows) < 2:
        raise ValueError(f"channel {channel}: fewer than two rows with energy in the trace")
    (t0, e0), (t1, e1) = rows[0], rows[-1]
    declared = [(max(a, t0), min(b, t1)) for a, b in unmetered_intervals(trace, channel)
                if b > t0 and a < t1]
    slack = round(EXPLAIN_WINDOW_S * 1e9)
    undeclared = [(a, b) for a, b in declared
                  if not any(a <= fe + slack and b >= fs - slack for fs, fe in faults)]
    lost = [_lost_part(a, b, metering_stopped) for a, b in declared]
    return ChannelEnergy(
        channel=channel, t0_mono_ns=t0, t1_mono_ns=t1, trace_j=e1 - e0,
        model_j=true_energy(channel, t0, t1),
        declared=declared,
        declared_j=sum(true_energy(channel, a, b) for a, b in lost),
        undeclared_fault=undeclared,
        declared_counted_s=sum(la - a for (a, _), (la, _) in zip(declared, lost, strict=True))
        / 1e9,
    )


def _rows(trace: Trace) -> list[SampleRow]:
    """Every sample row of every segment, in order."""
    return [r for seg in trace.segments for r in seg.samples]


class TraceFindings(TypedDict):
    """What `check_trace` found in a soak's trace (the fields of `SoakResult` it fills)."""

    rows: int
    zero_rows: int
    unexplained_rows: list[SampleRow]
    energy: dict[int, ChannelEnergy]
    events: dict[str, int]


def check_trace(trace_dir: Path, true_energy: TrueEnergy, specs: Sequence[str],
                loads_w: Sequence[float] = LOADS_W,
                metering_stopped: dict[int, list[int]] | None = None,
                ) -> tuple[Trace, TraceFindings]:
    """Read a soak's trace back and check its rows and energy (see the module docstring).

    ``metering_stopped``: per channel, the instants a checksum fault stopped the emulated
    chip's metering (the injector's log); None: no such correction.
    """
    trace = read_trace(trace_dir)
    explain: dict[int | None, list[int]] = {}
    counts: dict[str, int] = {}
    for e in (e for seg in trace.segments for e in seg.events):
        counts[e.kind] = counts.get(e.kind, 0) + 1
        if e.kind in EXPLAINING_KINDS and e.t_mono_ns is not None:
            explain.setdefault(e.channel, []).append(e.t_mono_ns)
    window = EXPLAIN_WINDOW_S * 1e9
    rows = _rows(trace)
    unexplained: list[SampleRow] = []
    zero = 0
    for r in rows:
        ch, t_row = r.channel, r.t_mono_ns
        if ch is None or t_row is None:  # read_trace refuses such a row
            raise ValueError(f"a sample row without channel or time: {r}")
        p_true = loads_w[ch]
        bad = (
            r.power_w is None or abs(r.power_w - p_true) > 0.01 * p_true
            or r.voltage_v is None or abs(r.voltage_v - VOLTAGE_V) > 0.01 * VOLTAGE_V
            or r.power_factor is None or abs(r.power_factor - POWER_FACTOR) > 0.01
        )
        if not r.power_w or not r.voltage_v:
            zero += 1
        if bad and not any(abs(t - t_row) <= window
                           for t in explain.get(ch, []) + explain.get(None, [])):
            unexplained.append(r)
    faults = fault_windows(trace, specs)
    stopped = metering_stopped or {}
    energy = {ch: channel_energy(trace, ch, true_energy, faults.get(ch, []), stopped.get(ch, []))
              for ch in range(len(loads_w))}
    return trace, {"rows": len(rows), "zero_rows": zero, "unexplained_rows": unexplained,
                   "energy": energy, "events": counts}


def checksum_instants(daemon: MeterDaemon) -> dict[int, list[int]]:
    """Per channel, when the injector flipped a calibration bit (the chip stops metering)."""
    return _checksum_instants(daemon.injector.applied if daemon.injector is not None else [])


def _checksum_instants(applied: Sequence[Mapping[str, object]]) -> dict[int, list[int]]:
    """Per channel, the checksum faults' instants of an injector's `applied` log (the direct
    daemon's, or the one the bridge writes into meta.json as `fault_applied`)."""
    out: dict[int, list[int]] = {}
    for a in applied:
        spec, t = a.get("spec"), a.get("t_mono_ns")
        if not isinstance(spec, str) or not isinstance(t, int):
            continue
        kind, _, rest = spec.partition(":")
        if kind == FaultKind.CHECKSUM:
            out.setdefault(int(rest.split("@")[0]), []).append(t)
    return out


def run_fault_soak(out: Path, duration_s: float, clock: Clock | None = None,
                   rate_hz: float | None = None, *, bridge: bool = False,
                   kinds: Sequence[str] = FAULT_KINDS, specs: Sequence[str] | None = None,
                   seed: int = 0) -> SoakResult:
    """Run the daemon on emulated chips with every fault in turn; check the trace.

    ``bridge``: the same chips behind the emulated board's MCU (the real firmware on CPython,
    read through an ``emumcu://`` port by the bridge recorder), the same faults applied to
    the chips the firmware reads, the same checks (the bridge path held to the
    direct path's standard). The truth is then the power models' exact integrals.
    ``specs``: the faults to inject instead of one of each of ``kinds`` in turn. ``seed``: the
    emulated board's random faults (bridge only; its chip k draws from ``seed + k``)."""
    clock = clock or SystemClock()
    models = [ConstantPower(p, power_factor=POWER_FACTOR, voltage_v=VOLTAGE_V) for p in LOADS_W]
    specs = list(specs) if specs is not None else fault_schedule(duration_s, kinds)
    opts = DaemonOptions(out_dir=out, emulate=not bridge, emulate_bridge=bridge,
                         duration_s=duration_s, listen=None, clock=clock, power_model=models,
                         rate_hz=rate_hz, faults=specs, n_emulated_channels=len(LOADS_W))
    chips: dict[int, EmulatedChip] = {}
    if bridge:
        plan = prepare_bridge(opts, clock)
        plan.seed = seed
        with RecordingSession(out, clock, log=lambda _line: None) as session:
            result = run_bridge(plan, session)
        applied = read_trace(out).segments[0].meta.get("fault_applied")
        stopped = _checksum_instants(applied if isinstance(applied, list) else [])
    else:
        if seed:
            raise ValueError("seed: the direct path's chips are seeded by the daemon (0 only)")
        daemon = MeterDaemon(opts, log=lambda _line: None)
        result = daemon.run()
        chips = {ch.index: ch.emulator for ch in daemon.channels if ch.emulator is not None}
        stopped = checksum_instants(daemon)

    def true_energy(channel: int, t0: int, t1: int) -> float:
        if bridge:
            return float(models[channel].energy_j(t0, t1))
        return float(chips[channel].true_energy_j(t0, t1))

    _, found = check_trace(out, true_energy, specs, metering_stopped=stopped)
    stats = result.stats
    if isinstance(stats, SamplerStats):  # the direct sampler ran
        skipped, sweeps = stats.skipped_sweeps, stats.sweeps
    else:  # the bridge: its skips are the firmware's `late` events
        skipped, sweeps = found["events"].get("late", 0), int(getattr(stats, "sweeps", 0))
    return SoakResult(
        duration_s=duration_s, rate_hz=result.rate_hz, metering_stopped=stopped, **found,
        skipped_sweeps=skipped, sweeps=sweeps,
    )
