"""The meter trace reader (docs/formats.md §1): one parser, used by the daemon's own tools,
the analysis (through the pandas view in `host.analysis.traces`) and the tests.

A trace is a directory of segments ``seg-NNNNNN.{meta.json,samples.csv,events.csv}``; every
daemon start appends one. This reader:

* checks every segment's meta (format and version, segment number, boot id, channels with
  their meter constants, `sample_period_s`, start times, stats), refusing a wrong type, a
  non-finite number or a value outside its documented range with one line naming the file and
  field; a segment *without* `sample_period_s` gets the period inferred from its samples, and a
  note says so;
* parses samples and events column by column (fast enough for hours of 20 Hz data in pure
  Python) and checks every field's type, range and finiteness; per channel, `t_mono_ns`
  strictly increases within a segment and across the segments of one boot;
* drops a final record cut by a crash (no newline, or damaged, or NUL-filled by a power cut)
  and counts it; a damaged record anywhere else is an error;
* refuses a segment that has a meta.json but lacks samples.csv or events.csv (its faults
  would be lost), and skips one killed before its meta.json (header-only CSV files);
* lists gaps: `gap` events and the spans between segments.

Standard library only: the meter side runs without numpy or pandas.
"""

from __future__ import annotations

import csv
import itertools
import math
import operator
import os
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, NamedTuple, Protocol, overload

from epi.core.errors import UserError
from epi.core.vocabulary import Word
from epi.formats.fields import (
    INT64_MAX,
    NAME_MAX_CHARS,
    check_float,
    check_format,
    check_int,
    check_str,
    decode_complete_lines,
    read_bytes,
    read_json_object,
)
from epi.formats.json_types import JSONObject

TRACE_FORMAT = "epi-trace"
TRACE_FORMAT_VERSION = 1


class SampleRow(NamedTuple):
    """One row of samples.csv, its fields in the file's column order (None: an empty field).
    The one list of the sample columns: SAMPLE_COLUMNS is its field names."""

    seq: int | None
    channel: int | None
    t_mono_ns: int | None
    t_real_ns: int | None
    power_w: float | None
    voltage_v: float | None
    current_a: float | None
    power_factor: float | None
    frequency_hz: float | None
    energy_j: float | None
    status: int | None


SAMPLE_COLUMNS: tuple[str, ...] = SampleRow._fields
# one column of samples.csv as this reader builds it (None: an empty field)
SampleColumn = Sequence[int | float | None]


class TraceEvent(NamedTuple):
    """One row of events.csv, its fields in the file's column order (None: an empty field).
    `kind` is an EventKind's word as written (an unknown lower-case word is kept)."""

    t_mono_ns: int | None
    t_real_ns: int | None
    channel: int | None
    kind: str
    detail: str


EVENT_COLUMNS: tuple[str, ...] = TraceEvent._fields


class EventKind(Word):
    """What an event row says happened (the meter's MicroPython code writes the same words)."""

    # info: how the daemon ran
    START = "start"
    STOP = "stop"
    LATE = "late"
    SKIPPED = "skipped"
    SIGNAL = "signal"
    COUNTER_WRAP = "counter_wrap"
    MISREAD = "misread"
    # the chain's self-check disagrees beyond its allowance: the analysis flags the windows it
    # falls in, it does not invalidate them
    CHAIN_DISAGREEMENT = "chain_disagreement"
    # faults: they invalidate the time around them
    BUS_ERROR = "bus_error"
    CHIP_RESET = "chip_reset"
    REINIT = "reinit"
    ABSENT = "absent"
    CHECKSUM_ERROR = "checksum_error"
    GAP = "gap"
    IMPLAUSIBLE = "implausible"
    DISK_FULL = "disk_full"
    # reverse active energy on a wall-meter channel (a reversed CT, or export)
    REVERSE_ENERGY = "reverse_energy"
    # software power sources (meter/sources, docs/sources.md)
    COUNTER_BACKWARDS = "counter_backwards"
    COUNTER_FROZEN = "counter_frozen"
    PERMISSION_DENIED = "permission_denied"
    READ_ERROR = "read_error"


class GapSource(Word):
    """Where a trace's gap comes from."""

    EVENT = "event"  # a gap row in events.csv
    SEGMENTS = "segments"  # the span between two segments


# Info events say how the daemon ran; fault events invalidate the time around them.
INFO_EVENTS: frozenset[EventKind] = frozenset(
    {EventKind.START, EventKind.STOP, EventKind.LATE, EventKind.SKIPPED, EventKind.SIGNAL,
     EventKind.COUNTER_WRAP, EventKind.MISREAD, EventKind.CHAIN_DISAGREEMENT})
