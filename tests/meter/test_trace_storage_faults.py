"""Storage faults of the trace writer: a full disk, a removed directory, stale temporaries,
and the fsync promise. Expected values come from the rows the test itself wrote."""

from __future__ import annotations

import errno
import json
import os
import shutil
import threading
from pathlib import Path

import pytest

from epi.core import files
from epi.formats.trace import read_trace
from meter.daemon import trace as trace_mod
from meter.daemon.trace import TraceLostError, TraceWriter


class FullDisk:
    """os.write that writes `room` more bytes, then fails with ENOSPC (a partial write first)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, module: object) -> None:
        self.room: int | None = None
        real = os.write

        def write(fd: int, data: bytes | memoryview) -> int:
            if self.room is None:
                return real(fd, data)
            if self.room <= 0:
                raise OSError(errno.ENOSPC, "No space left on device")
            n = real(fd, bytes(data)[: self.room])
            self.room -= n
            return n

        monkeypatch.setattr(module.os, "write", write)  # type: ignore[attr-defined]


def _row(seq: int, power_w: float = 4.0) -> tuple:
    t = 1_000_000_000 + seq * 50_000_000
    return (seq, 0, t, 1_700_000_000_000_000_000 + t, power_w, 230.0, 0.02, 0.8, 50.0,
            seq * 0.2, 0)


def test_full_disk_drops_whole_rows_records_it_and_resumes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    disk = FullDisk(monkeypatch, trace_mod)
    w = TraceWriter(tmp_path, {"channels": []})
    for k in range(10):
        assert w.write_samples([_row(k)]) == 1
    disk.room = 30  # part of the next row fits, then the disk is full
    for k in range(10, 20):
        assert w.write_samples([_row(k)]) == 0
    assert w.disk_full and w.rows_dropped == 10
    disk.room = None  # space is back
    for k in range(20, 25):
        assert w.write_samples([_row(k)]) == 1
    assert not w.disk_full
    w.close()
    tr = read_trace(tmp_path)
    seqs = [r["seq"] for r in tr.samples()]
    assert seqs == list(range(10)) + list(range(20, 25))  # no cut row in the middle
    kinds = [e["kind"] for e in tr.events()]
    assert kinds == ["disk_full", "gap"]
    (gap,) = [g for g in tr.gaps if g.source == "event"]
    assert gap.start_mono_ns == _row(10)[2] and gap.end_mono_ns == _row(20)[2]
    assert "10 sample row(s)" in gap.reason


def test_a_full_disk_never_replaces_meta_json_with_a_short_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    disk = FullDisk(monkeypatch, files)
    w = TraceWriter(tmp_path, {"channels": [], "note": "x" * 20_000})
    before = w.meta_path.read_text()
    disk.room = 8192
    w.update_meta(stats={"clean_stop": False})  # does not raise, keeps the old file
    assert w.meta_path.read_text() == before and w.meta_write_failures == 1
    assert not [p for p in os.listdir(tmp_path) if ".tmp-" in p]
    disk.room = None
    w.close(stats={"clean_stop": True})
    assert json.loads(w.meta_path.read_text())["stats"] == {"clean_stop": True}


def test_removed_out_dir_stops_with_a_clear_error(tmp_path: Path) -> None:
    out = tmp_path / "trace"
    w = TraceWriter(out, {})
    w.write_samples([_row(0)])
    shutil.rmtree(out)
    with pytest.raises(TraceLostError, match="removed while the daemon wrote"):
        w.write_samples([_row(1)])
        w.check_present()
    w._stop_sync.set()


def test_trace_lost_error_counts_only_the_rows_written_after_the_removal(tmp_path: Path) -> None:
    """7 rows go into the files while they exist (a check sees them), 3 after the removal: the
    error says 3, not the segment's 10."""
    out = tmp_path / "trace"
    w = TraceWriter(out, {})
    w._stop_sync.set()  # only the checks this test makes
    w._sync_thread.join()
    for k in range(7):
        w.write_samples([_row(k)])
    w.check_present()  # finds the files: 7 rows are in them
    shutil.rmtree(out)
    for k in range(7, 10):
        w.write_samples([_row(k)])
    with pytest.raises(TraceLostError) as err:
        w.check_present()
    assert w.rows_written == 10
    assert "; 3 row(s) of segment 1 written after the last check" in str(err.value)


