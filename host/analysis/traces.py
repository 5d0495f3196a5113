"""Read a meter trace directory (docs/formats.md §1) into validated arrays for the aligner.

What the reader guarantees, so the aligner need not check again:
* every segment's meta has `format == "epi-trace"` and a `format_version` this reader knows;
* segments of one boot id (one monotonic clock) are joined in order; each channel's timestamps
  strictly increase within and across segments (unsorted or duplicated → one-line `UserError`);
* a final line without its newline (a record cut by `kill -9`) is dropped, as the format says;
* time with no valid data becomes per-channel invalid intervals with a reason: the span between
  segments, the span around every fault event (`gap`, `bus_error`, `chip_reset`, `reinit`,
  `absent`, `checksum_error`, or an unknown kind), around readings whose SysStatus shows frozen
  metering or measurement (CalErr / AdjErr) or whose `power_w` is empty, and sample gaps longer
  than `max_gap_periods` scheduled periods.
"""

from __future__ import annotations

import io
import json
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from epi.core.errors import UserError
from host.analysis.align import INT64_MAX, INT64_MIN, ChannelSeries, Intervals

TRACE_FORMAT = "epi-trace"
TRACE_VERSION = 1
SEG_RE = re.compile(r"^seg-(\d{6})\.meta\.json$")
GAP_DETAIL_RE = re.compile(r"^end_mono_ns=(-?\d*) end_real_ns=(-?\d*);")

SAMPLE_COLUMNS = [
    "seq", "channel", "t_mono_ns", "t_real_ns", "power_w", "voltage_v", "current_a",
    "power_factor", "frequency_hz", "energy_j", "status",
]
EVENT_COLUMNS = ["t_mono_ns", "t_real_ns", "channel", "kind", "detail"]
INFO_EVENTS = frozenset({"start", "stop", "late", "counter_wrap"})
FAULT_EVENTS = frozenset({"bus_error", "chip_reset", "reinit", "absent", "checksum_error", "gap",
                          "counter_backwards", "counter_frozen", "permission_denied",
                          "read_error"})
CALERR_MASK = 0xC000  # SysStatus CalErr: energy metering frozen → counter invalid
ADJERR_MASK = 0x3000  # SysStatus AdjErr: measurement registers frozen → power invalid
# Register full scale of the ATM90E26 (Irms 65.535 A, Pmean ±32.767 kW): readings at it saturate.
FULL_SCALE_CURRENT_A = 65.535
FULL_SCALE_POWER_W = 32767.0