FAULT_EVENTS: frozenset[EventKind] = frozenset(EventKind) - INFO_EVENTS
# Software power sources a channel may name (docs/sources.md); absent: a wall-meter channel.
SOFTWARE_SOURCES: frozenset[str] = frozenset({"rapl", "hwmon", "nvml", "pmic"})
# A wall-meter channel's scope; a software source names its own (package, dram, gpu, ...).
WALL_SCOPE = "wall"
EVENT_KINDS: frozenset[str] = frozenset(EventKind.values())

# Valid ranges of every sample field (docs/formats.md §1 states the same).
MAX_CHANNEL = 255
MAX_STATUS = 0xFFFF
MAX_ABS_POWER_W = 1e6
MAX_VOLTAGE_V = 1e4
MAX_CURRENT_A = 1e4
MAX_FREQUENCY_HZ = 1e3
MAX_ABS_ENERGY_J = 1e15
MAX_SAMPLE_PERIOD_S = 3600.0
MAX_METER_CONSTANT = 1e9
# (column, lo, hi) for the float columns; power factor is a signed ratio.
FLOAT_RANGES: tuple[tuple[str, float, float], ...] = (
    ("power_w", -MAX_ABS_POWER_W, MAX_ABS_POWER_W),
    ("voltage_v", 0.0, MAX_VOLTAGE_V),
    ("current_a", 0.0, MAX_CURRENT_A),
    ("power_factor", -1.0, 1.0),
    ("frequency_hz", 0.0, MAX_FREQUENCY_HZ),
    ("energy_j", -MAX_ABS_ENERGY_J, MAX_ABS_ENERGY_J),
)

SEGMENT_RE = re.compile(r"^seg-(\d{6})\.(meta\.json|samples\.csv|events\.csv)\Z")
# A gap event's detail starts with the end of the gap so that it can be parsed back.
GAP_DETAIL_RE = re.compile(r"^end_mono_ns=(-?\d*) end_real_ns=(-?\d*);\s*(.*)$", re.S)


def segment_paths(trace_dir: Path, segment: int) -> tuple[Path, Path, Path]:
    """(meta.json, samples.csv, events.csv) of one segment."""
    stem = f"seg-{segment:06d}"
    d = Path(trace_dir)
    return d / f"{stem}.meta.json", d / f"{stem}.samples.csv", d / f"{stem}.events.csv"


def existing_segments(trace_dir: Path) -> list[int]:
    """Segment numbers present in a trace directory (any of the three files), sorted."""
    found: set[int] = set()
    if Path(trace_dir).is_dir():
        for entry in os.listdir(trace_dir):
            m = SEGMENT_RE.match(entry)
            if m:
                found.add(int(m.group(1)))
    return sorted(found)


def parse_gap_detail(detail: str) -> tuple[int | None, int | None, str]:
    """(end_mono_ns, end_real_ns, reason) of a `gap` event's detail (ends None if absent;
    ValueError for an end outside [0, 2^63))."""
    m = GAP_DETAIL_RE.match(detail or "")
    if not m:
        return None, None, detail

    def num(text: str) -> int | None:
        if text in ("", "-"):
            return None
        value = int(text)
        if not 0 <= value <= INT64_MAX:
            raise ValueError(f"gap end {value} is outside [0, 2^63)")
        return value

    return num(m.group(1)), num(m.group(2)), m.group(3)


def last_complete_sample(samples_path: Path) -> tuple[int, int] | None:
    """(t_mono_ns, t_real_ns) of the last complete, well-formed row of a samples.csv.

    Reads only the file's tail: a restarted daemon uses it to write the restart gap.
    """
    try:
        with open(samples_path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - 65536))
            tail = f.read()
    except OSError:
        return None
    for raw in reversed(tail.split(b"\n")[:-1]):  # the piece after the last newline is cut
        fields = raw.decode("utf-8", "replace").split(",")
        if len(fields) != len(SAMPLE_COLUMNS) or not fields[0].isdigit():
            continue
        try:
            t_mono, t_real = int(fields[2]), int(fields[3])
        except ValueError:
            continue
        if 0 <= t_mono <= INT64_MAX and 0 <= t_real <= INT64_MAX:
            return t_mono, t_real
    return None


# ------------------------------------------------------------------------------- data types
class Column(Protocol):
    """One sample column: a list from this reader, a numpy array from the analysis's cache."""

    def __len__(self) -> int: ...
    def __getitem__(self, index: int, /) -> Any: ...
    def __iter__(self) -> Iterator[Any]: ...