def test_stale_temporaries_of_a_killed_writer_are_removed(tmp_path: Path) -> None:
    TraceWriter(tmp_path, {}).close()
    stale = tmp_path / ".seg-000001.meta.json.tmp-99999"
    stale.write_text("{")
    other = tmp_path / "notes.txt"
    other.write_text("keep")
    w = TraceWriter(tmp_path, {})
    w.close()
    assert not stale.exists() and other.exists()
    assert w.stale_files_removed == [stale.name]


def _fsynced_within(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, seconds: float) -> set:
    """Which of a writer's two CSV descriptors were fsynced within `seconds` of a write
    (before close: the promise is about a running daemon)."""
    synced: set[int] = set()
    lock = threading.Lock()
    real = os.fsync
    w = TraceWriter(tmp_path, {}, fsync_interval_s=0.05)

    def fsync(fd: int) -> None:
        with lock:
            synced.add(fd)
        real(fd)

    monkeypatch.setattr(trace_mod.os, "fsync", fsync)
    w.write_samples([_row(0)])
    w.write_event(1, 2, None, "start", "x")
    want = {w._samples_fd, w._events_fd}
    deadline = threading.Event()
    for _ in range(int(seconds / 0.01)):
        with lock:
            if want <= synced:
                break
        deadline.wait(0.01)
    with lock:
        seen = synced & want
    w.close()
    return {"samples" if fd == w._samples_fd else "events" for fd in seen}


def test_fsync_reaches_both_csv_descriptors_within_the_interval(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert _fsynced_within(tmp_path, monkeypatch, 1.0) == {"samples", "events"}


def test_a_sync_that_does_nothing_fails_the_fsync_check(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The check above must catch a writer whose sync() is a no-op."""
    monkeypatch.setattr(TraceWriter, "sync", lambda self: None)
    assert _fsynced_within(tmp_path, monkeypatch, 0.3) == set()


@pytest.mark.parametrize("meta", [b"[" * 100_000, b"\xff\xfe", b'{"boot_id": NaN}', b"[]"])
def test_last_sample_of_a_damaged_meta_is_boot_unknown_not_a_crash(tmp_path: Path,
                                                                   meta: bytes) -> None:
    """A restarting daemon reads the last segment's meta.json through the format's JSON
    reader: deep nesting or non-UTF-8 there means "boot unknown", never a traceback."""
    from epi.formats.trace import SAMPLE_COLUMNS, segment_paths
    from meter.daemon.trace import last_sample_of

    meta_path, samples_path, _ = segment_paths(tmp_path, 1)
    meta_path.write_bytes(meta)
    samples_path.write_text(",".join(SAMPLE_COLUMNS) + "\n1,0,5,7,1,230,0.1,1,50,0,ok\n")
    last = last_sample_of(tmp_path, 1)
    assert last is not None and (last.t_mono_ns, last.t_real_ns) == (5, 7)
    assert last.boot_id is None and last.clean_stop is False


def test_last_sample_of_keeps_the_boot_id_and_clean_stop(tmp_path: Path) -> None:
    from epi.formats.trace import SAMPLE_COLUMNS, segment_paths
    from meter.daemon.trace import last_sample_of

    meta_path, samples_path, _ = segment_paths(tmp_path, 1)
    meta_path.write_text(json.dumps({"boot_id": "b1", "stats": {"clean_stop": True}}))
    samples_path.write_text(",".join(SAMPLE_COLUMNS) + "\n1,0,5,7,1,230,0.1,1,50,0,ok\n")
    last = last_sample_of(tmp_path, 1)
    assert last is not None and last.boot_id == "b1" and last.clean_stop is True