def read_csv_records(path: Path, columns: list[str]) -> tuple[pd.DataFrame, bool]:
    """Read an append-only CSV; drop a final line without newline. Returns (frame, truncated)."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise UserError(f"{path}: cannot read ({exc.strerror})") from exc
    truncated = bool(data) and not data.endswith(b"\n")
    if truncated:
        data = data[: data.rfind(b"\n") + 1]
    # A power cut can leave NUL-filled blocks at the end: drop such final lines too.
    while b"\x00" in data[data.rfind(b"\n", 0, len(data) - 1) + 1 :]:
        data = data[: data.rfind(b"\n", 0, len(data) - 1) + 1]
        truncated = True
    if not data.strip():
        raise UserError(f"{path}: empty file (no header line)")
    try:
        frame = pd.read_csv(io.BytesIO(data), dtype=str, keep_default_na=False, na_filter=False)
    except (pd.errors.ParserError, UnicodeDecodeError) as exc:
        raise UserError(f"{path}: not a valid CSV file ({str(exc).splitlines()[0]})") from exc
    missing = [c for c in columns if c not in frame.columns]
    if missing:
        raise UserError(f"{path}: missing column(s) {', '.join(missing)}")
    return frame, truncated


def int_column(frame: pd.DataFrame, col: str, path: Path, *, nullable: bool = False) -> np.ndarray:
    """Parse a column of integers exactly; empty only when nullable (→ INT64_MIN sentinel)."""
    text = frame[col].astype(str)
    empty = (text == "").to_numpy()
    if empty.any() and not nullable:
        row = int(np.flatnonzero(empty)[0]) + 2
        raise UserError(f"{path}: line {row}: column {col} is empty (an integer is required)")
    filled = text.where(~empty, "0")
    bad = ~filled.str.fullmatch(r"[+-]?\d{1,19}").to_numpy(dtype=bool)
    if bad.any():
        row = int(np.flatnonzero(bad)[0])
        raise UserError(
            f"{path}: line {row + 2}: column {col} is not an integer ({text.iloc[row]!r})")
    out = pd.to_numeric(filled).to_numpy()
    if out.dtype != np.int64:
        raise UserError(f"{path}: column {col} has integers outside the 64-bit range")
    if nullable:
        out = np.where(empty, INT64_MIN, out)
    return out


def float_column(frame: pd.DataFrame, col: str, path: Path) -> np.ndarray:
    """Parse a column of floats; empty fields are NaN (missing, never 0)."""
    text = frame[col].astype(str)
    empty = (text == "").to_numpy()
    vals = pd.to_numeric(text.where(~empty, "nan"), errors="coerce").to_numpy(dtype=np.float64)
    bad = np.isnan(vals) & ~empty & (text.str.lower() != "nan").to_numpy(dtype=bool)
    if bad.any():
        row = int(np.flatnonzero(bad)[0])
        raise UserError(
            f"{path}: line {row + 2}: column {col} is not a number ({text.iloc[row]!r})")
    return vals


def read_json(path: Path) -> dict:
    """Load a JSON object file, one-line errors."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise UserError(f"{path}: cannot read ({exc.strerror})") from exc
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UserError(f"{path}: not valid JSON (line {exc.lineno}: {exc.msg})") from exc
    if not isinstance(data, dict):
        raise UserError(f"{path}: expected a JSON object")
    return data


def check_format(data: dict, path: Path, fmt: str, version: int) -> int:
    """Refuse an unknown format or a format_version newer than `version`."""
    if data.get("format") != fmt:
        raise UserError(f"{path}: field format is {data.get('format')!r}, expected {fmt!r}")
    ver = data.get("format_version")
    if not isinstance(ver, int) or isinstance(ver, bool) or ver < 1:
        raise UserError(f"{path}: field format_version is {ver!r}, expected an integer ≥ 1")
    if ver > version:
        raise UserError(
            f"{path}: format_version {ver} is newer than this reader knows ({version}); "
            "upgrade epi"
        )
    return ver


@dataclass(frozen=True)
class ChannelInfo:
    """One channel of the board as the trace's meta describes it."""

    channel: int
    name: str
    node: str | None
    meter_constant_imp_per_kwh: float | None
    ct: object = None
    # software power sources (docs/sources.md): absent keys mean a wall-meter channel
    scope: str = "wall"
    source: str | None = None
    resolution_j: float | None = None
    sample_period_s: float | None = None

    @property
    def counter_resolution_j(self) -> float:
        """Energy of 0.1 pulse, the energy registers' resolution (J); NaN if unknown."""
        mc = self.meter_constant_imp_per_kwh
        if not mc and self.resolution_j:
            return self.resolution_j
        return 0.1 * 3.6e6 / mc if mc else float("nan")


@dataclass(frozen=True)
class Segment:
    number: int
    meta_path: Path
    meta: dict
    boot_id: str | None
    truncated_samples: bool
    truncated_events: bool


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


def _channel_infos(meta: dict, path: Path) -> dict[int, ChannelInfo]:
    chans = meta.get("channels")
    if not isinstance(chans, list) or not chans:
        raise UserError(f"{path}: field channels must be a non-empty list")
    out: dict[int, ChannelInfo] = {}
    for i, c in enumerate(chans):
        if not isinstance(c, dict) or not isinstance(c.get("channel"), int):
            raise UserError(f"{path}: channels[{i}].channel must be an integer")
        node = c.get("node")
        if node is not None and not isinstance(node, str):
            raise UserError(f"{path}: channels[{i}].node must be a string or null")
        mc = c.get("meter_constant_imp_per_kwh")
        out[c["channel"]] = ChannelInfo(
            channel=c["channel"], name=str(c.get("name", f"ch{c['channel']}")), node=node,
            meter_constant_imp_per_kwh=float(mc) if isinstance(mc, (int, float)) else None,
            ct=c.get("ct"), **_source_fields(c),
        )
    return out


