"""Storage faults on the bridge path, mirroring the direct-SPI path's tests:
`--out` removed while `epi meter run --emulate-bridge` records is a one-line error exit
(status 2, restartable by systemd), and a full disk is a counted `disk_full` fault."""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from epi.formats.trace import read_trace, segment_paths
from meter.bridge.emulate import EmulatedBoard
from meter.bridge.emulated_port import serve_board
from meter.bridge.link import SerialLink
from meter.bridge.recorder import BridgeRecorder
from meter.clock import SimulatedClock
from meter.daemon import trace as trace_mod
from meter.daemon.trace import TraceLock, TraceWriter
from meter.emulation.power_models import ConstantPower

NS = 1_000_000_000


def _rows(path: Path) -> int:
    try:
        return path.read_bytes().count(b"\n") - 1
    except FileNotFoundError:
        return 0


@pytest.mark.slow
def test_removed_out_dir_is_an_error_exit_for_the_bridge_too(tmp_path: Path) -> None:
    out = tmp_path / "trace"
    proc = subprocess.Popen(
        [sys.executable, "-m", "epi.cli", "meter", "run", "--emulate-bridge", "--out", str(out),
         "--listen", "off"], stderr=subprocess.PIPE, text=True)
    try:
        _, samples_p, _ = segment_paths(out, 1)
        deadline = time.monotonic() + 60
        while _rows(samples_p) < 10:  # wait on rows being written, not on a sleep
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            assert time.monotonic() < deadline, "no rows"
            time.sleep(0.02)
        shutil.rmtree(out)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 2 and "trace lost" in err and "Traceback" not in err, err
    assert "removed while the daemon wrote" in err


def test_a_full_disk_is_a_counted_disk_full_fault_and_recording_resumes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = os.write
    full = {"on": False}

    def write(fd: int, data: bytes | memoryview) -> int:
        if full["on"]:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(fd, data)

    clock = SimulatedClock(5 * NS)
    board = EmulatedBoard(clock, [ConstantPower(10.0)])
    writer = TraceWriter(tmp_path, {"test": True}, lock=TraceLock(tmp_path))
    port = serve_board(board, 115200)  # the firmware behind an emumcu:// port
    rec = BridgeRecorder(SerialLink(port.url, 115200), clock, writer, baud=115200,
                         idle_until=port.idle_until)
    seen: list[tuple[int | None, str]] = []
    rec.on_fault = lambda ch, kind: seen.append((ch, kind))
    rec.run(2.0)
    monkeypatch.setattr(trace_mod.os, "write", write)
    full["on"] = True
    rec.run(2.0)
    full["on"] = False
    rec.run(2.0)
    monkeypatch.undo()
    writer.close()
    assert rec.stats.faults.get("disk_full") == 1 and seen == [(None, "disk_full")]
    trace = read_trace(tmp_path)
    kinds = [e["kind"] for e in trace.events()]
    assert "disk_full" in kinds and "gap" in kinds
    assert writer.rows_dropped >= 15
    rows = list(trace.samples())
    assert rows[-1]["t_mono_ns"] > clock.monotonic_ns() - NS  # recording resumed