@dataclass(frozen=True)
class ChannelMeta:
    """One channel as a segment's meta describes it."""

    channel: int
    name: str
    node: str | None
    meter_constant_imp_per_kwh: float | None  # None: the meta does not give it
    ct: JSONObject | None = None  # the current transformer's fields, as the meta gives them
    # Software power sources (docs/sources.md); the defaults describe a wall-meter channel.
    scope: str = WALL_SCOPE
    source: str | None = None
    resolution_j: float | None = None
    sample_period_s: float | None = None  # the channel's own row spacing, when it has one

    @property
    def counter_resolution_j(self) -> float:
        """Energy of 0.1 pulse (a chip) or the interface's step (a software counter), J; NaN
        if unknown."""
        mc = self.meter_constant_imp_per_kwh
        if not mc and self.resolution_j:
            return self.resolution_j
        return 0.1 * 3.6e6 / mc if mc else float("nan")


@dataclass
class Gap:
    """A span with no valid data for one channel (``channel`` None: the whole board).

    ``same_clock`` is False when the two ends were written in different boots, so that only
    the realtime ends are comparable.
    """

    channel: int | None
    start_mono_ns: int | None
    end_mono_ns: int | None
    start_real_ns: int | None
    end_real_ns: int | None
    reason: str
    source: GapSource
    same_clock: bool = True


class ChannelEnds(NamedTuple):
    """A channel's first and last sample times in one segment (both clocks): where its
    segment gaps start and end, and what orders the segments of one boot."""

    first_mono_ns: int
    first_real_ns: int
    last_mono_ns: int
    last_real_ns: int

    def to_json(self) -> list[int]:
        """[first mono, first real, last mono, last real] (the analysis cache stores it)."""
        return [int(v) for v in self]

    @classmethod
    def from_json(cls, doc: Sequence[object]) -> ChannelEnds:
        """Read back `to_json`'s list; ValueError or TypeError when it is not four integers."""
        vals = [int(v) for v in doc if isinstance(v, (int, float, str))]
        if len(vals) != 4 or len(doc) != 4:
            raise ValueError(f"channel ends: expected four integers, got {list(doc)!r}")
        a, b, c, d = vals
        return cls(a, b, c, d)


@dataclass
class Segment:
    """One segment as read back: its checked meta, samples by column, events as rows."""

    number: int
    meta_path: Path
    meta: JSONObject  # the checked meta.json (its readers include the meter's soak test)
    channels: dict[int, ChannelMeta]
    sample_period_s: float | None  # None: not given and not inferable (< 2 samples)
    period_inferred: bool
    # SAMPLE_COLUMNS → values (None for an empty field); a caller's samples reader may give
    # another sequence type (the analysis: numpy arrays from its columnar cache).
    columns: Mapping[str, Column]
    events: list[TraceEvent]
    truncated_samples: int = 0  # crash-cut final records dropped
    truncated_events: int = 0
    out_of_range: list[tuple[int, str, float]] = field(default_factory=list)  # (line, col, value)
    ends: dict[int, ChannelEnds] = field(default_factory=dict)

    @property
    def boot_id(self) -> str | None:
        boot = self.meta.get("boot_id")  # check_meta: text or null
        return boot if isinstance(boot, str) else None

    @property
    def clean_stop(self) -> bool:
        stats = self.meta.get("stats")  # check_meta: an object or null
        return isinstance(stats, dict) and bool(stats.get("clean_stop", False))

    def meta_ns(self, key: str) -> int | None:
        """An integer time of the meta (``started_mono_ns``...): check_meta: an int or null."""
        value = self.meta.get(key)
        return value if isinstance(value, int) and not isinstance(value, bool) else None

    @property
    def n_samples(self) -> int:
        return len(self.columns["seq"])

    @property
    def samples(self) -> list[SampleRow]:
        """The sample rows (built on demand; `columns` is the stored form)."""
        cols = [self.columns[c] for c in SAMPLE_COLUMNS]
        return [SampleRow(*row) for row in zip(*cols, strict=True)]

    @property
    def dropped_lines(self) -> int:
        return self.truncated_samples + self.truncated_events


@dataclass
class Trace:
    """A whole trace directory: segments in order, and the gaps between and within them."""

    path: Path
    segments: list[Segment]
    gaps: list[Gap] = field(default_factory=list)
    skipped_segments: list[int] = field(default_factory=list)  # killed before their meta.json
    notes: list[str] = field(default_factory=list)

    def samples(self) -> Iterator[dict[str, int | float | None]]:
        """Every sample row of every segment, with a ``segment`` key added."""
        for seg in self.segments:
            for row in seg.samples:
                yield {"segment": seg.number, **row._asdict()}

    def events(self) -> Iterator[dict[str, int | str | None]]:
        """Every event row of every segment, with a ``segment`` key added."""
        for seg in self.segments:
            for row in seg.events:
                yield {"segment": seg.number, **row._asdict()}

    @property
    def dropped_lines(self) -> int:
        return sum(s.dropped_lines for s in self.segments)

    @property
    def channels(self) -> dict[int, ChannelMeta]:
        """The channel map (the first segment's; read_trace checks that all agree)."""
        return dict(self.segments[0].channels)