def _source_fields(c: dict) -> dict:
    """The software-source keys of a channel entry (docs/formats.md §1), passed through."""
    out: dict = {}
    if isinstance(c.get("scope"), str):
        out["scope"] = c["scope"]
    if isinstance(c.get("source"), str):
        out["source"] = c["source"]
    for key in ("resolution_j", "sample_period_s"):
        v = c.get(key)
        if isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0:
            out[key] = float(v)
    return out


def _read_samples(path: Path, number: int) -> tuple[pd.DataFrame, bool]:
    frame, truncated = read_csv_records(path, SAMPLE_COLUMNS)
    out = pd.DataFrame({
        "segment": np.full(len(frame), number, dtype=np.int64),
        "seq": int_column(frame, "seq", path),
        "channel": int_column(frame, "channel", path),
        "t_mono_ns": int_column(frame, "t_mono_ns", path),
        "t_real_ns": int_column(frame, "t_real_ns", path),
    })
    for col in ("power_w", "voltage_v", "current_a", "power_factor", "frequency_hz", "energy_j"):
        out[col] = float_column(frame, col, path)
    status = int_column(frame, "status", path, nullable=True)
    out["status"] = np.where(status == INT64_MIN, 0, status)
    # Timestamps strictly increase per channel within a segment.
    for ch, grp in out.groupby("channel", sort=False):  # per channel (a handful), not per sample
        t = grp["t_mono_ns"].to_numpy()
        bad = np.flatnonzero(np.diff(t) <= 0)
        if len(bad):
            line = int(grp.index[bad[0] + 1]) + 2
            what = "duplicated" if t[bad[0] + 1] == t[bad[0]] else "unsorted"
            raise UserError(f"{path}: line {line}: channel {ch} t_mono_ns is {what} "
                            f"({t[bad[0] + 1]} after {t[bad[0]]})")
    return out, truncated


def _read_events(path: Path, number: int) -> tuple[pd.DataFrame, bool]:
    if not path.exists():
        return pd.DataFrame({c: [] for c in ["segment", *EVENT_COLUMNS]}), False
    frame, truncated = read_csv_records(path, EVENT_COLUMNS)
    ch = int_column(frame, "channel", path, nullable=True)
    return pd.DataFrame({
        "segment": np.full(len(frame), number, dtype=np.int64),
        "t_mono_ns": int_column(frame, "t_mono_ns", path, nullable=True),
        "t_real_ns": int_column(frame, "t_real_ns", path, nullable=True),
        "channel": pd.array([None if c == INT64_MIN else int(c) for c in ch], dtype="Int64"),
        "kind": frame["kind"].to_numpy(dtype=object),
        "detail": frame["detail"].to_numpy(dtype=object),
    }), truncated


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
    m = GAP_DETAIL_RE.match(detail or "") if kind == "gap" else None
    return int(m.group(1)) if m and m.group(1) else INT64_MIN


