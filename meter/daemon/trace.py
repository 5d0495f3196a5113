"""Meter trace files (docs/formats.md §1): a crash-safe writer and a small stdlib reader.

A trace is a directory of *segments*; every daemon start appends one. Each segment has two
append-only CSV files, created with their header line, and then a ``meta.json`` written
atomically before the first sample (so a segment with a meta.json has both CSV files).

Crash safety comes from three rules:

* every sweep's rows reach the kernel in one ``os.write`` of whole lines, so ``kill -9`` of
  the daemon loses at most the sweep being read, never a written row;
* a background thread ``fsync``s the files at least once a second (kept off the sampling
  thread so that a slow SD card does not add jitter to the schedule), so even a power cut
  loses at most about the last second;
* nothing is ever rewritten in place: metadata updates go through a temporary file and
  ``rename``, and a restarted daemon writes a new segment.

The reader drops a final line without its newline (a record cut by the crash) and joins the
segments, reporting the spans between them as gaps. Standard library only: the meter side
must not need pandas (the analysis side reads the same files with ``pandas.read_csv``).
"""

from __future__ import annotations

import contextlib
import csv
import fcntl
import io
import itertools
import json
import os
import re
import socket
import threading
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from epi.core.errors import UserError
from epi.core.files import read_boot_id, write_json_atomic

TRACE_FORMAT = "epi-trace"
TRACE_FORMAT_VERSION = 1

SAMPLE_COLUMNS: tuple[str, ...] = (
    "seq",
    "channel",
    "t_mono_ns",
    "t_real_ns",
    "power_w",
    "voltage_v",
    "current_a",
    "power_factor",
    "frequency_hz",
    "energy_j",
    "status",
)
EVENT_COLUMNS: tuple[str, ...] = ("t_mono_ns", "t_real_ns", "channel", "kind", "detail")
EVENT_KINDS: frozenset[str] = frozenset(
    {
        "start",
        "stop",
        "bus_error",
        "chip_reset",
        "reinit",
        "absent",
        "checksum_error",
        "late",
        "gap",
        # software power sources (meter/sources, docs/sources.md)
        "counter_wrap",
        "counter_backwards",
        "counter_frozen",
        "permission_denied",
        "read_error",
    }
)
_INT_SAMPLE_COLUMNS = frozenset({"seq", "channel", "t_mono_ns", "t_real_ns", "status"})
_SEGMENT_RE = re.compile(r"^seg-(\d{6})\.(meta\.json|samples\.csv|events\.csv)$")
# A gap event's detail starts with the end of the gap so that it can be parsed back.
_GAP_DETAIL_RE = re.compile(r"^end_mono_ns=(-?\d*) end_real_ns=(-?\d*);\s*(.*)$", re.S)
LOCK_NAME = ".lock"