# ------------------------------------------------------------------------------- meta
def check_meta(path: Path, meta: JSONObject, number: int) -> dict[int, ChannelMeta]:
    """Check a segment's meta.json in place; return its channel map (empty if not given)."""
    check_format(meta, path, TRACE_FORMAT, TRACE_FORMAT_VERSION)
    seg = meta.get("segment", number)
    if seg != number or isinstance(seg, bool):
        raise UserError(f"{path}: field segment is {seg!r}, the file name says {number}")
    where = f"{path}: field"
    if "boot_id" in meta:
        check_str(meta["boot_id"], f"{where} boot_id", null_ok=True, max_len=NAME_MAX_CHARS)
    for key in ("started_mono_ns", "started_real_ns"):
        if key in meta:
            check_int(meta[key], f"{where} {key}", lo=0, null_ok=True)
    if "sample_period_s" in meta:
        check_float(meta["sample_period_s"], f"{where} sample_period_s", lo=0.0,
                    hi=MAX_SAMPLE_PERIOD_S, lo_open=True)
    for key in ("emulated",):
        if key in meta and not isinstance(meta[key], bool):
            raise UserError(f"{where} {key}: expected true or false, got {meta[key]!r}")
    for key in ("stats", "clock", "power_model", "board"):
        if meta.get(key) is not None and not isinstance(meta[key], dict):
            raise UserError(f"{where} {key}: expected an object or null, got {meta[key]!r}")
    stats = meta.get("stats") or {}
    if isinstance(stats, dict) and "clean_stop" in stats and not isinstance(
            stats["clean_stop"], bool):
        raise UserError(f"{where} stats.clean_stop: expected true or false")
    chans = meta.get("channels", [])
    if not isinstance(chans, list):
        raise UserError(f"{where} channels: expected a list, got {chans!r}")
    out: dict[int, ChannelMeta] = {}
    for i, c in enumerate(chans):
        w = f"{where} channels[{i}]"
        if not isinstance(c, dict):
            raise UserError(f"{w}: expected an object")
        ch = check_int(c.get("channel"), f"{w}.channel", lo=0, hi=MAX_CHANNEL)
        assert ch is not None
        if ch in out:
            raise UserError(f"{w}.channel: channel {ch} appears twice")
        name = c.get("name", f"ch{ch}")
        check_str(name, f"{w}.name", max_len=NAME_MAX_CHARS)
        node = check_str(c.get("node"), f"{w}.node", null_ok=True, max_len=NAME_MAX_CHARS)
        source = c.get("source")
        if source is not None and source not in SOFTWARE_SOURCES:
            raise UserError(f"{w}.source: {source!r} is not one of "
                            f"{', '.join(sorted(SOFTWARE_SOURCES))} (or absent: a wall channel)")
        mc = None
        if "meter_constant_imp_per_kwh" in c:
            # A software channel has no meter constant (null); a chip's is a positive number.
            mc = check_float(c["meter_constant_imp_per_kwh"], f"{w}.meter_constant_imp_per_kwh",
                             lo=0.0, hi=MAX_METER_CONSTANT, lo_open=True,
                             null_ok=source is not None)
        ct = c.get("ct")
        if ct is not None and not isinstance(ct, dict):
            raise UserError(f"{w}.ct: expected an object or null, got {ct!r}")
        # a software channel's scope is its own ("other" when not given); a wall channel's is
        # the meter's
        scope = (check_str(c.get("scope", "other"), f"{w}.scope", max_len=64)
                 if source is not None else WALL_SCOPE)
        figures = {key: check_float(c[key], f"{w}.{key}", lo=0.0, hi=MAX_SAMPLE_PERIOD_S
                                    if key == "sample_period_s" else MAX_ABS_ENERGY_J,
                                    lo_open=True, null_ok=True) if key in c else None
                   for key in ("resolution_j", "sample_period_s")}
        out[ch] = ChannelMeta(ch, name, node, mc, ct, scope=scope, source=source,
                              resolution_j=figures["resolution_j"],
                              sample_period_s=figures["sample_period_s"])
    return out


