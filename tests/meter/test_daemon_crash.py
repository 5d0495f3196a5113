"""kill -9 of a running daemon (a subprocess) at several moments, restarts, then read back."""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from epi.formats.trace import read_trace, segment_paths

pytestmark = pytest.mark.slow


def _start(out: Path, *extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "epi.cli", "meter", "run", "--emulate", "--out", str(out),
         "--listen", "127.0.0.1:0", "--rate", "40", *extra],
        stderr=subprocess.PIPE, text=True,
    )


def _rows(path: Path) -> int:
    try:
        return path.read_bytes().count(b"\n") - 1
    except FileNotFoundError:
        return 0


def _wait_rows(path: Path, n: int, proc: subprocess.Popen[str], timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while _rows(path) < n:
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
        assert time.monotonic() < deadline, f"no {n} rows in {path}"
        time.sleep(0.02)


def test_kill_9_at_any_moment_leaves_a_valid_trace_that_restarts_continue(
    tmp_path: Path,
) -> None:
    rng = random.Random(20240601)
    out = tmp_path / "trace"
    kills: list[tuple[int, int]] = []  # (segment, monotonic time of the kill)
    # 1) killed while starting up (perhaps before any file exists), 2-4) killed mid-run at
    # random moments, while rows are being written
    proc = _start(out)
    time.sleep(rng.uniform(0.05, 0.4))
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)
    for segment_hint in range(3):
        proc = _start(out)
        line = proc.stderr.readline() if proc.stderr else ""
        if "lowered to" in line:  # a loaded machine: the bus as driven is slower; one line
            line = proc.stderr.readline() if proc.stderr else ""
        assert "epi meter: sampling" in line, line
        seg = int(line.rsplit("segment ", 1)[1].split(";")[0])
        _, samples_p, _ = segment_paths(out, seg)
        _wait_rows(samples_p, 40 + 30 * segment_hint, proc)
        time.sleep(rng.uniform(0.0, 0.5))
        t_kill = time.monotonic_ns()
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
        kills.append((seg, t_kill))

    # a last, clean run with faults injected in real time: the daemon rides through them
    proc = _start(out, "--duration", "3", "--fault-injection",
                  "reset:1@0.5,absent:2@0.8+0.6,bit-errors:3@0.5+1=0.001")
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert "stopped:" in err

    trace = read_trace(out)
    numbers = [s.number for s in trace.segments]
    last = trace.segments[-1]
    assert last.meta["stats"]["clean_stop"] is True
    assert trace.dropped_lines <= len(kills) + 1  # at most one cut record per kill
    for seg, t_kill in kills:
        segment = trace.segments[numbers.index(seg)]
        assert segment.meta["stats"]["clean_stop"] is False
        t_last = max(r.t_mono_ns for r in segment.samples)
        # after kill -9 at most the last second is lost (here: at most the sweep under way)
        assert 0 < t_kill - t_last < 1_000_000_000, (seg, t_kill - t_last)
        # every row read back is whole
        assert all(r.power_w is not None and r.energy_j is not None
                   for r in segment.samples)
    # every restart recorded the gap from the previous segment's last sample
    for segment in trace.segments[1:]:
        if not any(s.samples for s in trace.segments if s.number < segment.number):
            continue
        restart = [e for e in segment.events if e.kind == "gap" and e.channel is None]
        assert restart and "daemon restart" in restart[0].detail, segment.number
    seg_gaps = [g for g in trace.gaps if g.source == "segments"]
    assert len(seg_gaps) >= 4 * (len(trace.segments) - 1)
    # the faults of the last run are in its events, and sampling went on after them
    kinds = {(e.channel, e.kind) for e in last.events}
    assert (1, "chip_reset") in kinds and (2, "absent") in kinds
    sched0 = last.meta["sampler"]["schedule_start_mono_ns"]
    for ch in range(4):
        assert max(r.t_mono_ns for r in last.samples if r.channel == ch) > sched0 + 2e9


def test_sigterm_is_a_clean_stop(tmp_path: Path) -> None:
    proc = _start(tmp_path)
    _, samples_p, _ = segment_paths(tmp_path, 1)
    _wait_rows(samples_p, 20, proc)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    seg = read_trace(tmp_path).segments[0]
    assert seg.meta["stats"]["clean_stop"] is True
    assert seg.events[-1].kind == "stop" and seg.dropped_lines == 0


def test_sighup_checkpoints_and_sampling_goes_on(tmp_path: Path) -> None:
    """SIGHUP used to stop the daemon with exit 0, so Restart=on-failure left it down."""
    proc = _start(tmp_path)
    meta_p, samples_p, _ = segment_paths(tmp_path, 1)
    _wait_rows(samples_p, 10, proc)
    first_meta = json.loads(meta_p.read_text())
    assert "samples_written" in first_meta["stats"]  # the full stats block from the start
    proc.send_signal(signal.SIGHUP)
    n = _rows(samples_p)
    _wait_rows(samples_p, n + 20, proc)  # still sampling after the signal
    assert proc.poll() is None
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    seg = read_trace(tmp_path).segments[0]
    kinds = [e.kind for e in seg.events]
    assert "signal" in kinds and kinds[-1] == "stop" and kinds.index("signal") < len(kinds) - 1


def test_removed_out_dir_is_an_error_exit_that_systemd_restarts(tmp_path: Path) -> None:
    out = tmp_path / "trace"
    proc = _start(out)
    _, samples_p, _ = segment_paths(out, 1)
    _wait_rows(samples_p, 10, proc)
    shutil.rmtree(out)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 2 and "trace lost" in err and "Traceback" not in err


def test_shipped_unit_restarts_every_unplanned_stop() -> None:
    unit = Path(__file__).parents[2] / "hardware" / "systemd" / "epi-meter.service"
    lines = unit.read_text().splitlines()
    assert "Restart=always" in lines and "ExecReload=/bin/kill -HUP $MAINPID" in lines