def _fmt(value: object) -> str:
    """One CSV field: empty for a missing value (NaN in pandas), never 0."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            return ""
        return repr(value)
    return str(value)


def format_sample_line(row: Sequence[object]) -> str:
    """A samples.csv line (with its newline) for a row in SAMPLE_COLUMNS order."""
    if len(row) != len(SAMPLE_COLUMNS):
        raise ValueError(f"sample row has {len(row)} fields, expected {len(SAMPLE_COLUMNS)}")
    return ",".join(_fmt(v) for v in row) + "\n"


def format_event_line(
    t_mono_ns: int | None, t_real_ns: int | None, channel: int | None, kind: str, detail: str
) -> str:
    """An events.csv line; the free-text detail is quoted as CSV requires."""
    if kind not in EVENT_KINDS:
        raise ValueError(f"unknown event kind {kind!r}")
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerow(
        [_fmt(t_mono_ns), _fmt(t_real_ns), _fmt(channel), kind, detail.replace("\n", " ")]
    )
    return buf.getvalue()


def gap_detail(end_mono_ns: int | None, end_real_ns: int | None, reason: str) -> str:
    """The detail text of a ``gap`` event: its end, then the reason (see docs/formats.md)."""
    return f"end_mono_ns={_fmt(end_mono_ns)} end_real_ns={_fmt(end_real_ns)}; {reason}"


def segment_paths(trace_dir: Path, segment: int) -> tuple[Path, Path, Path]:
    """(meta.json, samples.csv, events.csv) of one segment."""
    stem = trace_dir / f"seg-{segment:06d}"
    return (
        stem.with_name(stem.name + ".meta.json"),
        stem.with_name(stem.name + ".samples.csv"),
        stem.with_name(stem.name + ".events.csv"),
    )


def existing_segments(trace_dir: Path) -> list[int]:
    """Segment numbers present in a trace directory (any of the three files), sorted."""
    found: set[int] = set()
    if trace_dir.is_dir():
        for entry in os.listdir(trace_dir):
            m = _SEGMENT_RE.match(entry)
            if m:
                found.add(int(m.group(1)))
    return sorted(found)


@dataclass
class LastSample:
    """The last complete sample row of a segment (for the restart gap)."""

    segment: int
    t_mono_ns: int
    t_real_ns: int
    boot_id: str | None
    clean_stop: bool


def last_sample_of(trace_dir: Path, segment: int) -> LastSample | None:
    """Read the tail of one segment's samples to find its last complete row."""
    meta_path, samples_path, _ = segment_paths(trace_dir, segment)
    try:
        meta = json.loads(meta_path.read_text())
    except (OSError, ValueError):
        meta = {}
    try:
        with open(samples_path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - 65536))
            tail = f.read()
    except OSError:
        return None
    lines = tail.split(b"\n")[:-1]  # the piece after the last newline is incomplete
    for raw in reversed(lines):
        fields = raw.decode("utf-8", "replace").split(",")
        if len(fields) == len(SAMPLE_COLUMNS) and fields[0].isdigit():
            try:
                return LastSample(
                    segment=segment,
                    t_mono_ns=int(fields[2]),
                    t_real_ns=int(fields[3]),
                    boot_id=meta.get("boot_id"),
                    clean_stop=bool(meta.get("stats", {}).get("clean_stop", False)),
                )
            except ValueError:
                continue
    return None