# ------------------------------------------------------------------------------- CSV files
def _read_complete_lines(path: Path) -> tuple[list[str], int]:
    """Lines that end with a newline; a cut final record (or NUL-filled tail) is dropped."""
    data = read_bytes(path, "missing (a segment with a meta.json has both CSV files; its "
                            "data or faults would be lost)")
    # Only a power-cut tail may be garbage; elsewhere, non-UTF-8 is damage.
    text, dropped = decode_complete_lines(data, str(path), garbage_tail=True)
    lines = text.split("\n")
    lines.pop()  # the empty piece after the last newline (in place: no copy of the list)
    while len(lines) > 1 and "\x00" in lines[-1]:
        lines.pop()
        dropped += 1
    return lines, dropped


class _RowError(Exception):
    """A bad sample row. `torn`: what a write cut by a crash leaves (too few fields, text
    where a number belongs); a whole number out of its range (an int64 overflow) is not
    torn: it is a wrong value, named as such even in the final line."""

    def __init__(self, index: int, message: str, *, torn: bool = True) -> None:
        super().__init__(message)
        self.index = index
        self.torn = torn


@overload
def _int_col(values: list[str], name: str, lo: int, hi: int, nullable: Literal[False]
             ) -> list[int]: ...
@overload
def _int_col(values: list[str], name: str, lo: int, hi: int, nullable: Literal[True]
             ) -> list[int | None]: ...
def _int_col(values: list[str], name: str, lo: int, hi: int, nullable: bool
             ) -> list[int] | list[int | None]:
    """An integer column; a value outside [lo, hi] or not an integer is file damage (refused),
    an empty field is None where the column may be empty."""
    try:  # fast path (C loops); the slow path below finds and names the bad row
        fast = list(map(int, values))
        if not fast or (lo <= min(fast) and max(fast) <= hi):
            return fast
    except ValueError:
        pass
    out: list[int | None] = []
    for i, v in enumerate(values):
        if not v and nullable:
            out.append(None)
            continue
        try:
            x = int(v)
        except ValueError:
            what = "empty" if not v else f"{v[:30]!r}"
            raise _RowError(i, f"column {name} is {what}, expected an integer") from None
        if not lo <= x <= hi:
            raise _RowError(i, f"column {name} is {x}, expected an integer in [{lo}, {hi}]",
                            torn=False)
        out.append(x)
    return out


def _float_col(values: list[str], name: str, lo: float, hi: float,
               out_of_range: list[tuple[int, str, float]]) -> list[float] | list[float | None]:
    """A float column; a finite reading outside [lo, hi] (a chip glitch) becomes missing and
    is listed in `out_of_range` as (row, column, value); text that is not a finite number is
    file damage (refused)."""
    try:  # fast path (C loops): no empty field, every value finite and in range
        fast = list(map(float, values))
        # A finite sum means every value is finite (an inf or NaN makes the sum inf or NaN;
        # an overflow to inf only sends valid data down the slow path).
        if not fast or (math.isfinite(sum(fast)) and lo <= min(fast) and max(fast) <= hi):
            return fast
    except ValueError:
        pass
    out: list[float | None] = []
    for i, v in enumerate(values):
        if not v:
            out.append(None)
            continue
        try:
            x = float(v)
        except ValueError:
            raise _RowError(i, f"column {name} is {v[:30]!r}, expected a number") from None
        if not math.isfinite(x):
            raise _RowError(i, f"column {name} is {v[:30]!r}, expected a finite number")
        if not lo <= x <= hi:
            out_of_range.append((i, name, x))
            out.append(None)
            continue
        out.append(x)
    return out


