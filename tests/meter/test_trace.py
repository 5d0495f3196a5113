"""Trace writer and reader: format, crash-cut records, segments, gaps, locking."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from epi.core.errors import UserError
from epi.formats.trace import EVENT_COLUMNS, SAMPLE_COLUMNS, read_trace, segment_paths
from meter.daemon.trace import TraceWriter, gap_detail


def _row(seq: int, ch: int, t: int, power: float | None = 10.5) -> tuple:
    return (seq, ch, t, 1_700_000_000_000_000_000 + t, power, 230.01, 0.05, 0.91, 50.0, 1.5, 0)


def test_writer_writes_the_documented_layout(tmp_path: Path) -> None:
    w = TraceWriter(tmp_path, {"emulated": True, "channels": []})
    w.write_samples([_row(0, 0, 1000), _row(0, 1, 1100, power=None)])
    w.write_event(1200, 1300, 1, "bus_error", "frame, with a comma")
    w.close(stats={"clean_stop": True})

    meta_p, samples_p, events_p = segment_paths(tmp_path, 1)
    meta = json.loads(meta_p.read_text())
    assert meta["format"] == "epi-trace" and meta["format_version"] == 1
    assert meta["segment"] == 1 and meta["emulated"] is True
    assert meta["stats"]["clean_stop"] is True
    assert "boot_id" in meta and "host" in meta
    lines = samples_p.read_text().splitlines()
    assert lines[0] == ",".join(SAMPLE_COLUMNS)
    # a missing value is an empty field, never 0
    assert lines[2].split(",")[4] == ""
    assert events_p.read_text().splitlines()[0] == ",".join(EVENT_COLUMNS)

    trace = read_trace(tmp_path)
    rows = list(trace.samples())
    assert [r["channel"] for r in rows] == [0, 1]
    assert rows[0]["power_w"] == 10.5 and rows[1]["power_w"] is None
    assert rows[0]["t_mono_ns"] == 1000 and isinstance(rows[0]["t_real_ns"], int)
    (ev,) = list(trace.events())
    assert ev["kind"] == "bus_error" and ev["detail"] == "frame, with a comma"


def test_pandas_reads_a_segment_directly(tmp_path: Path) -> None:
    pd = pytest.importorskip("pandas")
    w = TraceWriter(tmp_path, {})
    w.write_samples([_row(0, 0, 1000), _row(0, 1, 1100, power=None)])
    w.write_event(1200, 1300, None, "start", "x")
    w.close()
    _, samples_p, events_p = segment_paths(tmp_path, 1)
    df = pd.read_csv(samples_p)
    assert list(df.columns) == list(SAMPLE_COLUMNS)
    assert df["t_mono_ns"].dtype == "int64"
    assert df["power_w"].isna().tolist() == [False, True]
    ev = pd.read_csv(events_p)
    assert ev["channel"].isna().all() and ev["kind"].tolist() == ["start"]


def test_rows_reach_the_file_without_close(tmp_path: Path) -> None:
    """What kill -9 leaves: rows written are in the file even if the writer never closes."""
    w = TraceWriter(tmp_path, {})
    w.write_samples([_row(0, 0, 1)])
    _, samples_p, _ = segment_paths(tmp_path, 1)
    assert samples_p.read_text().count("\n") == 2
    w.close()


def test_truncated_final_record_is_dropped(tmp_path: Path) -> None:
    w = TraceWriter(tmp_path, {})
    w.write_samples([_row(i, 0, 1000 * i) for i in range(5)])
    w.close()
    _, samples_p, events_p = segment_paths(tmp_path, 1)
    with open(samples_p, "ab") as f:
        f.write(b"5,0,5000,17000")  # cut mid-record, no newline
    with open(events_p, "ab") as f:
        f.write(b'7,8,,gap,"unterminated')
    trace = read_trace(tmp_path)
    assert [r["seq"] for r in trace.samples()] == [0, 1, 2, 3, 4]
    assert list(trace.events()) == []
    assert trace.dropped_lines == 2


def test_malformed_final_line_with_newline_is_dropped_but_not_in_the_middle(
    tmp_path: Path,
) -> None:
    w = TraceWriter(tmp_path, {})
    w.write_samples([_row(0, 0, 1)])
    w.close()
    _, samples_p, _ = segment_paths(tmp_path, 1)
    with open(samples_p, "ab") as f:
        f.write(b"\x00\x00\x00\x00\n")  # what a power cut can leave
    assert len(list(read_trace(tmp_path).samples())) == 1
    with open(samples_p, "ab") as f:
        f.write(b"1,0,2,3,4,5,6,7,8,9,0\n")
    text = samples_p.read_bytes().replace(b"\x00\x00\x00\x00\n", b"1,0,x\n")
    samples_p.write_bytes(text)
    with pytest.raises(UserError, match=r"line 3: malformed"):
        read_trace(tmp_path)


def test_restart_makes_a_new_segment_and_the_reader_records_the_gap(tmp_path: Path) -> None:
    w1 = TraceWriter(tmp_path, {"boot_id": "b"})
    w1.write_samples([_row(0, 0, 1_000), _row(0, 1, 1_100)])
    w1.write_samples([_row(1, 0, 2_000), _row(1, 1, 2_100)])
    # no close: the first daemon "crashed"; the kernel drops its lock when the process dies,
    # which we imitate by closing only the lock
    w1._dir_lock.release()  # type: ignore[union-attr]
    w2 = TraceWriter(tmp_path, {"boot_id": "b"})
    assert w2.segment == 2
    assert w2.previous is not None and w2.previous.t_mono_ns == 2_100
    assert w2.previous.clean_stop is False
    w2.write_samples([_row(0, 0, 9_000), _row(0, 1, 9_100)])
    w2.write_event(2_100, 5, None, "gap", gap_detail(9_000, 6, "daemon restart"))
    w2.close(stats={"clean_stop": True})

    trace = read_trace(tmp_path)
    assert [s.number for s in trace.segments] == [1, 2]
    assert [(r["segment"], r["seq"], r["channel"]) for r in trace.samples()] == [
        (1, 0, 0), (1, 0, 1), (1, 1, 0), (1, 1, 1), (2, 0, 0), (2, 0, 1),
    ]
    seg_gaps = {g.channel: g for g in trace.gaps if g.source == "segments"}
    assert (seg_gaps[0].start_mono_ns, seg_gaps[0].end_mono_ns) == (2_000, 9_000)
    assert (seg_gaps[1].start_mono_ns, seg_gaps[1].end_mono_ns) == (2_100, 9_100)
    assert "without a clean stop" in seg_gaps[0].reason and seg_gaps[0].same_clock
    (ev_gap,) = [g for g in trace.gaps if g.source == "event"]
    assert (ev_gap.channel, ev_gap.start_mono_ns, ev_gap.end_mono_ns) == (None, 2_100, 9_000)
    assert ev_gap.reason == "daemon restart"
    w1.close()


def test_segments_from_different_boots_are_not_on_one_clock(tmp_path: Path) -> None:
    for boot in ("a", "b"):
        w = TraceWriter(tmp_path, {"boot_id": boot})
        w.write_samples([_row(0, 0, 5)])
        w.close(stats={"clean_stop": True})
    (gap,) = read_trace(tmp_path).gaps
    assert gap.same_clock is False and "daemon stopped" in gap.reason


def test_second_writer_on_the_same_directory_is_refused(tmp_path: Path) -> None:
    w = TraceWriter(tmp_path, {})
    with pytest.raises(UserError, match=r"in use by another daemon \(pid \d+\)"):
        TraceWriter(tmp_path, {})
    w.close()
    TraceWriter(tmp_path, {}).close()  # free again after close


def test_meta_update_is_atomic_and_keeps_keys(tmp_path: Path) -> None:
    w = TraceWriter(tmp_path, {"board": {"bus": "spi0"}})
    w.update_meta(stats={"sweeps": 3})
    meta_p, _, _ = segment_paths(tmp_path, 1)
    meta = json.loads(meta_p.read_text())
    assert meta["board"] == {"bus": "spi0"} and meta["stats"] == {"sweeps": 3}
    assert [p.name for p in tmp_path.iterdir() if ".tmp-" in p.name] == []
    w.close()


@pytest.mark.parametrize(
    ("meta", "message"),
    [
        ({"format": "other", "format_version": 1}, "format is 'other'"),
        ({"format": "epi-trace", "format_version": 99}, "newer than this reader knows"),
        ({"format": "epi-trace"}, "format_version is None"),
    ],
)
def test_reader_refuses_unknown_formats(tmp_path: Path, meta: dict, message: str) -> None:
    meta_p, _, _ = segment_paths(tmp_path, 1)
    meta_p.write_text(json.dumps(meta))
    with pytest.raises(UserError, match=message) as info:
        read_trace(tmp_path)
    assert str(meta_p) in str(info.value)


def test_reader_errors_name_the_directory(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="no trace segments"):
        read_trace(tmp_path)
    with pytest.raises(UserError, match="not a trace directory"):
        read_trace(tmp_path / "missing")


def test_unwritable_directory_is_a_user_error(tmp_path: Path) -> None:
    target = tmp_path / "file"
    target.write_text("")
    with pytest.raises(UserError, match="cannot create the trace directory"):
        TraceWriter(target / "trace", {})


def test_segment_killed_before_its_meta_is_skipped(tmp_path: Path) -> None:
    w = TraceWriter(tmp_path, {})
    w.write_samples([_row(0, 0, 1)])
    w.close()
    # what a daemon killed between creating its CSV files and writing meta.json leaves
    _, samples_p, events_p = segment_paths(tmp_path, 2)
    samples_p.write_text(",".join(SAMPLE_COLUMNS) + "\n")
    events_p.write_text(",".join(EVENT_COLUMNS) + "\n")
    trace = read_trace(tmp_path)
    assert [s.number for s in trace.segments] == [1] and trace.skipped_segments == [2]
    w3 = TraceWriter(tmp_path, {})
    assert w3.segment == 3
    w3.close()
    samples_p.write_text(",".join(SAMPLE_COLUMNS) + "\n" + "0,0,1,2,3,4,5,6,7,8,0\n")
    with pytest.raises(UserError, match="missing, but segment 2 has data rows"):
        read_trace(tmp_path)