class TraceLock:
    """Exclusive use of a trace directory (an advisory ``flock`` the kernel drops when the
    process dies, so a daemon restarted after ``kill -9`` gets it back at once)."""

    def __init__(self, trace_dir: str | os.PathLike[str]) -> None:
        self.trace_dir = Path(trace_dir)
        try:
            self.trace_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise UserError(f"{self.trace_dir}: cannot create the trace directory: {exc}") from exc
        if not os.access(self.trace_dir, os.W_OK):
            raise UserError(f"{self.trace_dir}: trace directory is not writable")
        fd = os.open(self.trace_dir / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "?"
            os.close(fd)
            raise UserError(
                f"{self.trace_dir}: trace directory is in use by another daemon (pid {holder})"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd: int | None = fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


class TraceWriter:
    """Writes one new segment of a trace directory, append-only and crash-safe.

    Only one writer may use a directory at a time (a ``TraceLock``, taken here unless the
    caller took it first — the daemon does, before it touches any chip).
    """

    def __init__(
        self,
        trace_dir: str | os.PathLike[str],
        meta: dict[str, Any],
        *,
        fsync_interval_s: float = 0.5,
        lock: TraceLock | None = None,
    ) -> None:
        if not 0 < fsync_interval_s <= 1.0:
            raise ValueError("fsync_interval_s must be in (0, 1] s: the trace promises ≤ 1 s loss")
        self.trace_dir = Path(trace_dir)
        self.fsync_interval_s = fsync_interval_s
        self._base_meta = dict(meta)
        self._lock = threading.Lock()
        self._dirty = False
        self._closed = False
        self._stop_sync = threading.Event()
        self._dir_lock = lock
        self._samples_fd = -1
        self._events_fd = -1
        self.rows_written = 0
        self.events_written = 0
        self.previous: LastSample | None = None
        self._open()

    # -- opening ----------------------------------------------------------------------------
    def _open(self) -> None:
        if self._dir_lock is None:
            self._dir_lock = TraceLock(self.trace_dir)
        segments = existing_segments(self.trace_dir)
        for seg in reversed(segments):
            self.previous = last_sample_of(self.trace_dir, seg)
            if self.previous is not None:
                break
        self.segment = (segments[-1] + 1) if segments else 1
        self.meta_path, self.samples_path, self.events_path = segment_paths(
            self.trace_dir, self.segment
        )
        meta = {
            "format": TRACE_FORMAT,
            "format_version": TRACE_FORMAT_VERSION,
            "segment": self.segment,
        }
        meta.update(self._base_meta)
        meta.setdefault("host", socket.gethostname())
        meta.setdefault("boot_id", read_boot_id())
        self._meta = meta
        # The CSV files appear whole with their header line (temporary file + rename), and
        # before meta.json: a segment whose meta.json exists always has both files.
        self._samples_fd = _create_with_header(self.samples_path, SAMPLE_COLUMNS)
        self._events_fd = _create_with_header(self.events_path, EVENT_COLUMNS)
        write_json_atomic(self.meta_path, meta)
        self._sync_thread = threading.Thread(
            target=self._sync_loop, name="trace-fsync", daemon=True
        )
        self._sync_thread.start()

    # -- writing ------------------------------------------------------------------------------
    @property
    def meta(self) -> dict[str, Any]:
        """The segment metadata as last written."""
        return dict(self._meta)

    def write_samples(self, rows: Iterable[Sequence[object]]) -> int:
        """Append the rows of one sweep in one system call; returns the number written."""
        lines = [format_sample_line(r) for r in rows]
        if not lines:
            return 0
        data = "".join(lines).encode()
        with self._lock:
            self._check_open()
            _write_all(self._samples_fd, data)
            self._dirty = True
            self.rows_written += len(lines)
        return len(lines)

    def write_event(
        self,
        t_mono_ns: int | None,
        t_real_ns: int | None,
        channel: int | None,
        kind: str,
        detail: str = "",
    ) -> None:
        """Append one event row (fault, reset, gap, start/stop, late)."""
        data = format_event_line(t_mono_ns, t_real_ns, channel, kind, detail).encode()
        with self._lock:
            self._check_open()
            _write_all(self._events_fd, data)
            self._dirty = True
            self.events_written += 1

    def update_meta(self, **updates: Any) -> None:
        """Atomically rewrite meta.json with some keys added or replaced (e.g. ``stats``)."""
        with self._lock:
            self._meta.update(updates)
            snapshot = dict(self._meta)
        write_json_atomic(self.meta_path, snapshot)

    def sync(self) -> None:
        """fsync both CSV files now if anything was written since the last sync."""
        with self._lock:
            if not self._dirty or self._closed:
                return
            self._dirty = False
            fds = (self._samples_fd, self._events_fd)
        for fd in fds:
            with contextlib.suppress(OSError):
                os.fsync(fd)

    def _sync_loop(self) -> None:
        while not self._stop_sync.wait(self.fsync_interval_s):
            self.sync()

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("trace segment already closed")

    def close(self, **final_meta: Any) -> None:
        """Sync, close the files, write the final metadata and release the directory."""
        if self._closed:
            return
        self._stop_sync.set()
        self._sync_thread.join()
        self.sync()
        with self._lock:
            self._closed = True
            os.close(self._samples_fd)
            os.close(self._events_fd)
        if final_meta:
            self.update_meta(**final_meta)
        if self._dir_lock is not None:
            self._dir_lock.release()

    def __enter__(self) -> TraceWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _create_with_header(path: Path, columns: Sequence[str]) -> int:
    """Create a CSV file holding just its header, atomically; return an append descriptor."""
    if path.exists():
        raise FileExistsError(f"{path}: already exists (segments are never reused)")
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o644)
    try:
        _write_all(fd, (",".join(columns) + "\n").encode())
        os.fsync(fd)
        os.rename(tmp, path)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


# =============================== reader ======================================================


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
    source: str  # "event" (a gap row in events.csv) or "segments" (between two segments)
    same_clock: bool = True


@dataclass
class Segment:
    """One segment as read back."""

    number: int
    meta: dict[str, Any]
    samples: list[dict[str, Any]]
    events: list[dict[str, Any]]
    dropped_lines: int = 0  # truncated final records dropped (samples + events)


@dataclass
class Trace:
    """A whole trace directory: segments in order, and the gaps between and within them."""

    path: Path
    segments: list[Segment]
    gaps: list[Gap] = field(default_factory=list)
    skipped_segments: list[int] = field(default_factory=list)  # killed before their meta.json

    def samples(self) -> Iterator[dict[str, Any]]:
        """Every sample row of every segment, with a ``segment`` key added."""
        for seg in self.segments:
            for row in seg.samples:
                yield {"segment": seg.number, **row}

    def events(self) -> Iterator[dict[str, Any]]:
        """Every event row of every segment, with a ``segment`` key added."""
        for seg in self.segments:
            for row in seg.events:
                yield {"segment": seg.number, **row}

    @property
    def dropped_lines(self) -> int:
        return sum(s.dropped_lines for s in self.segments)


def _check_meta(path: Path, meta: object) -> dict[str, Any]:
    if not isinstance(meta, dict):
        raise UserError(f"{path}: not a JSON object")
    if meta.get("format") != TRACE_FORMAT:
        raise UserError(f"{path}: format is {meta.get('format')!r}, expected {TRACE_FORMAT!r}")
    version = meta.get("format_version")
    if not isinstance(version, int) or version < 1:
        raise UserError(f"{path}: format_version {version!r} is not a positive integer")
    if version > TRACE_FORMAT_VERSION:
        raise UserError(
            f"{path}: format_version {version} is newer than this reader knows "
            f"({TRACE_FORMAT_VERSION}); upgrade epi"
        )
    return meta


def _read_complete_lines(path: Path) -> tuple[list[str], int]:
    """Lines of a CSV that end with a newline; a cut final record is dropped and counted."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return [], 0
    dropped = 0
    if data and not data.endswith(b"\n"):
        data = data[: data.rfind(b"\n") + 1]
        dropped = 1
    # A power cut can leave NUL-filled blocks at the end of a file: drop those lines too.
    lines = data.decode("utf-8", "replace").split("\n")[:-1]
    while lines and "\x00" in lines[-1]:
        lines.pop()
        dropped += 1
    return lines, dropped


def _parse_samples(path: Path) -> tuple[list[dict[str, Any]], int]:
    lines, dropped = _read_complete_lines(path)
    if not lines:
        return [], dropped
    header = tuple(lines[0].split(","))
    if header != SAMPLE_COLUMNS:
        raise UserError(f"{path}: header {','.join(header)!r} is not the epi-trace v1 header")
    rows: list[dict[str, Any]] = []
    last = len(lines) - 1
    for i, line in enumerate(lines[1:], start=1):
        fields = line.split(",")
        try:
            if len(fields) != len(SAMPLE_COLUMNS):
                raise ValueError(f"{len(fields)} fields")
            row: dict[str, Any] = {}
            for name, text in zip(SAMPLE_COLUMNS, fields, strict=True):
                if text == "":
                    row[name] = None
                elif name in _INT_SAMPLE_COLUMNS:
                    row[name] = int(text)
                else:
                    row[name] = float(text)
        except ValueError as exc:
            if i == last:  # a damaged final record: the crash cut it
                dropped += 1
                break
            raise UserError(f"{path}: line {i + 1}: malformed sample row ({exc})") from None
        rows.append(row)
    return rows, dropped


def _parse_events(path: Path) -> tuple[list[dict[str, Any]], int]:
    lines, dropped = _read_complete_lines(path)
    if not lines:
        return [], dropped
    reader = csv.reader(lines)
    header = tuple(next(reader))
    if header != EVENT_COLUMNS:
        raise UserError(f"{path}: header {','.join(header)!r} is not the epi-trace v1 header")
    events: list[dict[str, Any]] = []
    records = list(reader)
    for i, rec in enumerate(records):
        if len(rec) != len(EVENT_COLUMNS):
            if i == len(records) - 1:
                dropped += 1
                break
            raise UserError(f"{path}: record {i + 2}: {len(rec)} fields, expected 5")
        t_mono, t_real, channel, kind, detail = rec
        events.append(
            {
                "t_mono_ns": int(t_mono) if t_mono else None,
                "t_real_ns": int(t_real) if t_real else None,
                "channel": int(channel) if channel else None,
                "kind": kind,
                "detail": detail,
            }
        )
    return events, dropped


def _has_rows(path: Path) -> bool:
    """True if a CSV file has anything after its header line."""
    try:
        with open(path, "rb") as f:
            f.readline()
            return bool(f.read(1))
    except FileNotFoundError:
        return False


def _int_or_none(text: str) -> int | None:
    return int(text) if text not in ("", "-") else None


def read_trace(trace_dir: str | os.PathLike[str]) -> Trace:
    """Read a whole trace directory: segments joined, truncated records dropped, gaps listed."""
    path = Path(trace_dir)
    if not path.is_dir():
        raise UserError(f"{path}: not a trace directory")
    numbers = existing_segments(path)
    if not numbers:
        raise UserError(f"{path}: no trace segments (seg-NNNNNN.meta.json) in this directory")
    segments: list[Segment] = []
    skipped: list[int] = []
    for n in numbers:
        meta_path, samples_path, events_path = segment_paths(path, n)
        if not meta_path.exists():
            # The CSV files are created (header only) just before meta.json: a daemon killed
            # between the two leaves them without data. Anything more is not a writer's crash.
            if _has_rows(samples_path) or _has_rows(events_path):
                raise UserError(f"{meta_path}: missing, but segment {n} has data rows")
            skipped.append(n)
            continue
        try:
            raw = json.loads(meta_path.read_text())
        except ValueError as exc:
            raise UserError(f"{meta_path}: invalid JSON ({exc})") from None
        meta = _check_meta(meta_path, raw)
        samples, d1 = _parse_samples(samples_path)
        events, d2 = _parse_events(events_path)
        segments.append(Segment(n, meta, samples, events, d1 + d2))
    if not segments:
        raise UserError(f"{path}: no trace segment got as far as its meta.json")
    trace = Trace(path=path, segments=segments, skipped_segments=skipped)
    trace.gaps = _event_gaps(segments) + _segment_gaps(segments)
    return trace


def _event_gaps(segments: list[Segment]) -> list[Gap]:
    gaps: list[Gap] = []
    for seg in segments:
        for ev in seg.events:
            if ev["kind"] != "gap":
                continue
            m = _GAP_DETAIL_RE.match(ev["detail"])
            end_mono = _int_or_none(m.group(1)) if m else None
            end_real = _int_or_none(m.group(2)) if m else None
            reason = m.group(3) if m else ev["detail"]
            gaps.append(
                Gap(
                    channel=ev["channel"],
                    start_mono_ns=ev["t_mono_ns"],
                    end_mono_ns=end_mono,
                    start_real_ns=ev["t_real_ns"],
                    end_real_ns=end_real,
                    reason=reason,
                    source="event",
                    same_clock=ev["t_mono_ns"] is not None,
                )
            )
    return gaps


def _segment_gaps(segments: list[Segment]) -> list[Gap]:
    """Per channel: the span from its last sample in one segment to its first in the next."""
    gaps: list[Gap] = []
    for before, after in itertools.pairwise(segments):
        last: dict[int, dict[str, Any]] = {}
        for row in before.samples:
            last[row["channel"]] = row
        first: dict[int, dict[str, Any]] = {}
        for row in after.samples:
            first.setdefault(row["channel"], row)
        same = before.meta.get("boot_id") is not None and before.meta.get(
            "boot_id"
        ) == after.meta.get("boot_id")
        clean = bool(before.meta.get("stats", {}).get("clean_stop", False))
        why = "daemon stopped" if clean else "daemon ended without a clean stop (crash or kill)"
        for ch in sorted(set(last) | set(first)):
            a, b = last.get(ch), first.get(ch)
            gaps.append(
                Gap(
                    channel=ch,
                    start_mono_ns=a["t_mono_ns"] if a else before.meta.get("started_mono_ns"),
                    end_mono_ns=b["t_mono_ns"] if b else None,
                    start_real_ns=a["t_real_ns"] if a else before.meta.get("started_real_ns"),
                    end_real_ns=b["t_real_ns"] if b else None,
                    reason=f"between segments {before.number} and {after.number}: {why}",
                    source="segments",
                    same_clock=same,
                )
            )
    return gaps