def _sample_columns(lines: list[str], channels: set[int] | None,
                    out_of_range: list[tuple[int, str, float]]) -> dict[str, SampleColumn]:
    n_cols = len(SAMPLE_COLUMNS)
    counts = list(map(str.count, lines, itertools.repeat(",", len(lines))))
    if lines and set(counts) != {n_cols - 1}:
        i = next(k for k, c in enumerate(counts) if c != n_cols - 1)
        raise _RowError(i, f"{counts[i] + 1} fields, expected {n_cols}")
    # One split of the whole body, then every column is a stride of it (C loops only).
    flat = ",".join(lines).split(",") if lines else []
    by = {name: flat[k::n_cols] for k, name in enumerate(SAMPLE_COLUMNS)}
    chans = _int_col(by["channel"], "channel", 0, MAX_CHANNEL, False)
    times = _int_col(by["t_mono_ns"], "t_mono_ns", 0, INT64_MAX, False)
    cols: dict[str, SampleColumn] = {
        "seq": _int_col(by["seq"], "seq", 0, INT64_MAX, False),
        "channel": chans,
        "t_mono_ns": times,
        "t_real_ns": _int_col(by["t_real_ns"], "t_real_ns", 0, INT64_MAX, False),
    }
    for name, lo, hi in FLOAT_RANGES:
        cols[name] = _float_col(by[name], name, lo, hi, out_of_range)
    cols["status"] = _int_col(by["status"], "status", 0, MAX_STATUS, True)
    present = set(chans)
    if channels and not present <= channels:
        for i, ch in enumerate(chans):
            if ch not in channels:  # field 2 of 11: a crash cut cannot reach it
                raise _RowError(i, f"channel {ch} is not in the meta's channels "
                                   f"{sorted(channels)}", torn=False)
    k = len(present)
    # The daemon writes one row per channel per sweep in a fixed order: then channel c's
    # times are a stride of the column (no per-channel copy by comparison).
    strided = (k > 0 and len(chans) % k == 0 and len(set(chans[:k])) == k
               and chans[k:] == chans[:-k])
    for i, ch in enumerate(chans[:k] if strided else present):  # a handful of channels
        ts = (times if k == 1 else times[i::k] if strided
              else list(itertools.compress(times, map(ch.__eq__, chans))))
        if all(map(operator.lt, ts, itertools.islice(ts, 1, None))):
            continue
        last: dict[int, int] = {}
        for i, (c, t) in enumerate(zip(chans, times, strict=True)):
            prev = last.get(c)
            if prev is not None and t <= prev:
                # A row with all its fields was not cut inside t_mono_ns (field 3 of 11):
                # an out-of-order time is a wrong value, even in the final row, and the
                # row it collides with may be an earlier, damaged one.
                what = "duplicated" if t == prev else "unsorted"
                raise _RowError(i, f"channel {c} t_mono_ns is {what} ({t} after {prev})",
                                torn=False)
            last[c] = t
    return {c: cols[c] for c in SAMPLE_COLUMNS}


@dataclass
class SegmentSamples:
    """One samples.csv as read and checked: columns, what was dropped, each channel's ends."""

    columns: Mapping[str, Column]
    dropped: int  # crash-cut final records
    out_of_range: list[tuple[int, str, float]]  # (file line, column, value), set to missing
    ends: dict[int, ChannelEnds]


# How a segment's samples are read: (samples.csv path, the meta's channels or None).
SamplesReader = Callable[[Path, "set[int] | None"], SegmentSamples]


def read_samples(path: Path, channels: set[int] | None = None) -> SegmentSamples:
    """A segment's samples.csv read and checked (`parse_samples`), with each channel's ends."""
    cols, dropped, odd = parse_samples(path, channels)
    return SegmentSamples(cols, dropped, odd, sample_ends(cols))


def sample_ends(columns: Mapping[str, Column]) -> dict[int, ChannelEnds]:
    """channel → its first and last sample times in these columns."""
    mono, real = columns["t_mono_ns"], columns["t_real_ns"]
    return {ch: ChannelEnds(mono[i], real[i], mono[j], real[j]) for ch, (i, j) in
            channel_ends(columns).items()}


def parse_samples(path: Path, channels: set[int] | None = None
                  ) -> tuple[dict[str, SampleColumn], int, list[tuple[int, str, float]]]:
    """A segment's samples.csv by column, checked: (columns, crash-cut records dropped,
    readings outside their valid range as (file line, column, value), set to missing)."""
    lines, dropped = _read_complete_lines(path)
    if not lines:
        raise UserError(f"{path}: empty file (no header line)")
    if tuple(lines[0].split(",")) != SAMPLE_COLUMNS:
        raise UserError(f"{path}: header {lines[0][:80]!r} is not the epi-trace v1 header")
    rows = lines
    del rows[0]  # the header (in place: no copy of the list)
    while True:
        out_of_range: list[tuple[int, str, float]] = []
        try:
            cols = _sample_columns(rows, channels, out_of_range)
            return cols, dropped, [(i + 2, name, x) for i, name, x in out_of_range]
        except _RowError as exc:
            if exc.index == len(rows) - 1 and exc.torn:  # a torn final record: a crash cut it
                rows.pop()
                dropped += 1
                continue
            raise UserError(f"{path}: line {exc.index + 2}: malformed sample row ({exc})"
                            ) from None


