"""Token-log writer and reader (docs/formats.md §2): files, status, append-only validity."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from epi.core.errors import UserError
from host.analysis.tokenlog_reader import read_run as read_token_log
from host.run.tokenlog import (
    EVENT_COLUMNS,
    REQUEST_COLUMNS,
    CsvAppender,
    RequestRecord,
    RunHeader,
    clock_drift_ppm,
)


def _record(request_id: int, repeat: int = 0, warmup: bool = False, n: int = 3) -> RequestRecord:
    base = 1_000_000_000 * (request_id + 1)
    return RequestRecord(
        request_id=request_id,
        repeat=repeat,
        warmup=warmup,
        prompt_id="p1",
        n_prompt_tokens=5,
        t_start_mono_ns=base,
        t_start_real_ns=base + 7,
        token_ids=[10 + i for i in range(n)],
        token_mono_ns=[base + 100 + 10 * i for i in range(n)],
        token_real_ns=[base + 107 + 10 * i for i in range(n)],
        t_end_mono_ns=base + 100 + 10 * n,
        t_end_real_ns=base + 107 + 10 * n,
        node="hostA",
    )


def _header(tmp_path: Path) -> RunHeader:
    return RunHeader.create(tmp_path / "run", {"model": {"path": "m.gguf"}, "placement": [
        {"node": "hostA", "endpoint": None, "layers": [0, 1]}]})


def test_new_log_is_valid_and_running(tmp_path: Path) -> None:
    header = _header(tmp_path)
    data = json.loads((tmp_path / "run" / "run.json").read_text())
    assert data["format"] == "epi-tokenlog" and data["format_version"] == 2
    assert data["status"] == "running" and data["clock_sync"] == []
    assert len(data["run_id"]) == 32
    log = read_token_log(header.run_dir)
    assert list(log.events.columns) == list(EVENT_COLUMNS) and len(log.events) == 0
    assert list(log.requests.columns) == list(REQUEST_COLUMNS) and len(log.requests) == 0


def test_requests_and_idle_windows_round_trip(tmp_path: Path) -> None:
    header = _header(tmp_path)
    app = CsvAppender(header.run_dir)
    app.write_request(_record(0, repeat=-1, warmup=True))
    app.write_idle(0, (1_500_000_005, 6), (1_500_000_008, 9))
    app.write_request(_record(1, repeat=0, n=4))
    app.close()
    header.finish("completed")
    log = read_token_log(header.run_dir)
    ev, rq = log.events, log.requests
    assert log.header["status"] == "completed" and log.header["error"] is None
    assert list(ev["event"]) == (
        ["request_start", "token", "token", "token", "request_end", "idle_start", "idle_end"]
        + ["request_start"]
        + ["token"] * 4
        + ["request_end"]
    )
    idle = ev[ev["event"].str.startswith("idle")]
    assert idle["request_id"].isna().all()
    assert list(idle["t_mono_ns"]) == [1_500_000_005, 1_500_000_008]
    assert list(idle["t_real_ns"]) == [6, 9]
    tokens = ev[(ev["event"] == "token") & (ev["request_id"] == 1)]
    assert list(tokens["token_index"]) == [0, 1, 2, 3]
    assert list(tokens["token_id"]) == [10, 11, 12, 13]
    assert ev["t_mono_ns"].dtype == "int64"
    assert list(rq["warmup"]) == [1, 0] and list(rq["repeat"]) == [-1, 0]
    assert list(rq["n_generated_tokens"]) == [3, 4]
    first, last = tokens["t_mono_ns"].iloc[0], tokens["t_mono_ns"].iloc[-1]
    assert rq.loc[rq["request_id"] == 1, "t_first_token_mono_ns"].item() == first
    assert rq.loc[rq["request_id"] == 1, "t_end_mono_ns"].item() == last
    assert rq["node"].tolist() == ["hostA", "hostA"]


def test_failed_run_needs_its_error(tmp_path: Path) -> None:
    header = _header(tmp_path)
    with pytest.raises(ValueError):
        header.finish("failed")
    header.finish("failed", "worker died")
    data = json.loads(header.path.read_text())
    assert data["status"] == "failed" and data["error"] == "worker died"


def test_refuses_to_overwrite_a_log(tmp_path: Path) -> None:
    _header(tmp_path)
    with pytest.raises(UserError, match="already holds a token log"):
        _header(tmp_path)


def test_truncated_final_line_is_dropped(tmp_path: Path) -> None:
    header = _header(tmp_path)
    app = CsvAppender(header.run_dir)
    app.write_request(_record(0))
    app.close()
    with open(header.run_dir / "events.csv", "a") as fh:
        fh.write("1,0,0,p1,request_start,,,123")  # torn write: no newline
    log = read_token_log(header.run_dir)
    assert len(log.events) == 5 and set(log.events["request_id"]) == {0}


def test_log_stays_valid_when_the_writer_is_killed(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    RunHeader.create(run_dir, {"model": {"path": "m.gguf"}, "placement": []})
    code = textwrap.dedent(
        f"""
        import os, signal, sys
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        from test_tokenlog import _record
        from host.run.tokenlog import CsvAppender
        app = CsvAppender({str(run_dir)!r})
        app.write_request(_record(0))
        app.write_request(_record(1))
        app._events.write("2,0,0,p1,request_start,,,1")  # buffered, never flushed
        os.kill(os.getpid(), signal.SIGKILL)
        """
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).parents[2])
    assert proc.returncode == -signal.SIGKILL
    log = read_token_log(run_dir)
    assert log.header["status"] == "running"
    assert sorted(set(log.events["request_id"])) == [0, 1]
    assert len(log.requests) == 2


def test_reader_refuses_other_formats_and_newer_versions(tmp_path: Path) -> None:
    header = _header(tmp_path)
    data = json.loads(header.path.read_text())
    header.path.write_text(json.dumps({**data, "format_version": 3}))
    with pytest.raises(UserError, match="newer"):
        read_token_log(header.run_dir)
    header.path.write_text(json.dumps({**data, "format": "epi-trace"}))
    with pytest.raises(UserError, match="format"):
        read_token_log(header.run_dir)


def test_clock_sync_entries_and_drift(tmp_path: Path) -> None:
    header = _header(tmp_path)
    entry = {"offset_ns": 1000, "uncertainty_ns": 50, "rtt_ns": 200, "meter_url": "http://m"}
    header.add_clock_sync({**entry, "t_local_mono_ns": 0}, "start")
    assert header.data["clock_drift_ppm"] is None
    header.add_clock_sync({**entry, "t_local_mono_ns": 10**9, "offset_ns": 1000 + 20_000}, "end")
    data = json.loads(header.path.read_text())
    assert [e["when"] for e in data["clock_sync"]] == ["start", "end"]
    assert data["clock_drift_ppm"] == pytest.approx(20.0)  # 20 µs over 1 s
    with pytest.raises(ValueError):
        header.add_clock_sync({**entry, "t_local_mono_ns": 5}, "sometime")
    assert clock_drift_ppm([]) is None


def test_appender_needs_a_log_directory(tmp_path: Path) -> None:
    os.makedirs(tmp_path / "empty")
    with pytest.raises(UserError, match="not a token-log directory"):
        CsvAppender(tmp_path / "empty")


def test_offsets_of_several_meters_are_keyed_by_meter(tmp_path: Path) -> None:
    """Format 2: run.json `meters` lists the daemons in sync order; each entry names its own."""
    from epi.formats.tokenlog import meter_of

    header = _header(tmp_path)
    for url, off in (("http://a:1", 1000), ("http://b:2", -7_000_000)):
        header.add_clock_sync({"t_local_mono_ns": 0, "offset_ns": off, "uncertainty_ns": 5,
                               "rtt_ns": 9, "meter_url": url}, "start")
    header.add_clock_sync({"t_local_mono_ns": 10**9, "offset_ns": 1000 + 20_000,
                           "uncertainty_ns": 5, "rtt_ns": 9, "meter_url": "http://a:1"}, "end")
    data = json.loads(header.path.read_text())
    assert data["meters"] == ["http://a:1", "http://b:2"]
    assert data["clock_drift_ppm"] == pytest.approx(20.0)  # meter a's, not a mix of a and b
    log = read_token_log(header.run_dir)
    assert [meter_of(e, log.header["meters"]) for e in log.clock_sync] == [0, 1, 0]
    # an entry naming a meter the run does not list is refused, in one line
    bad = dict(data, clock_sync=[*data["clock_sync"], {**data["clock_sync"][0],
                                                        "meter_url": "http://c:3"}])
    header.path.write_text(json.dumps(bad))
    with pytest.raises(UserError, match=r"clock_sync\[3\]\.meter_url: 'http://c:3' is not one"):
        read_token_log(header.run_dir)
    header.path.write_text(json.dumps(dict(data, meters=["http://a:1", "http://a:1"])))
    with pytest.raises(UserError, match="appears twice"):
        read_token_log(header.run_dir)
    header.path.write_text(json.dumps({k: v for k, v in data.items() if k != "meters"}))
    with pytest.raises(UserError, match="field meters"):
        read_token_log(header.run_dir)


def test_a_version_1_log_still_reads_with_one_meter(tmp_path: Path) -> None:
    """Logs written before format 2 have no `meters`: every offset is the one meter's."""
    from epi.formats.tokenlog import meter_of

    header = _header(tmp_path)
    header.add_clock_sync({"t_local_mono_ns": 0, "offset_ns": 1000, "uncertainty_ns": 5,
                           "rtt_ns": 9, "meter_url": "http://a:1"}, "start")
    data = json.loads(header.path.read_text())
    old = {k: v for k, v in data.items() if k != "meters"} | {"format_version": 1}
    old["clock_sync"] = [{k: v for k, v in e.items() if k != "meter_url"}
                         for e in old["clock_sync"]]
    header.path.write_text(json.dumps(old))
    log = read_token_log(header.run_dir)
    assert log.header["format_version"] == 1 and "meters" not in log.header
    assert [meter_of(e, None) for e in log.clock_sync] == [0]
