"""The daemon's live state, and its Prometheus text exposition (format 0.0.4) for `/metrics`.

Written with the standard library: the Pi side's only hard dependency is the standard
library, and the format is a few lines of text (tests check it with prometheus_client's
parser). A channel's gauges (power, voltage, ...) are exported only while its latest read
succeeded — a failing channel shows ``epi_meter_channel_up 0`` instead of a stale or zero
reading. Counters (energy, samples, faults) are always there once the channel has data.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from epi.formats.json_types import JSON, as_json

# The event kinds the direct path counts as a channel's faults (meter/daemon/sampler.py) and
# a full disk: /metrics exports each at 0 before its first occurrence.
COUNTED_FAULT_KINDS = ("absent", "bus_error", "checksum_error", "chip_reset", "disk_full",
                       "implausible", "reinit", "reverse_energy")


@dataclass
class ChannelInfo:
    """What /metrics and /status say about a channel besides its readings."""

    index: int
    name: str
    node: str | None


@dataclass
class _ChannelState:
    info: ChannelInfo
    last: Mapping[str, object] | None = None  # the latest valid sample, as its producer gave it
    up: bool = False
    samples_total: int = 0
    faults: dict[str, int] = field(default_factory=dict)
    chain_checked: bool = False  # whether a chain self-check runs on it (a bridge: none)
    chain_disagreement: bool = False  # the self-check's verdict now
    chain_ratio: float | None = None  # |counter − integral| / allowance; None: no full window


class MeterState:
    """Thread-safe latest readings and counters, updated by the sampler, read by the server."""

    def __init__(self, channels: Sequence[ChannelInfo], info: Mapping[str, JSON]) -> None:
        self._lock = threading.Lock()
        self._channels = {c.index: _ChannelState(c) for c in channels}
        self.info: dict[str, JSON] = dict(info)  # the run description (hello, /status)
        self.sweeps_total = 0
        self.late_sweeps_total = 0
        self.skipped_sweeps_total = 0
        self.jitter: dict[str, JSON] = {}
        self.sustainable_rate_hz: float | None = None  # None until the first sweep
        self.stream_clients: Callable[[], int] | None = None

    # -- updates (sampler thread) ----------------------------------------------------------
    def record_sample(self, sample: Mapping[str, object]) -> None:
        index = sample.get("channel")
        if not isinstance(index, int):
            raise ValueError(f"a live sample names no channel: {sample!r}")
        with self._lock:
            ch = self._channels[index]
            ch.last = sample
            ch.up = True
            ch.samples_total += 1

    def channel_indices(self) -> set[int]:
        """The channels this daemon samples."""
        return set(self._channels)

    def record_fault(self, channel: int | None, kind: str, *, down: bool = True) -> None:
        """Count a fault on `channel` (None: every channel). `down`: a read failure of that
        kind marks the channel down until its next sample (False where the fault is the
        link's, not a channel's read: the bridge's bad lines). A channel this daemon does not
        sample is not counted."""
        with self._lock:
            targets = list(self._channels.values()) if channel is None else \
                [self._channels[channel]] if channel in self._channels else []
            for ch in targets:
                ch.faults[kind] = ch.faults.get(kind, 0) + 1
                if down and kind in ("bus_error", "absent", "chip_reset"):
                    ch.up = False

    def record_chain(self, channel: int, disagreeing: bool, ratio: float | None) -> None:
        """The channel's chain self-check now (meter/driver/selfcheck.py): whether it
        disagrees beyond the allowance, and the ratio of the gap to the allowance."""
        with self._lock:
            ch = self._channels[channel]
            ch.chain_checked = True
            ch.chain_disagreement = disagreeing
            ch.chain_ratio = ratio

    def record_sweep(
        self,
        *,
        late: bool,
        skipped: int,
        jitter: dict[str, JSON],
        sustainable_rate_hz: float | None = None,
    ) -> None:
        with self._lock:
            self.sweeps_total += 1
            self.late_sweeps_total += int(late)
            self.skipped_sweeps_total += skipped
            self.jitter = jitter
            if sustainable_rate_hz is not None:
                self.sustainable_rate_hz = sustainable_rate_hz

    # -- reads (server threads) ------------------------------------------------------------
    def snapshot(self) -> dict[str, JSON]:
        """JSON-ready copy of everything (for /status)."""
        with self._lock:
            return {
                **self.info,
                "sweeps_total": self.sweeps_total,
                "late_sweeps_total": self.late_sweeps_total,
                "skipped_sweeps_total": self.skipped_sweeps_total,
                "schedule_lateness": dict(self.jitter),
                "sustainable_rate_hz": self.sustainable_rate_hz,
                "channels": [
                    {
                        "channel": c.info.index,
                        "name": c.info.name,
                        "node": c.info.node,
                        "up": c.up,
                        "samples_total": c.samples_total,
                        "faults": dict(c.faults),
                        # null where no self-check runs (absent, not "agreeing")
                        "chain_disagreement": c.chain_disagreement if c.chain_checked
                        else None,
                        "chain_disagreement_ratio": c.chain_ratio,
                        "last": as_json(dict(c.last), "sample") if c.last else None,
                    }
                    for c in self._channels.values()
                ],
            }


def _number(value: object) -> float | int | None:
    """`value` when it is a number (not a bool), else None: samples, info and the jitter
    summary are JSON-shaped, and only their numbers become exposition values."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return value
    return None


def _escape(value: object) -> str:
    return str(value).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _num(value: float | int) -> str:
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    v = float(value)
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    return repr(v)


class _Exposition:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def family(self, name: str, kind: str, help_text: str) -> None:
        self.lines.append(f"# HELP {name} {help_text}")
        self.lines.append(f"# TYPE {name} {kind}")

    def sample(self, name: str, labels: Mapping[str, JSON], value: float | int) -> None:
        if labels:
            body = ",".join(f'{k}="{_escape(v)}"' for k, v in labels.items())
            self.lines.append(f"{name}{{{body}}} {_num(value)}")
        else:
            self.lines.append(f"{name} {_num(value)}")


_GAUGES = (
    ("epi_meter_power_watts", "power_w", "Active power (Pmean with LSB extension), W."),
    ("epi_meter_voltage_volts", "voltage_v", "RMS voltage, V."),
    ("epi_meter_current_amperes", "current_a", "RMS current, A."),
    ("epi_meter_power_factor_ratio", "power_factor", "Power factor, -1..1."),
    ("epi_meter_frequency_hertz", "frequency_hz", "Line frequency, Hz."),
)


def render_prometheus(state: MeterState, mono_ns: int, real_ns: int) -> str:
    """The text exposition of the daemon's state, scraped at the given clock readings."""
    with state._lock:
        channels = [
            (c.info, c.up, c.samples_total, dict(c.faults), dict(c.last) if c.last else None)
            for c in state._channels.values()
        ]
        chains = [(c.info, c.chain_disagreement, c.chain_ratio)
                  for c in state._channels.values() if c.chain_checked]
        info = dict(state.info)
        sweeps, late, skipped = (
            state.sweeps_total,
            state.late_sweeps_total,
            state.skipped_sweeps_total,
        )
        jitter = dict(state.jitter)
        sustainable = state.sustainable_rate_hz
    out = _Exposition()

    out.family("epi_meter_info", "gauge", "Daemon build and run information (value 1).")
    out.sample(
        "epi_meter_info",
        {
            "version": info.get("daemon_version", ""),
            "host": info.get("host", ""),
            "boot_id": info.get("boot_id") or "",
            "emulated": str(bool(info.get("emulated"))).lower(),
            "power_model": info.get("power_model_kind") or "",
            "clock": info.get("clock_kind", ""),
            "segment": info.get("segment", ""),
        },
        1,
    )

    def labels(ch: ChannelInfo) -> dict[str, JSON]:
        return {"channel": ch.index, "name": ch.name, "node": ch.node or ""}

    for metric, key, help_text in _GAUGES:
        out.family(metric, "gauge", help_text)
        for ch, up, _, _, last in channels:
            value = _number(last.get(key)) if up and last is not None else None
            if value is not None:
                out.sample(metric, labels(ch), value)

    out.family(
        "epi_meter_energy_joules_total",
        "counter",
        "Cumulative active energy since the daemon (segment) started, from the energy registers.",
    )
    for ch, _, _, _, last in channels:
        energy = _number(last.get("energy_j")) if last is not None else None
        if energy is not None:
            out.sample("epi_meter_energy_joules_total", labels(ch), energy)

    # not `..._status_bits`: a name part that is a unit ("bits") reads as one to promtool
    out.family("epi_meter_sys_status", "gauge",
               "SysStatus register (a bit field) of the latest sample.")
    for ch, up, _, _, last in channels:
        status = _number(last.get("status")) if up and last is not None else None
        if status is not None:
            out.sample("epi_meter_sys_status", labels(ch), status)

    out.family("epi_meter_channel_up", "gauge", "1 if the channel's latest read succeeded.")
    for ch, up, _, _, _ in channels:
        out.sample("epi_meter_channel_up", labels(ch), 1 if up else 0)

    out.family(
        "epi_meter_last_sample_timestamp_seconds",
        "gauge",
        "CLOCK_REALTIME of the channel's latest valid sample, s since the epoch.",
    )
    for ch, _, _, _, last in channels:
        t_real = _number(last.get("t_real_ns")) if last is not None else None
        if t_real is not None:
            out.sample("epi_meter_last_sample_timestamp_seconds", labels(ch), t_real / 1e9)

    out.family("epi_meter_samples_total", "counter", "Valid samples written per channel.")
    for ch, _, n, _, _ in channels:
        out.sample("epi_meter_samples_total", labels(ch), n)

    out.family("epi_meter_faults_total", "counter", "Faults per channel and kind.")
    for ch, _, _, faults, _ in channels:
        # every counted kind from the first scrape (0): a series that appears only at its
        # first fault shows no data, and rate()/increase() miss that first fault
        for kind in sorted(set(COUNTED_FAULT_KINDS) | set(faults)):
            out.sample("epi_meter_faults_total", {**labels(ch), "kind": kind},
                       faults.get(kind, 0))

    out.family("epi_meter_chain_disagreement", "gauge",
               "1 while the channel's energy counter and the integral of its power readings "
               "(or P and U*I*PF) disagree beyond what register steps and averaging allow; "
               "absent on a channel without a self-check (a bridge).")
    for ch, bad, _ in chains:
        out.sample("epi_meter_chain_disagreement", labels(ch), 1 if bad else 0)
    out.family("epi_meter_chain_disagreement_ratio", "gauge",
               "Counter-vs-integral gap over its allowance in the last self-check window "
               "(above 1: a disagreement); NaN until a full window; absent on a channel "
               "without a self-check.")
    for ch, _, ratio in chains:
        out.sample("epi_meter_chain_disagreement_ratio", labels(ch),
                   math.nan if ratio is None else ratio)

    out.family("epi_meter_sweeps_total", "counter", "Scheduled sweeps over all channels done.")
    out.sample("epi_meter_sweeps_total", {}, sweeps)
    out.family(
        "epi_meter_late_sweeps_total", "counter", "Sweeps that began later than the tolerance."
    )
    out.sample("epi_meter_late_sweeps_total", {}, late)
    out.family(
        "epi_meter_skipped_sweeps_total",
        "counter",
        "Scheduled sweeps skipped because the previous one overran a whole period.",
    )
    out.sample("epi_meter_skipped_sweeps_total", {}, skipped)

    period = _number(info.get("sample_period_s"))
    out.family("epi_meter_sample_period_seconds", "gauge", "Scheduled period of one sweep, s.")
    if period is not None:
        out.sample("epi_meter_sample_period_seconds", {}, float(period))

    out.family(
        "epi_meter_sustainable_rate_hertz",
        "gauge",
        "Sweeps per second the bus sustains as driven, measured as the daemon runs "
        "(1 / p90 of the sweep durations, at most the wire's own rate); absent until the "
        "first sweep.",
    )
    if sustainable is not None:
        out.sample("epi_meter_sustainable_rate_hertz", {}, float(sustainable))

    out.family(
        "epi_meter_schedule_lateness_seconds",
        "summary",
        "How long after its deadline each sweep began, s.",
    )
    count = _number(jitter.get("count"))
    if count:
        for q, key in (("0.5", "p50_ns"), ("0.9", "p90_ns"), ("0.99", "p99_ns")):
            quantile = _number(jitter.get(key))
            if quantile is not None:
                out.sample(
                    "epi_meter_schedule_lateness_seconds", {"quantile": q}, quantile / 1e9
                )
        out.sample("epi_meter_schedule_lateness_seconds_sum", {},
                   (_number(jitter.get("sum_ns")) or 0) / 1e9)
        out.sample("epi_meter_schedule_lateness_seconds_count", {}, count)

    out.family(
        "epi_meter_clock_monotonic_seconds", "gauge", "Meter CLOCK_MONOTONIC at scrape time, s."
    )
    out.sample("epi_meter_clock_monotonic_seconds", {}, mono_ns / 1e9)
    out.family(
        "epi_meter_clock_realtime_seconds", "gauge", "Meter CLOCK_REALTIME at scrape time, s."
    )
    out.sample("epi_meter_clock_realtime_seconds", {}, real_ns / 1e9)
    started = _number(info.get("started_real_ns"))
    out.family("epi_meter_start_time_seconds", "gauge", "CLOCK_REALTIME when the daemon started.")
    if started is not None:
        out.sample("epi_meter_start_time_seconds", {}, started / 1e9)

    out.family("epi_meter_stream_clients", "gauge", "Clients following /stream now.")
    out.sample(
        "epi_meter_stream_clients", {}, state.stream_clients() if state.stream_clients else 0
    )
    return "\n".join(out.lines) + "\n"