def _event_row(rec: list[str], channels: set[int] | None) -> TraceEvent:
    if len(rec) != len(EVENT_COLUMNS):
        raise ValueError(f"{len(rec)} fields, expected {len(EVENT_COLUMNS)}")
    t_mono, t_real, channel, kind, detail = rec
    row: dict[str, int | None] = {}
    for name, text, hi in (("t_mono_ns", t_mono, INT64_MAX), ("t_real_ns", t_real, INT64_MAX),
                           ("channel", channel, MAX_CHANNEL)):
        if text == "":
            row[name] = None
            continue
        try:
            value = int(text)
        except ValueError:
            raise ValueError(f"column {name} is {text[:30]!r}, expected an integer") from None
        if not 0 <= value <= hi:
            raise ValueError(f"column {name} is {value}, expected an integer in [0, {hi}]")
        row[name] = value
    if channels and row["channel"] is not None and row["channel"] not in channels:
        raise ValueError(f"channel {row['channel']} is not in the meta's channels")
    if not kind or not re.fullmatch(r"[a-z_]{1,40}", kind):
        raise ValueError(f"column kind is {kind[:30]!r}, expected a lower-case word")
    if kind == EventKind.GAP:
        parse_gap_detail(detail)  # ValueError names a malformed end
    return TraceEvent(row["t_mono_ns"], row["t_real_ns"], row["channel"], kind, detail)


def parse_events(path: Path, channels: set[int] | None = None
                 ) -> tuple[list[TraceEvent], int]:
    """A segment's events.csv as rows, checked; (rows, crash-cut records dropped)."""
    lines, dropped = _read_complete_lines(path)
    if not lines:
        raise UserError(f"{path}: empty file (no header line)")
    try:
        records = list(csv.reader(lines))
    except csv.Error as exc:
        raise UserError(f"{path}: not a valid CSV file ({exc})") from None
    if tuple(records[0]) != EVENT_COLUMNS:
        raise UserError(f"{path}: header {lines[0][:80]!r} is not the epi-trace v1 header")
    body = records[1:]
    events: list[TraceEvent] = []
    for i, rec in enumerate(body):
        try:
            events.append(_event_row(rec, channels))
        except ValueError as exc:
            if i == len(body) - 1:
                dropped += 1
                break
            raise UserError(f"{path}: record {i + 2}: malformed event ({exc})") from None
    return events, dropped


def _has_rows(path: Path) -> bool:
    """True if a CSV file has anything after its header line."""
    try:
        with open(path, "rb") as f:
            f.readline()
            return bool(f.read(1))
    except FileNotFoundError:
        return False


