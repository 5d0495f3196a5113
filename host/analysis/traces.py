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
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from epi.core.errors import UserError
from epi.formats import trace as fmt
from epi.formats.trace import FAULT_EVENTS, INFO_EVENTS, Segment
from epi.formats.trace import ChannelMeta as ChannelInfo
from host.analysis.align import INT64_MAX, INT64_MIN, ChannelSeries, Intervals

CALERR_MASK = 0xC000  # SysStatus CalErr: energy metering frozen → counter invalid
ADJERR_MASK = 0x3000  # SysStatus AdjErr: measurement registers frozen → power invalid
# Register full scale of the ATM90E26 (Irms 65.535 A, Pmean ±32.767 kW): readings at it saturate.
FULL_SCALE_CURRENT_A = 65.535
FULL_SCALE_POWER_W = 32767.0
# A reading below this is not noise around 0 W but a reversed CT (or a wrong calibration sign).
NEGATIVE_POWER_TOLERANCE_W = 0.5
REVERSED_CT_HINT = ("negative power_w (CT reversed? turn the CT so its arrow points to the load, "
                    "or check the calibration sign)")

@dataclass
class Trace:
    """A validated trace directory.

    `samples` holds every valid-format row (plus `segment`); `events` every event (plus
    `segment`); `invalid` the per-channel invalid intervals (`channel`, `boot_key`, `start_ns`,
    `end_ns`, `scope` = "all" or "counter", `reason`).
    """

    path: Path
    segments: list[Segment]
    channels: dict[int, ChannelInfo]
    samples: pd.DataFrame
    events: pd.DataFrame
    invalid: pd.DataFrame
    notes: list[str] = field(default_factory=list)

    @property
    def boot_ids(self) -> list[str | None]:
        return list(dict.fromkeys(s.boot_id for s in self.segments))

    @property
    def emulated(self) -> bool:
        return any(bool(s.meta.get("emulated")) for s in self.segments)

    @property
    def power_models(self) -> list[object]:
        return [s.meta.get("power_model") for s in self.segments if s.meta.get("power_model")]

    def clock_simulated(self, boot_id: str | None) -> bool:
        """Whether the segments of this clock domain were timed by a simulated clock."""
        return any((s.meta.get("clock") or {}).get("kind") == "simulated"
                   for s in self.segments if s.boot_id == boot_id)

    def domain_samples(self, boot_id: str | None) -> pd.DataFrame:
        segs = [s.number for s in self.segments if s.boot_id == boot_id]
        return self.samples[self.samples["segment"].isin(segs)]

    def coverage_ns(self, boot_id: str | None) -> tuple[int, int] | None:
        """(first, last) sample time in this clock domain, or None when it has no samples."""
        s = self.domain_samples(boot_id)
        if s.empty:
            return None
        return int(s["t_mono_ns"].min()), int(s["t_mono_ns"].max())

    def real_coverage_ns(self, boot_id: str | None) -> tuple[int, int] | None:
        s = self.domain_samples(boot_id)
        if s.empty:
            return None
        return int(s["t_real_ns"].min()), int(s["t_real_ns"].max())

    def series(self, channel: int, boot_id: str | None) -> ChannelSeries:
        """The aligner's view of one channel in one clock domain."""
        s = self.domain_samples(boot_id)
        s = s[s["channel"] == channel]
        good = s["power_w"].notna().to_numpy()
        s = s[good]
        seg = s["segment"].to_numpy()
        starts = np.flatnonzero(np.r_[True, seg[1:] != seg[:-1]]) if len(seg) else np.zeros(
            1, np.int64)
        inv = self.invalid[(self.invalid["channel"] == channel)
                           & (self.invalid["boot_key"] == _boot_key(boot_id))]
        all_scope = inv[inv["scope"] == "all"]
        ctr_scope = inv[inv["scope"] == "counter"]
        info = self.channels.get(channel)
        dead = None
        if not good.any():
            dom = self.domain_samples(boot_id)
            if len(s_all := dom[dom["channel"] == channel]):
                dead = (f"channel {channel}: dead channel ({len(s_all)} reading(s) in this "
                        "clock domain, none with a valid power_w)")
            elif len(dom):
                dead = (f"channel {channel}: dead channel (no readings, while other channels "
                        f"have {len(dom)})")
        return ChannelSeries(
            channel=channel,
            t_mono_ns=s["t_mono_ns"].to_numpy(dtype=np.int64),
            power_w=s["power_w"].to_numpy(dtype=np.float64),
            energy_j=s["energy_j"].to_numpy(dtype=np.float64),
            seg_start_idx=starts.astype(np.int64),
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
        s = self.domain_samples(boot_id)
        s = s[(s["channel"] == channel) & (s["t_mono_ns"] >= t0_ns) & (s["t_mono_ns"] <= t1_ns)]
        limit_a = FULL_SCALE_CURRENT_A
        info = self.channels.get(channel)
        ct = info.ct if info else None
        if isinstance(ct, dict):
            for key in ("max_current_a", "rated_current_a", "max_a", "rated_a"):
                if isinstance(ct.get(key), (int, float)):
                    limit_a = min(limit_a, float(ct[key]))
                    break
        sat = (s["current_a"].to_numpy() >= limit_a) | (
            np.abs(s["power_w"].to_numpy()) >= FULL_SCALE_POWER_W)
        return int(np.nansum(sat))


def _sample_frame(seg: Segment) -> pd.DataFrame:
    """One segment's samples as a frame (ints exact, empty floats NaN, empty status 0)."""
    c = seg.columns
    out = pd.DataFrame({"segment": np.full(seg.n_samples, seg.number, dtype=np.int64)})
    for col in ("seq", "channel", "t_mono_ns", "t_real_ns"):
        out[col] = np.array(c[col], dtype=np.int64)
    for col in ("power_w", "voltage_v", "current_a", "power_factor", "frequency_hz", "energy_j"):
        out[col] = np.array(c[col], dtype=np.float64)  # None (an empty field) becomes NaN
    st = c["status"]
    out["status"] = np.array([0 if v is None else v for v in st] if None in st else st,
                             dtype=np.int64)
    return out


def _event_frame(seg: Segment) -> pd.DataFrame:
    ev = seg.events

    def ints(key: str) -> np.ndarray:
        return np.array([INT64_MIN if e[key] is None else e[key] for e in ev], dtype=np.int64)

    return pd.DataFrame({
        "segment": np.full(len(ev), seg.number, dtype=np.int64),
        "t_mono_ns": ints("t_mono_ns"),
        "t_real_ns": ints("t_real_ns"),
        "channel": pd.array([e["channel"] for e in ev], dtype="Int64"),
        "kind": np.array([e["kind"] for e in ev], dtype=object),
        "detail": np.array([e["detail"] for e in ev], dtype=object),
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
    if kind != "gap":
        return INT64_MIN
    end, _, _ = fmt.parse_gap_detail(detail)
    return INT64_MIN if end is None else end


def _invalid_intervals(samples: pd.DataFrame, events: pd.DataFrame, segments: list[Segment],
                       channels: Iterable[int], max_gap_periods: float) -> pd.DataFrame:
    rows: list[pd.DataFrame] = []
    seg_boot = {s.number: s.boot_id for s in segments}
    period_lut = np.full(max(s.number for s in segments) + 1, np.nan)
    for s in segments:
        if s.sample_period_s is not None:  # given, or inferred by the reader (noted)
            period_lut[s.number] = s.sample_period_s
    # A software source's channel has its own period (docs/sources.md).
    chan_period = {(s.number, ch): info.sample_period_s for s in segments
                   for ch, info in s.channels.items() if info.sample_period_s is not None}

    def add(ch: int, boot: str | None, lo: np.ndarray, hi: np.ndarray, scope: str,
            reasons: np.ndarray | str) -> None:
        if len(lo):
            rows.append(pd.DataFrame({"channel": ch, "boot_key": _boot_key(boot), "start_ns": lo,
                                      "end_ns": hi, "scope": scope, "reason": reasons}))

    for boot in dict.fromkeys(seg_boot.values()):
        segs = {n for n, b in seg_boot.items() if b == boot}
        dom = samples[samples["segment"].isin(segs)]
        ev = events[events["segment"].isin(segs)]
        faults = ev[~ev["kind"].isin(INFO_EVENTS)]
        for ch in channels:  # a handful of channels
            s = dom[dom["channel"] == ch]
            t_all = s["t_mono_ns"].to_numpy()
            # Empty power readings: drop them and invalidate the time around them.
            nopow = s["power_w"].isna().to_numpy()
            good = s[~nopow]
            t = good["t_mono_ns"].to_numpy()
            seg = good["segment"].to_numpy()
            if nopow.any():
                lo, hi = _around(t, t_all[nopow])
                add(ch, boot, lo, hi, "all", "power_w missing (or outside its valid range)")
            # Negative power (a reversed CT): flag the time around it, with the fix.
            neg = (good["power_w"] < -NEGATIVE_POWER_TOLERANCE_W).to_numpy()
            if neg.any():
                lo, hi = _around(t, t[neg])
                add(ch, boot, lo, hi, "all", REVERSED_CT_HINT)
            # Between segments.
            cut = np.flatnonzero(seg[1:] != seg[:-1])
            add(ch, boot, t[cut], t[cut + 1], "all",
                np.array([f"gap between trace segments {seg[i]} and {seg[i + 1]}" for i in cut],
                         dtype=object))
            # Long sample gaps inside a segment.
            per = period_lut[seg[:-1]] if len(seg) > 1 else np.zeros(0)
            for (g, c), p in chan_period.items():
                if c == ch and len(per):
                    per = np.where(seg[:-1] == g, p, per)
            dt = np.diff(t)
            longg = np.flatnonzero((seg[1:] == seg[:-1]) & (dt > max_gap_periods * per * 1e9))
            add(ch, boot, t[longg], t[longg + 1], "all",
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
                add(ch, boot, lo, hi, "all", why)
            # SysStatus: AdjErr freezes measurements (all), CalErr freezes energy (counter).
            st = good["status"].to_numpy()
            adj = (st & ADJERR_MASK) != 0
            if adj.any():
                lo, hi = _around(t, t[adj])
                add(ch, boot, lo, hi, "all", "SysStatus AdjErr (measurements frozen)")
            cal = (st & CALERR_MASK) != 0
            if cal.any():
                lo, hi = _around(t, t[cal])
                add(ch, boot, lo, hi, "counter", "SysStatus CalErr (energy metering frozen)")
            # The counter restarts each segment; a decrease (or reset) within one means the
            # count was lost: every later value of that segment is on another base, so the
            # counter is invalid from the last sample before the decrease to the segment's end.
            e = good["energy_j"].to_numpy()
            dec = np.flatnonzero((np.diff(e) < 0) & (seg[1:] == seg[:-1]))
            if len(dec):
                seg_end = {int(n): int(t[seg == n][-1]) for n in np.unique(seg[dec])}
                ends = np.array([max(seg_end[int(seg[i])], int(t[i + 1])) for i in dec],
                                dtype=np.int64)
                add(ch, boot, t[dec], ends, "counter",
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


def read_trace(path: str | Path, *, max_gap_periods: float = 3.0) -> Trace:
    """Read and validate TRACE_DIR (through `epi.formats.trace`); one-line `UserError`."""
    raw = fmt.read_trace(path)
    for seg in raw.segments:
        if not seg.channels:
            raise UserError(f"{seg.meta_path}: field channels must be a non-empty list")
        for ch, info in seg.channels.items():
            if info.meter_constant_imp_per_kwh is None and info.source is None:
                raise UserError(f"{seg.meta_path}: field channels[{ch}]."
                                "meter_constant_imp_per_kwh is missing (expected a number > 0)")
    channels = raw.channels
    all_samples = pd.concat([_sample_frame(s) for s in raw.segments], ignore_index=True)
    all_events = pd.concat([_event_frame(s) for s in raw.segments], ignore_index=True)
    invalid = _invalid_intervals(all_samples, all_events, raw.segments, sorted(channels),
                                 max_gap_periods)
    return Trace(raw.path, raw.segments, channels, all_samples, all_events, invalid,
                 list(raw.notes))