def _invalid_intervals(samples: pd.DataFrame, events: pd.DataFrame, segments: list[Segment],
                       channels: Iterable[int], max_gap_periods: float) -> pd.DataFrame:
    rows: list[pd.DataFrame] = []
    seg_boot = {s.number: s.boot_id for s in segments}
    period_lut = np.full(max(s.number for s in segments) + 1, np.nan)
    for s in segments:
        p = s.meta.get("sample_period_s")
        if isinstance(p, (int, float)) and p > 0:
            period_lut[s.number] = float(p)
    # A software source's channel has its own period (docs/sources.md).
    chan_period = {(s.number, c["channel"]): c["sample_period_s"] for s in segments
                   for c in s.meta.get("channels", []) if isinstance(c, dict)
                   and isinstance(c.get("sample_period_s"), (int, float))
                   and c["sample_period_s"] > 0}

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
                add(ch, boot, lo, hi, "all", "power_w missing")
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
            # The counter restarts each segment; a decrease within one means a lost count.
            e = good["energy_j"].to_numpy()
            dec = np.flatnonzero((np.diff(e) < 0) & (seg[1:] == seg[:-1]))
            add(ch, boot, t[dec], t[dec + 1], "counter", "energy_j decreased")
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
    """Read and validate TRACE_DIR; raise `UserError` (one line) on anything malformed."""
    root = Path(path)
    if not root.is_dir():
        raise UserError(f"{root}: trace directory not found")
    metas = sorted(p for p in root.iterdir() if SEG_RE.match(p.name))
    if not metas:
        raise UserError(f"{root}: no seg-NNNNNN.meta.json files (not an epi trace directory)")
    segments: list[Segment] = []
    samples: list[pd.DataFrame] = []
    events: list[pd.DataFrame] = []
    channels: dict[int, ChannelInfo] | None = None
    first_meta: Path | None = None
    notes: list[str] = []
    for mp in metas:
        number = int(SEG_RE.match(mp.name).group(1))  # type: ignore[union-attr]
        meta = read_json(mp)
        check_format(meta, mp, TRACE_FORMAT, TRACE_VERSION)
        if meta.get("segment") != number:
            raise UserError(f"{mp}: field segment is {meta.get('segment')!r}, the file name "
                            f"says {number}")
        chans = _channel_infos(meta, mp)
        if channels is None:
            channels, first_meta = chans, mp
        else:
            a = {c: (i.node, i.name) for c, i in channels.items()}
            b = {c: (i.node, i.name) for c, i in chans.items()}
            if a != b:
                diff = sorted(set(a.items()) ^ set(b.items()))
                raise UserError(f"{mp}: channels differ from {first_meta.name} "  # type: ignore
                                f"(channel map mismatch at {diff[0]})")
        sp = root / f"seg-{number:06d}.samples.csv"
        if sp.exists():
            seg_samples, trunc_s = _read_samples(sp, number)
        else:
            seg_samples, trunc_s = pd.DataFrame(columns=["segment", *SAMPLE_COLUMNS]), False
        unknown = set(seg_samples["channel"].unique()) - set(chans)
        if unknown:
            raise UserError(f"{sp}: channel {sorted(unknown)[0]} is not in {mp.name} channels")
        ep = root / f"seg-{number:06d}.events.csv"
        seg_events, trunc_e = _read_events(ep, number)
        for flag, p in ((trunc_s, sp), (trunc_e, ep)):
            if flag:
                notes.append(f"{p.name}: dropped a truncated final line")
        segments.append(Segment(number, mp, meta, meta.get("boot_id"), trunc_s, trunc_e))
        samples.append(seg_samples)
        events.append(seg_events)
    assert channels is not None
    all_samples = pd.concat(samples, ignore_index=True) if samples else pd.DataFrame()
    all_events = pd.concat(events, ignore_index=True)
    for c in ("segment", "seq", "channel", "t_mono_ns", "t_real_ns", "status"):
        all_samples[c] = all_samples[c].astype(np.int64)
    # Segments of one clock domain must follow each other in time, per channel.
    for boot in dict.fromkeys(s.boot_id for s in segments):
        nums = [s.number for s in segments if s.boot_id == boot]
        dom = all_samples[all_samples["segment"].isin(nums)]
        for ch, grp in dom.groupby("channel", sort=False):
            t = grp["t_mono_ns"].to_numpy()
            bad = np.flatnonzero(np.diff(t) <= 0)
            if len(bad):
                seg = grp["segment"].to_numpy()
                raise UserError(
                    f"{root}: segment {seg[bad[0] + 1]} channel {ch} t_mono_ns "
                    f"{t[bad[0] + 1]} is not after segment {seg[bad[0]]}'s {t[bad[0]]} "
                    "(unsorted or overlapping segments of one boot)")
    invalid = _invalid_intervals(all_samples, all_events, segments, sorted(channels),
                                 max_gap_periods)
    return Trace(root, segments, channels, all_samples, all_events, invalid, notes)
