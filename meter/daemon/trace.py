"""Meter trace files (docs/formats.md §1): the crash-safe writer.

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

The one reader of these files, with the format's names and columns, is
``epi.formats.trace`` (standard library only, shared by the daemon, the analysis and the tests).
"""

from __future__ import annotations

import contextlib
import csv
import errno
import fcntl
import io
import os
import re
import socket
import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from epi.core.errors import UserError
from epi.core.files import read_boot_id, write_json_atomic
from epi.formats.fields import read_json_object
from epi.formats.json_types import JSONObject
from epi.formats.trace import (
    EVENT_COLUMNS,
    EVENT_KINDS,
    SAMPLE_COLUMNS,
    TRACE_FORMAT,
    TRACE_FORMAT_VERSION,
    existing_segments,
    last_complete_sample,
    segment_paths,
)

LOCK_NAME = ".lock"
_STALE_TMP_RE = re.compile(
    r"^\.seg-\d{6}\.((meta\.json|samples\.csv|events\.csv)\.tmp-\d+|reserve)$")
# Space held back while a segment is written, freed to write its last events and meta.json
# when the disk is full at the stop (meta.json is rewritten through a temporary file, so it
# needs room for a whole new copy; a bridge's clock history makes it tens of KiB).
RESERVE_BYTES = 256 * 1024


class TraceLostError(UserError):
    """The trace directory (or a segment file) was removed while the daemon wrote into it."""


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


# A channel gap whose reason begins with this declares an interval whose energy is not in
# ``energy_j`` (the chip's counter was lost or not running: reset, absent, re-initialised).
# Energy checks subtract exactly these intervals; every other gap only means "no rows".
UNMETERED_GAP_REASON = "energy not metered"


@dataclass
class LastSample:
    """The last complete sample row of a segment (for the restart gap)."""

    segment: int
    t_mono_ns: int
    t_real_ns: int
    boot_id: str | None
    clean_stop: bool


def last_sample_of(trace_dir: Path, segment: int) -> LastSample | None:
    """The last complete sample row of one segment (read by the format's own reader)."""
    meta_path, samples_path, _ = segment_paths(trace_dir, segment)
    last = last_complete_sample(samples_path)
    if last is None:
        return None
    # The format's JSON reader (UTF-8, no NaN, depth ≤ 64), leniently: a damaged meta means
    # "boot unknown, no clean stop", never a daemon that cannot restart. Not check_meta: it
    # refuses the whole file for any bad field and would drop a usable boot_id.
    try:
        meta = read_json_object(meta_path, "segment meta.json")
    except UserError:
        meta = {}
    raw_stats = meta.get("stats")
    stats = raw_stats if isinstance(raw_stats, dict) else {}
    boot = meta.get("boot_id")
    return LastSample(
        segment=segment,
        t_mono_ns=last[0],
        t_real_ns=last[1],
        boot_id=boot if isinstance(boot, str) else None,
        clean_stop=stats.get("clean_stop") is True,
    )