def infer_period_s(columns: Mapping[str, Column]) -> float | None:
    """The sample period from the samples themselves: the median spacing of each channel's
    timestamps, the smallest over channels (None with fewer than 2 samples per channel)."""
    per_channel: dict[int, list[int]] = {}
    for ch, t in zip(columns["channel"], columns["t_mono_ns"], strict=True):
        per_channel.setdefault(ch, []).append(t)
    medians = []
    for ts in per_channel.values():
        if len(ts) >= 2:
            d = sorted(b - a for a, b in itertools.pairwise(ts))
            medians.append(d[len(d) // 2])
    return min(medians) / 1e9 if medians else None


# ------------------------------------------------------------------------------- directory
def read_trace(trace_dir: str | os.PathLike[str], samples_reader: SamplesReader = read_samples
               ) -> Trace:
    """Read and check a whole trace directory; one-line `UserError` on anything malformed.

    `samples_reader` reads one samples.csv; the analysis passes one that keeps a columnar
    cache of what `read_samples` returns (host/analysis/trace_cache.py)."""
    path = Path(trace_dir)
    if not path.is_dir():
        raise UserError(f"{path}: not a trace directory")
    numbers = existing_segments(path)
    if not numbers:
        raise UserError(f"{path}: no trace segments (seg-NNNNNN.meta.json) in this directory")
    segments: list[Segment] = []
    skipped: list[int] = []
    notes: list[str] = []
    for n in numbers:
        meta_path, samples_path, events_path = segment_paths(path, n)
        if not meta_path.exists():
            if os.path.lexists(meta_path):  # a link to itself or to nothing: not a killed writer
                raise UserError(f"{meta_path}: a symbolic link that resolves to no file "
                                f"(dangling or a loop); segment {n}'s meta cannot be read")
            # The CSV files are created (header only) just before meta.json: a daemon killed
            # between the two leaves them without data. Anything more is not a writer's crash.
            if _has_rows(samples_path) or _has_rows(events_path):
                raise UserError(f"{meta_path}: missing, but segment {n} has data rows")
            skipped.append(n)
            continue
        meta = read_json_object(meta_path, "segment meta")
        channels = check_meta(meta_path, meta, n)
        known = set(channels) or None
        read = samples_reader(samples_path, known)
        columns, cut_s, odd = read.columns, read.dropped, read.out_of_range
        if odd:
            line, name, x = odd[0]
            notes.append(f"{samples_path.name}: {len(odd)} reading(s) outside their valid range "
                         f"set to missing (first: line {line}, {name} {x:g}); the time around "
                         "a missing power_w is invalid")
        events, cut_e = parse_events(events_path, known)
        given = meta.get("sample_period_s")  # checked by check_meta: a number ≥ 0 or absent
        period = float(given) if isinstance(given, (int, float)) else None
        inferred = period is None
        if inferred:
            period = infer_period_s(columns)
            notes.append(f"{meta_path.name}: no sample_period_s; "
                         + (f"inferred {period:g} s from the samples" if period else
                            "too few samples to infer it (no gap rule for this segment)"))
        for cut, p in ((cut_s, samples_path), (cut_e, events_path)):
            if cut:
                notes.append(f"{p.name}: dropped {cut} truncated final line(s)")
        segments.append(Segment(n, meta_path, meta, channels, period, inferred, columns, events,
                                cut_s, cut_e, odd, read.ends))
    if not segments:
        raise UserError(f"{path}: no trace segment got as far as its meta.json")
    _check_across_segments(path, segments)
    trace = Trace(path=path, segments=segments, skipped_segments=skipped, notes=notes)
    trace.gaps = _event_gaps(segments) + _segment_gaps(segments)
    return trace


def channel_ends(columns: Mapping[str, Column]) -> dict[int, tuple[int, int]]:
    """Row index of each channel's first and last sample in a segment's columns (C-speed
    searches, one per channel: a segment has a handful of channels and many rows)."""
    chans = list(columns["channel"])
    n = len(chans)
    backwards = chans[::-1]
    return {ch: (chans.index(ch), n - 1 - backwards.index(ch)) for ch in sorted(set(chans))}


def _check_across_segments(path: Path, segments: list[Segment]) -> None:
    """One channel map for the whole trace; time runs forward across segments of one boot."""
    first = segments[0]
    ref = {c: (m.node, m.name) for c, m in first.channels.items()}
    for seg in segments[1:]:
        mine = {c: (m.node, m.name) for c, m in seg.channels.items()}
        if ref and mine and mine != ref:
            diff = sorted(set(ref.items()) ^ set(mine.items()))
            raise UserError(f"{seg.meta_path}: channels differ from {first.meta_path.name} "
                            f"(channel map mismatch at {diff[0]})")
    last: dict[tuple[str | None, int], tuple[int, int]] = {}
    for seg in segments:
        firsts = {ch: e.first_mono_ns for ch, e in seg.ends.items()}
        lasts = {ch: e.last_mono_ns for ch, e in seg.ends.items()}
        for ch, t in firsts.items():
            prev = last.get((seg.boot_id, ch))
            if prev is not None and t <= prev[1]:
                raise UserError(
                    f"{path}: segment {seg.number} channel {ch} t_mono_ns {t} is not after "
                    f"segment {prev[0]}'s {prev[1]} (unsorted or overlapping segments of one "
                    "boot)")
        for ch, t in lasts.items():
            last[(seg.boot_id, ch)] = (seg.number, t)


def _event_gaps(segments: list[Segment]) -> list[Gap]:
    gaps: list[Gap] = []
    for seg in segments:
        for ev in seg.events:
            if ev.kind != EventKind.GAP:
                continue
            end_mono, end_real, reason = parse_gap_detail(ev.detail)
            gaps.append(Gap(ev.channel, ev.t_mono_ns, end_mono, ev.t_real_ns, end_real,
                            reason, GapSource.EVENT, same_clock=ev.t_mono_ns is not None))
    return gaps


def _segment_gaps(segments: list[Segment]) -> list[Gap]:
    """Per channel: the span from its last sample in one segment to its first in the next."""
    gaps: list[Gap] = []
    for before, after in itertools.pairwise(segments):
        last = {ch: (e.last_mono_ns, e.last_real_ns) for ch, e in before.ends.items()}
        first = {ch: (e.first_mono_ns, e.first_real_ns) for ch, e in after.ends.items()}
        same = before.boot_id is not None and before.boot_id == after.boot_id
        why = ("daemon stopped" if before.clean_stop
               else "daemon ended without a clean stop (crash or kill)")
        for ch in sorted(set(last) | set(first)):
            a, b = last.get(ch), first.get(ch)
            gaps.append(Gap(
                channel=ch,
                start_mono_ns=a[0] if a else before.meta_ns("started_mono_ns"),
                end_mono_ns=b[0] if b else None,
                start_real_ns=a[1] if a else before.meta_ns("started_real_ns"),
                end_real_ns=b[1] if b else None,
                reason=f"between segments {before.number} and {after.number}: {why}",
                source=GapSource.SEGMENTS,
                same_clock=same,
            ))
    return gaps

