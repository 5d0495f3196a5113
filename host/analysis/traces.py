"""The analysis's pandas view of a meter trace directory (docs/formats.md §1).

Parsing and every field check live in the one reader, `epi.formats.trace` (standard library
only, shared with the daemon and the tests). This view turns its columns into frames and adds
what the aligner needs: per-channel invalid intervals with a reason — the span between
segments, the span around every fault event (`gap`, `bus_error`, `chip_reset`, `reinit`,
`absent`, `checksum_error`, or an unknown kind), around readings whose SysStatus shows frozen
metering or measurement (CalErr / AdjErr), whose `power_w` is empty, or whose `power_w` is
negative (a reversed CT), sample gaps longer than `max_gap_periods` scheduled periods (the
period inferred from the samples when the meta lacks it, with a note), and, for the counter,
every span from a decrease of `energy_j` to the end of its segment.

Memory and time at a study's scale (tens of millions of rows): the samples are read segment by
segment — from the columnar cache beside the CSV (host/analysis/trace_cache.py) unless
`cache=False` — and only what the analysis needs is kept: per channel and clock domain the
times, power and counter of the rows with a valid power reading, plus the times of the rows
that invalidate data or saturate. The whole sample table (`Trace.samples`) is built only when
asked for (the report's power-trace figure, tests).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from epi.core.errors import UserError
from epi.formats import trace as fmt
from epi.formats.trace import FAULT_EVENTS, INFO_EVENTS, EventKind, Segment
from epi.formats.trace import ChannelMeta as ChannelInfo
from host.analysis.align import INT64_MAX, INT64_MIN, ChannelSeries, Intervals
from host.analysis.trace_cache import CachedSamplesReader, ParquetColumns, host_columns
from host.analysis.vocabulary import InvalidScope
from meter.chip.registers import ADJ_ERR_MASK, CAL_ERR_MASK  # SysStatus fields

# Register full scale of the ATM90E26 (Irms 65.535 A, Pmean ±32.767 kW): readings at it saturate.
FULL_SCALE_CURRENT_A = 65.535
FULL_SCALE_POWER_W = 32767.0
# A reading below this is not noise around 0 W but a reversed CT (or a wrong calibration sign).
NEGATIVE_POWER_TOLERANCE_W = 0.5
REVERSED_CT_HINT = ("negative power_w (CT reversed? turn the CT so its arrow points to the load, "
                    "or check the calibration sign)")

# Columns the analysis reads from every segment (the rest only for `Trace.samples`).
ANALYSIS_COLUMNS = ("channel", "t_mono_ns", "t_real_ns", "power_w", "energy_j", "current_a",
                    "status")


@dataclass
class ChannelData:
    """One channel in one clock domain, joined over its segments: the rows with a valid power
    reading (`t_mono_ns`, `power_w`, `energy_j`; `seg_counts[i]` of them from segment
    `seg_numbers[i]`), how many rows it has in all, and the times of the rows that matter
    elsewhere (missing power, SysStatus flags, full scale)."""

    t_mono_ns: np.ndarray
    power_w: np.ndarray
    energy_j: np.ndarray
    seg_numbers: np.ndarray
    seg_counts: np.ndarray
    n_rows: int
    nopower_t_ns: np.ndarray
    adjerr_t_ns: np.ndarray
    calerr_t_ns: np.ndarray
    saturated_t_ns: np.ndarray

    @property
    def segment(self) -> np.ndarray:
        """The segment number of every row (built when asked: 8 bytes a row)."""
        return np.repeat(self.seg_numbers, self.seg_counts)

    @property
    def seg_start_idx(self) -> np.ndarray:
        """Index of the first row of each segment that has rows ([0] when none has)."""
        counts = self.seg_counts[self.seg_counts > 0]
        if not len(counts):
            return np.zeros(1, np.int64)
        return np.concatenate([[0], np.cumsum(counts[:-1])]).astype(np.int64)


@dataclass
class Domain:
    """What the analysis asks of one clock domain (boot) as a whole."""

    n_rows: int
    mono_ns: tuple[int, int] | None
    real_ns: tuple[int, int] | None


@dataclass
class Trace:
    """A validated trace directory.

    `events` holds every event (plus `segment`); `invalid` the per-channel invalid intervals
    (`channel`, `boot_key`, `start_ns`, `end_ns`, `scope` = "all" or "counter", `reason`);
    `data` each channel's series per clock domain; `samples` every valid-format row (plus
    `segment`), built on first use.
    """

    path: Path
    segments: list[Segment]
    channels: dict[int, ChannelInfo]
    events: pd.DataFrame
    invalid: pd.DataFrame
    data: dict[tuple[str, int], ChannelData]
    domains: dict[str, Domain]
    notes: list[str] = field(default_factory=list)
    # A trace joined from several (host/analysis/multi_trace.py): each channel → (the trace it
    # came from, its number there), so labels and instrument terms come from that trace's meta.
    origins: dict[int, tuple[Trace, int]] | None = field(default=None, repr=False, compare=False)
    _samples: pd.DataFrame | None = None
    _series: dict[tuple[str, int], ChannelSeries] = field(default_factory=dict)

    @property
    def samples(self) -> pd.DataFrame:
        """Every sample row of every segment (built on first use: large at a study's scale)."""
        if self._samples is None:
            self._samples = pd.concat([_sample_frame(s) for s in self.segments],
                                      ignore_index=True)
        return self._samples

    @property
    def boot_ids(self) -> list[str | None]:
        return list(dict.fromkeys(s.boot_id for s in self.segments))

    @property
    def member_traces(self) -> list[Trace]:
        """The traces this one was joined from (itself when it was not joined)."""
        if not self.origins:
            return [self]
        return list({id(t): t for t, _ in self.origins.values()}.values())

    @property
    def emulated(self) -> bool:
        return any(bool(s.meta.get("emulated")) for t in self.member_traces for s in t.segments)

    @property
    def power_models(self) -> list[object]:
        return [s.meta.get("power_model") for t in self.member_traces for s in t.segments
                if s.meta.get("power_model")]

    def clock_simulated(self, boot_id: str | None) -> bool:
        """Whether the segments of this clock domain were timed by a simulated clock."""
        return any(isinstance(clock := s.meta.get("clock"), dict)
                   and clock.get("kind") == "simulated"
                   for s in self.segments if s.boot_id == boot_id)

    def domain_samples(self, boot_id: str | None) -> pd.DataFrame:
        segs = [s.number for s in self.segments if s.boot_id == boot_id]
        return self.samples[self.samples["segment"].isin(segs)]

    def coverage_ns(self, boot_id: str | None) -> tuple[int, int] | None:
        """(first, last) sample time in this clock domain, or None when it has no samples."""
        dom = self.domains.get(_boot_key(boot_id))
        return dom.mono_ns if dom else None

    def real_coverage_ns(self, boot_id: str | None) -> tuple[int, int] | None:
        dom = self.domains.get(_boot_key(boot_id))
        return dom.real_ns if dom else None

    def series(self, channel: int, boot_id: str | None) -> ChannelSeries:
        """The aligner's view of one channel in one clock domain (built once)."""
        key = (_boot_key(boot_id), channel)
        if key not in self._series:
            self._series[key] = self._build_series(channel, boot_id)
        return self._series[key]

    def _build_series(self, channel: int, boot_id: str | None) -> ChannelSeries:
        key = (_boot_key(boot_id), channel)
        d = self.data.get(key) or _empty_channel()
        inv = self.invalid[(self.invalid["channel"] == channel)
                           & (self.invalid["boot_key"] == key[0])]
        all_scope = inv[inv["scope"] == InvalidScope.ALL]
        ctr_scope = inv[inv["scope"] == InvalidScope.COUNTER]
        info = self.channels.get(channel)
        dead = None
        if not len(d.t_mono_ns):
            dom = self.domains.get(key[0])
            if d.n_rows:
                dead = (f"channel {channel}: dead channel ({d.n_rows} reading(s) in this "
                        "clock domain, none with a valid power_w)")
            elif dom and dom.n_rows:
                dead = (f"channel {channel}: dead channel (no readings, while other channels "
                        f"have {dom.n_rows})")
        return ChannelSeries(
            channel=channel,
            t_mono_ns=d.t_mono_ns,
            power_w=d.power_w,
            energy_j=d.energy_j,
            seg_start_idx=d.seg_start_idx,
            invalid=Intervals.build(all_scope["start_ns"].to_numpy(np.int64),
                                    all_scope["end_ns"].to_numpy(np.int64),
                                    all_scope["reason"].to_numpy(object)),
            counter_invalid=Intervals.build(ctr_scope["start_ns"].to_numpy(np.int64),
                                            ctr_scope["end_ns"].to_numpy(np.int64),
                                            ctr_scope["reason"].to_numpy(object)),
            counter_resolution_j=info.counter_resolution_j if info else float("nan"),
            dead_reason=dead,
        )

    def saturated(self, channel: int, boot_id: str | None, t0_ns: int, t1_ns: int) -> int:
        """Number of readings of a channel in [t0, t1] at the register full scale (or CT limit)."""
        d = self.data.get((_boot_key(boot_id), channel))
        if d is None:
            return 0
        t = d.saturated_t_ns
        return int(np.searchsorted(t, t1_ns, side="right") - np.searchsorted(t, t0_ns))


def _empty_channel() -> ChannelData:
    i64, f64 = np.zeros(0, np.int64), np.zeros(0, np.float64)
    return ChannelData(i64, f64, f64, i64, i64, 0, i64, i64, i64, i64)


def current_limit_a(info: ChannelInfo | None) -> float:
    """The current at which a channel saturates: the register full scale or its CT's rating."""
    limit_a = FULL_SCALE_CURRENT_A
    ct = info.ct if info else None
    if isinstance(ct, dict):
        for key in ("max_current_a", "rated_current_a", "max_a", "rated_a"):
            if isinstance(ct.get(key), (int, float)):
                limit_a = min(limit_a, float(ct[key]))
                break
    return limit_a


def _segment_arrays(seg: Segment, names: tuple[str, ...]) -> dict[str, np.ndarray]:
    """Some columns of one segment as numpy (from the cache file when it has one)."""
    if isinstance(seg.columns, ParquetColumns):
        return seg.columns.read(names)
    cols = host_columns(seg.columns)
    return {n: cols[n] for n in names}


def _n_samples(seg: Segment) -> int:
    """A segment's sample rows, without reading a cached column (`Segment.n_samples` reads
    its `seq`)."""
    if isinstance(seg.columns, ParquetColumns):
        return seg.columns.n_rows
    return seg.n_samples


def _sample_frame(seg: Segment) -> pd.DataFrame:
    """One segment's samples as a frame (ints exact, empty floats NaN, empty status 0)."""
    cols = _segment_arrays(seg, fmt.SAMPLE_COLUMNS)
    out = pd.DataFrame({"segment": np.full(_n_samples(seg), seg.number, dtype=np.int64)})
    for col in fmt.SAMPLE_COLUMNS:
        out[col] = cols[col]
    return out


def _event_frame(seg: Segment) -> pd.DataFrame:
    ev = seg.events

    def ints(values: list[int | None]) -> np.ndarray:
        return np.array([INT64_MIN if v is None else v for v in values], dtype=np.int64)

    return pd.DataFrame({
        "segment": np.full(len(ev), seg.number, dtype=np.int64),
        "t_mono_ns": ints([e.t_mono_ns for e in ev]),
        "t_real_ns": ints([e.t_real_ns for e in ev]),
        "channel": pd.array([e.channel for e in ev], dtype="Int64"),
        "kind": np.array([e.kind for e in ev], dtype=object),
        "detail": np.array([e.detail for e in ev], dtype=object),
    })


def _around(t: np.ndarray, at: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Last sample strictly before and first strictly after each time (int64 sentinels)."""
    lo = np.full(len(at), INT64_MIN, dtype=np.int64)
    hi = np.full(len(at), INT64_MAX, dtype=np.int64)
    if len(t):
        i = np.searchsorted(t, at, side="left") - 1
        j = np.searchsorted(t, at, side="right")
        lo[i >= 0] = t[i[i >= 0]]
        hi[j < len(t)] = t[j[j < len(t)]]
    return lo, hi


def _boot_key(boot_id: str | None) -> str:
    """A comparable key for a boot id (pandas never matches None with ==)."""
    return "" if boot_id is None else f"boot:{boot_id}"


def _gap_end(kind: str, detail: str) -> int:
    """End of a `gap` event given as `end_mono_ns=N end_real_ns=M; reason` (else INT64_MIN)."""
    if kind != EventKind.GAP:
        return INT64_MIN
    end, _, _ = fmt.parse_gap_detail(detail)
    return INT64_MIN if end is None else end


def _collect(segments: list[Segment], channels: dict[int, ChannelInfo]
             ) -> tuple[dict[tuple[str, int], ChannelData], dict[str, Domain]]:
    """Read every segment (only the analysis's columns) into per-channel arrays.

    Two passes: the first counts each channel's valid rows, so that the second fills arrays
    allocated once at their final size (no per-segment pieces to join: at a study's scale
    those double the memory, and the allocator keeps the freed pieces)."""
    good_counts: dict[tuple[str, int], dict[int, int]] = {}
    for seg in segments:
        if not _n_samples(seg):
            continue
        a = _segment_arrays(seg, ("channel", "power_w"))
        rows = np.bincount(a["channel"])  # channels are small non-negative ints (checked)
        good = np.bincount(a["channel"][~np.isnan(a["power_w"])], minlength=len(rows))
        boot = _boot_key(seg.boot_id)
        for ch in np.flatnonzero(rows).tolist():
            good_counts.setdefault((boot, ch), {})[seg.number] = int(good[ch])
    data: dict[tuple[str, int], ChannelData] = {}
    for key, per_seg in good_counts.items():
        n = sum(per_seg.values())
        data[key] = ChannelData(
            np.empty(n, np.int64), np.empty(n, np.float64), np.empty(n, np.float64),
            np.array(list(per_seg), np.int64), np.array(list(per_seg.values()), np.int64),
            0, *([np.zeros(0, np.int64)] * 4))
    filled = dict.fromkeys(data, 0)
    sparse: dict[tuple[str, int], list[tuple[np.ndarray, ...]]] = {k: [] for k in data}
    doms: dict[str, list[tuple[int, int, int, int, int]]] = {}
    limits = {ch: current_limit_a(info) for ch, info in channels.items()}
    none = np.zeros(0, np.int64)
    for seg in segments:
        boot = _boot_key(seg.boot_id)
        doms.setdefault(boot, [])
        if not _n_samples(seg):
            continue
        a = _segment_arrays(seg, ANALYSIS_COLUMNS)
        mono, real, power = a["t_mono_ns"], a["t_real_ns"], a["power_w"]
        doms[boot].append((len(mono), int(mono.min()), int(mono.max()), int(real.min()),
                           int(real.max())))
        chan = a["channel"]
        rows = np.bincount(chan)
        # The rare rows, found once for all channels (most segments have none of them).
        nopower = np.isnan(power)
        status = a["status"]
        adjerr = (status & ADJ_ERR_MASK) != 0
        calerr = (status & CAL_ERR_MASK) != 0
        limit = np.array([limits.get(ch, FULL_SCALE_CURRENT_A) for ch in range(len(rows))])
        sat = (a["current_a"] >= limit[chan]) | (np.abs(power) >= FULL_SCALE_POWER_W)
        rare = [m if m.any() else None for m in (nopower, adjerr, calerr, sat)]
        for ch in np.flatnonzero(rows).tolist():
            key = (boot, ch)
            d = data[key]
            sel = chan == ch
            gsel = sel if rare[0] is None else sel & ~nopower
            tg = mono[gsel]
            lo, hi = filled[key], filled[key] + len(tg)
            d.t_mono_ns[lo:hi] = tg
            d.power_w[lo:hi] = power[gsel]
            d.energy_j[lo:hi] = a["energy_j"][gsel]
            filled[key] = hi
            d.n_rows += int(rows[ch])
            sparse[key].append(tuple(
                none if m is None else mono[(gsel if i in (1, 2) else sel) & m]
                for i, m in enumerate(rare)))
        del a, mono, real, chan, power, status
    for key, d in data.items():
        parts = sparse[key]
        d.nopower_t_ns, d.adjerr_t_ns, d.calerr_t_ns, d.saturated_t_ns = (
            np.concatenate([pt[i] for pt in parts]) for i in range(4))
    domains = {}
    for boot, spans in doms.items():
        if not spans:
            domains[boot] = Domain(0, None, None)
            continue
        n_rows, mono_lo, mono_hi, real_lo, real_hi = zip(*spans, strict=True)
        domains[boot] = Domain(sum(n_rows), (min(mono_lo), max(mono_hi)),
                               (min(real_lo), max(real_hi)))
    return data, domains


def _invalid_intervals(data: dict[tuple[str, int], ChannelData], events: pd.DataFrame,
                       segments: list[Segment], channels: list[int], max_gap_periods: float
                       ) -> pd.DataFrame:
    rows: list[pd.DataFrame] = []
    seg_boot = {s.number: s.boot_id for s in segments}
    period_lut = np.full(max(s.number for s in segments) + 1, np.nan)
    for s in segments:
        if s.sample_period_s is not None:  # given, or inferred by the reader (noted)
            period_lut[s.number] = s.sample_period_s
    # A software source's channel has its own period (docs/sources.md).
    chan_period = {(s.number, ch): info.sample_period_s for s in segments
                   for ch, info in s.channels.items() if info.sample_period_s is not None}

    def add(ch: int, boot: str | None, lo: np.ndarray, hi: np.ndarray, scope: InvalidScope,
            reasons: np.ndarray | str) -> None:
        if len(lo):
            rows.append(pd.DataFrame({"channel": ch, "boot_key": _boot_key(boot), "start_ns": lo,
                                      "end_ns": hi, "scope": scope.value, "reason": reasons}))

    for boot in dict.fromkeys(seg_boot.values()):
        segs = {n for n, b in seg_boot.items() if b == boot}
        ev = events[events["segment"].isin(segs)]
        faults = ev[~ev["kind"].isin(INFO_EVENTS)]
        for ch in channels:  # a handful of channels
            d = data.get((_boot_key(boot), ch)) or _empty_channel()
            t = d.t_mono_ns
            # Each segment's rows as a slice [first, end) of the channel's arrays (no
            # per-row segment array: 10 M rows a channel at a study's scale).
            present = d.seg_counts > 0
            numbers = d.seg_numbers[present]
            seg_hi = np.cumsum(d.seg_counts[present])
            seg_lo = seg_hi - d.seg_counts[present]
            # Empty power readings: dropped; the time around them is invalid.
            if len(d.nopower_t_ns):
                lo, hi = _around(t, d.nopower_t_ns)
                add(ch, boot, lo, hi, InvalidScope.ALL,
                    "power_w missing (or outside its valid range)")
            # Negative power (a reversed CT): flag the time around it, with the fix.
            neg = d.power_w < -NEGATIVE_POWER_TOLERANCE_W
            if neg.any():
                lo, hi = _around(t, t[neg])
                add(ch, boot, lo, hi, InvalidScope.ALL, REVERSED_CT_HINT)
            # Between segments.
            cut = seg_hi[:-1] - 1
            add(ch, boot, t[cut], t[cut + 1], InvalidScope.ALL,
                np.array([f"gap between trace segments {a} and {b}" for a, b in
                          zip(numbers[:-1].tolist(), numbers[1:].tolist(), strict=True)],
                         dtype=object))
            # Long sample gaps inside a segment (its channel's own period, else the segment's).
            longg = np.concatenate([np.zeros(0, np.int64), *(
                np.flatnonzero(np.diff(t[a:b]) > max_gap_periods * chan_period.get(
                    (n, ch), period_lut[n]) * 1e9) + a
                for n, a, b in zip(numbers.tolist(), seg_lo.tolist(), seg_hi.tolist(),
                                   strict=True))])
            add(ch, boot, t[longg], t[longg + 1], InvalidScope.ALL,
                f"sample gap longer than {max_gap_periods:g} scheduled periods")
            # Fault events for this channel or the whole board.
            fc = faults[faults["channel"].isna() | (faults["channel"] == ch)]
            if len(fc):
                at = fc["t_mono_ns"].to_numpy(dtype=np.int64)
                end = np.array([_gap_end(k, d) for k, d in zip(
                    fc["kind"], fc["detail"], strict=True)], dtype=np.int64)
                # No event time: the gap is known by its end only (start = last sample before).
                at = np.where(at == INT64_MIN, end, at)
                keep = at != INT64_MIN
                fc, at, end = fc[keep], at[keep], end[keep]
                lo, hi = _around(t, at)
                has_end = end != INT64_MIN
                _, after_end = _around(t, end)
                hi = np.where(has_end, np.maximum(hi, after_end), hi)
                kinds = fc["kind"].to_numpy(dtype=object)
                why = np.array(
                    [f"{k} event" + (f" ({d})" if d else "") if k in FAULT_EVENTS
                     else f"unknown event kind {k!r}" for k, d in
                     zip(kinds, fc["detail"].to_numpy(dtype=object), strict=True)], dtype=object)
                add(ch, boot, lo, hi, InvalidScope.ALL, why)
            # SysStatus: AdjErr freezes measurements (all), CalErr freezes energy (counter).
            if len(d.adjerr_t_ns):
                lo, hi = _around(t, d.adjerr_t_ns)
                add(ch, boot, lo, hi, InvalidScope.ALL, "SysStatus AdjErr (measurements frozen)")
            if len(d.calerr_t_ns):
                lo, hi = _around(t, d.calerr_t_ns)
                add(ch, boot, lo, hi, InvalidScope.COUNTER,
                    "SysStatus CalErr (energy metering frozen)")
            # The counter restarts each segment; a decrease (or reset) within one means the
            # count was lost: every later value of that segment is on another base, so the
            # counter is invalid from the last sample before the decrease to the segment's end.
            e = d.energy_j
            dec_seg = [(np.flatnonzero(np.diff(e[a:b]) < 0) + a, int(t[b - 1]))
                       for a, b in zip(seg_lo.tolist(), seg_hi.tolist(), strict=True)]
            dec = np.concatenate([np.zeros(0, np.int64), *(i for i, _ in dec_seg)])
            if len(dec):
                ends = np.array([max(last, int(t[i + 1])) for idx, last in dec_seg
                                 for i in idx.tolist()], dtype=np.int64)
                add(ch, boot, t[dec], ends, InvalidScope.COUNTER,
                    "energy_j decreased or reset inside a segment (counter invalid to the "
                    "segment's end)")
    if not rows:
        return pd.DataFrame({"channel": pd.Series([], dtype=np.int64),
                             "boot_key": pd.Series([], dtype=object),
                             "start_ns": pd.Series([], dtype=np.int64),
                             "end_ns": pd.Series([], dtype=np.int64),
                             "scope": pd.Series([], dtype=object),
                             "reason": pd.Series([], dtype=object)})
    out = pd.concat(rows, ignore_index=True)
    out["boot_key"] = out["boot_key"].astype(object)
    return out


def read_trace(path: str | Path, *, max_gap_periods: float = 3.0, cache: bool = True) -> Trace:
    """Read and validate TRACE_DIR (through `epi.formats.trace`); one-line `UserError`.

    With `cache` (the default) the samples come from the columnar cache beside the CSV
    segments, built or rebuilt as needed (host/analysis/trace_cache.py); the result is the
    same either way."""
    reader = CachedSamplesReader(Path(path)) if cache and Path(path).is_dir() else \
        fmt.read_samples
    raw = fmt.read_trace(path, samples_reader=reader)
    for seg in raw.segments:
        if not seg.channels:
            raise UserError(f"{seg.meta_path}: field channels must be a non-empty list")
        recorded = set(seg.ends)  # the channels with rows in this segment
        for ch, info in seg.channels.items():
            # a segment without rows (a bridge stopped before the MCU's hello, or one that
            # refused it) needs no meter constant: no count of it is turned into joules
            if info.meter_constant_imp_per_kwh is None and info.source is None \
                    and ch in recorded:
                raise UserError(f"{seg.meta_path}: field channels[{ch}]."
                                "meter_constant_imp_per_kwh is missing (expected a number > 0)")
    channels = raw.channels
    all_events = pd.concat([_event_frame(s) for s in raw.segments], ignore_index=True)
    data, domains = _collect(raw.segments, channels)
    invalid = _invalid_intervals(data, all_events, raw.segments, sorted(channels),
                                 max_gap_periods)
    return Trace(raw.path, raw.segments, channels, all_events, invalid, data, domains,
                 list(raw.notes))