class TraceLock:
    """Exclusive use of a trace directory (an advisory ``flock`` the kernel drops when the
    process dies, so a daemon restarted after ``kill -9`` gets it back at once)."""

    def __init__(self, trace_dir: str | os.PathLike[str]) -> None:
        self.trace_dir = Path(trace_dir)
        self.created = not self.trace_dir.exists()
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

    def remove_if_unused(self) -> None:
        """Undo a start that failed before writing anything: remove the lock file, and the
        directory if this lock created it and nothing else is in it."""
        if self._fd is None:
            return
        with contextlib.suppress(OSError):
            os.unlink(self.trace_dir / LOCK_NAME)
        if self.created:
            with contextlib.suppress(OSError):
                self.trace_dir.rmdir()  # fails (kept) when anything else is in it

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
        meta: Mapping[str, object],
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
        # full disk: rows and events that could not be written, and since when
        # (t_mono_ns, t_real_ns) of the first row or event the full disk dropped
        self.disk_full_since: tuple[int | None, int | None] | None = None
        self.rows_dropped = 0
        self.events_dropped = 0
        self.disk_full_episodes = 0
        self.episode_rows_dropped = 0  # of the current (or last) disk-full episode
        self.episode_events_dropped = 0
        self.meta_write_failures = 0
        self._recovered: list[str] = []  # disk_full/gap event lines to write once space returns
        self._lost: str | None = None  # set by the sync thread when the files were unlinked
        self._rows_seen_present = 0  # rows_written when a check last found the files in place
        self.stale_files_removed: list[str] = []
        self._open()

    # -- opening ----------------------------------------------------------------------------
    def _open(self) -> None:
        if self._dir_lock is None:
            self._dir_lock = TraceLock(self.trace_dir)
        self._remove_stale_temporaries()
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
        st = os.fstat(self._samples_fd)
        self._samples_id = (st.st_dev, st.st_ino)  # which file is ours (see _still_ours)
        write_json_atomic(self.meta_path, meta)
        self.reserve_path: Path | None = self.trace_dir / f".seg-{self.segment:06d}.reserve"
        _hold_space(self.reserve_path, RESERVE_BYTES)
        self._sync_thread = threading.Thread(
            target=self._sync_loop, name="trace-fsync", daemon=True
        )
        self._sync_thread.start()

    def _remove_stale_temporaries(self) -> None:
        """Temporary files a killed writer left behind (``.seg-N.meta.json.tmp-PID``): we hold
        the directory's lock, so no live writer owns them."""
        for entry in os.listdir(self.trace_dir):
            if _STALE_TMP_RE.match(entry):
                with contextlib.suppress(OSError):
                    os.unlink(self.trace_dir / entry)
                    self.stale_files_removed.append(entry)

    # -- writing ------------------------------------------------------------------------------
    @property
    def meta(self) -> JSONObject:
        """A copy of the segment metadata as last written (callers read its fields)."""
        return dict(self._meta)

    def write_samples(self, rows: Iterable[Sequence[object]]) -> int:
        """Append the rows of one sweep in one system call; returns the number written."""
        rows = list(rows)
        lines = [format_sample_line(r) for r in rows]
        if not lines:
            return 0
        data = "".join(lines).encode()
        with self._lock:
            self._check_open()
            if not self._append(self._samples_fd, data, rows[0]):
                self.rows_dropped += len(lines)
                self.episode_rows_dropped += len(lines)
                return 0
            self._dirty = True
            self.rows_written += len(lines)
        return len(lines)

    def _append(self, fd: int, data: bytes, first_row: Sequence[object] | None) -> bool:
        """Append whole lines, or nothing: on a full disk the file is cut back to its last
        whole line and the data is dropped (counted; a ``disk_full`` event and a gap are
        written once space returns). Other OS errors propagate."""
        if self._recovered and not self._flush_recovered():
            return False
        size = os.fstat(fd).st_size
        try:
            _write_all(fd, data)
        except OSError as exc:
            if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
                raise
            with contextlib.suppress(OSError):
                os.ftruncate(fd, size)
            if self.disk_full_since is None:
                self.disk_full_episodes += 1
                self.episode_rows_dropped = self.episode_events_dropped = 0
                self.disk_full_since = _row_times(first_row)
            return False
        if self.disk_full_since is not None:
            self._note_recovered(_row_times(first_row))
            self._flush_recovered()
        return True

    def _note_recovered(self, now: tuple[int | None, int | None]) -> None:
        start = self.disk_full_since or (None, None)
        self.disk_full_since = None
        what = (f"{self.episode_rows_dropped} sample row(s) and {self.episode_events_dropped} "
                f"event(s) dropped")
        self._recovered = [
            format_event_line(start[0], start[1], None, "disk_full",
                              f"no space left on the trace's file system: {what}; writing "
                              f"again"),
            format_event_line(start[0], start[1], None, "gap",
                              gap_detail(now[0], now[1], f"disk full: {what}")),
        ]

    def _flush_recovered(self) -> bool:
        data = "".join(self._recovered).encode()
        size = os.fstat(self._events_fd).st_size
        try:
            _write_all(self._events_fd, data)
        except OSError as exc:
            if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
                raise
            with contextlib.suppress(OSError):
                os.ftruncate(self._events_fd, size)
            return False
        self.events_written += len(self._recovered)
        self._recovered = []
        return True

    @property
    def disk_full(self) -> bool:
        """True while writes are being dropped for lack of space."""
        return self.disk_full_since is not None

    def use_reserve(self, now: tuple[int, int]) -> None:
        """Free the space held back at open, then close a disk-full episode at `now` (its
        ``disk_full`` event and gap): called before the last events and meta.json of a stop,
        so a stop on a full disk still leaves a correct meta.json. Once only."""
        if self.reserve_path is None:
            return
        if self._lost is None and self._still_ours():  # never another trace's reserve
            with contextlib.suppress(OSError):
                os.unlink(self.reserve_path)
        self.reserve_path = None
        with self._lock:
            if self._closed:
                return
            if self.disk_full_since is not None:
                self._note_recovered(now)
            if self._recovered:
                self._flush_recovered()

    def check_present(self) -> None:
        """Raise TraceLostError if the segment's files were unlinked (``--out`` removed).

        Each check that finds the files in place remembers how many rows were written by
        then, so the error can say how many went to deleted files after the removal (rows
        written since the last check that still saw the files: the removal happened between
        that check and the next).
        """
        if self._lost is None:
            rows = self.rows_written  # before the check: these rows went into the files seen
            try:
                if os.fstat(self._samples_fd).st_nlink == 0 or not self.samples_path.exists():
                    self._lost = f"{self.samples_path} was removed while the daemon wrote to it"
                else:
                    self._rows_seen_present = max(self._rows_seen_present, rows)
            except OSError as exc:
                self._lost = f"{self.samples_path}: {exc}"
        if self._lost is not None:
            after = self.rows_written - self._rows_seen_present
            raise TraceLostError(
                f"{self.trace_dir}: trace lost: {self._lost}; {after} row(s) of segment "
                f"{self.segment} written after the last check that still found the files "
                f"(the daemon checks twice a second) went to deleted files. Stopping; a "
                f"restart begins a new trace"
            )

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
            if not self._append(self._events_fd, data, (None, None, t_mono_ns, t_real_ns)):
                self.events_dropped += 1
                self.episode_events_dropped += 1
                return
            self._dirty = True
            self.events_written += 1

    def _still_ours(self) -> bool:
        """Whether the segment's samples file at its path is the one this writer opened: after
        ``--out`` was removed (and perhaps re-created, perhaps by a new daemon) nothing may be
        written by path any more, or a stray meta.json (or a removed reserve) would land in a
        directory that is not this trace."""
        try:
            st = os.stat(self.samples_path)
        except OSError:
            return False
        return (st.st_dev, st.st_ino) == self._samples_id

    def update_meta(self, **updates: object) -> None:
        """Atomically rewrite meta.json with some keys added or replaced (e.g. ``stats``);
        nothing is written once the segment's files are not this writer's any more."""
        with self._lock:
            self._meta.update(updates)
            snapshot = dict(self._meta)
        if self._lost is not None or not self._still_ours():
            if self._lost is None:
                self._lost = f"{self.samples_path} was removed while the daemon wrote to it"
            return
        try:
            write_json_atomic(self.meta_path, snapshot)
        except OSError as exc:  # the old meta.json stays whole; the next update tries again
            if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
                raise
            self.meta_write_failures += 1

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
            with contextlib.suppress(TraceLostError):
                self.check_present()

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("trace segment already closed")

    def close(self, **final_meta: object) -> None:
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
            failures = self.meta_write_failures
            self.update_meta(**final_meta)
            if self.meta_write_failures > failures and self.reserve_path is not None:
                # the disk is full: free the reserve and write the final meta again
                with contextlib.suppress(OSError):
                    os.unlink(self.reserve_path)
                self.reserve_path = None
                self.update_meta()
        if self.reserve_path is not None:
            if self._lost is None and self._still_ours():  # never another trace's reserve
                with contextlib.suppress(OSError):
                    os.unlink(self.reserve_path)
            self.reserve_path = None
        if self._dir_lock is not None:
            self._dir_lock.release()

    def __enter__(self) -> TraceWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _hold_space(path: Path, n_bytes: int) -> None:
    """A file of `n_bytes` zeros (space the segment may free later); none if it cannot be
    written (a disk already full: the stop then does what it can without it)."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    except OSError:
        return
    try:
        _write_all(fd, bytes(n_bytes))
        os.fsync(fd)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(path)
    finally:
        os.close(fd)


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


def _row_times(row: Sequence[object] | None) -> tuple[int | None, int | None]:
    """(t_mono_ns, t_real_ns) of a sample row (or an event's stand-in row)."""
    if row is None or len(row) < 4:
        return None, None
    mono, real = row[2], row[3]
    return (mono if isinstance(mono, int) else None, real if isinstance(real, int) else None)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]
