"""The bridge path on the recording session the direct path uses: SIGHUP
checkpoints and keeps running, /metrics and /status count the sweeps really recorded, and a
rate the serial link cannot carry is refused in one line."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from epi.formats.trace import read_trace, segment_paths
from meter.clock import SimulatedClock
from meter.daemon.service import DaemonOptions, MeterDaemon
from meter.emulation.power_models import ConstantPower


def _rows(path: Path) -> int:
    try:
        return path.read_bytes().count(b"\n") - 1
    except FileNotFoundError:
        return 0


def _wait(what: str, cond, timeout_s: float = 60.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


@pytest.mark.slow
def test_sighup_on_the_bridge_checkpoints_and_keeps_running(tmp_path: Path) -> None:
    """It used to end with "internal error (AttributeError: 'BridgeRecorder' object has no
    attribute 'request_checkpoint')", exit 1 and no stop event."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "epi.cli", "meter", "run", "--emulate-bridge", "--out",
         str(tmp_path), "--listen", "off", "--rate", "10"], stderr=subprocess.PIPE, text=True)
    try:
        meta_p, samples_p, _ = segment_paths(tmp_path, 1)
        _wait("rows", lambda: _rows(samples_p) >= 20 or proc.poll() is not None)
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
        proc.send_signal(signal.SIGHUP)
        _wait("the checkpoint", lambda: b"signal" in (samples_p.with_name(
            "seg-000001.events.csv").read_bytes()) or proc.poll() is not None)
        n = _rows(samples_p)
        _wait("rows after the signal", lambda: _rows(samples_p) >= n + 20
              or proc.poll() is not None)
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
        checkpoint = json.loads(meta_p.read_text())["stats"]
        assert checkpoint["clean_stop"] is False and checkpoint["sweeps"] > 0
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    seg = read_trace(tmp_path).segments[0]
    kinds = [e.kind for e in seg.events]
    assert "signal" in kinds and kinds[-1] == "stop" and kinds.index("signal") < len(kinds) - 1
    assert seg.meta["stats"]["clean_stop"] is True


def test_bridge_metrics_and_status_count_the_sweeps_recorded(tmp_path: Path) -> None:
    """/metrics and /status said `sweeps_total 0` while hundreds of sweeps were recorded."""
    opts = DaemonOptions(out_dir=tmp_path / "t", emulate_bridge=True, listen="127.0.0.1:0",
                         n_emulated_channels=2, power_model=[ConstantPower(4.0)] * 2)
    daemon = MeterDaemon(opts, log=lambda line: None)
    worker = threading.Thread(target=daemon.run, daemon=True)
    worker.start()
    try:
        _wait("the server", lambda: daemon.server is not None and daemon.ready.is_set())
        assert daemon.server is not None
        url = daemon.server.url

        def status() -> dict:  # type: ignore[type-arg]
            with urllib.request.urlopen(url + "/status", timeout=5) as r:
                return json.loads(r.read())  # type: ignore[no-any-return]

        _wait("samples", lambda: status()["channels"][0].get("samples_total", 0) >= 10)
        with urllib.request.urlopen(url + "/metrics", timeout=5) as r:
            metrics = r.read().decode()
        (line,) = [ln for ln in metrics.splitlines() if ln.startswith("epi_meter_sweeps_total")]
        sweeps_metric = float(line.split()[-1])
        assert sweeps_metric >= 10
        samples = status()["channels"][0]["samples_total"]
        assert status()["sweeps_total"] >= samples  # one row a sweep on a healthy channel
    finally:
        daemon.stop()
        worker.join(timeout=15)
    assert not worker.is_alive()
    meta = json.loads((tmp_path / "t" / "seg-000001.meta.json").read_text())
    assert daemon.session is not None
    assert daemon.session.state.sweeps_total == meta["stats"]["sweeps"] > 0


@pytest.mark.parametrize("rate", ["500", "25"])
def test_bridge_refuses_a_rate_its_link_cannot_carry(
        tmp_path: Path, rate: str, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """At 115200 baud the UART moves 11 520 bytes/s; the firmware's widest JSON sweep line for
    four channels is 479 bytes (every field at its widest), so 24 lines/s at most. --rate 500
    used to run silently."""
    from epi.cli import main

    monkeypatch.setattr(sys, "argv", ["epi", "meter", "run", "--emulate-bridge", "--listen",
                                      "off", "--duration", "0.5", "--out", str(tmp_path / "t"),
                                      "--rate", rate])
    with pytest.raises(SystemExit) as exc:
        main()
    out = capsys.readouterr().err
    assert exc.value.code == 2, out
    assert out.count("\n") == 1 and "Traceback" not in out
    assert f"--rate: {rate} Hz is more than the link carries" in out
    assert "115200 baud" in out and "24.1 json sweep lines/s" in out
    assert not (tmp_path / "t").exists()  # refused before the trace directory is made


def test_a_bridge_rate_the_link_carries_runs(tmp_path: Path) -> None:
    opts = DaemonOptions(out_dir=tmp_path, emulate_bridge=True, listen=None, rate_hz=24.0,
                         clock=SimulatedClock(), duration_s=3.0,
                         power_model=[ConstantPower(4.0)] * 4)
    result = MeterDaemon(opts, log=lambda line: None).run()
    assert result.rate_hz == 24.0 and result.stats.sweeps > 24


def test_an_emumcu_port_nobody_serves_is_a_lost_link_not_a_crash() -> None:
    from meter.bridge.link import SerialLink
    from meter.errors import LinkLost

    with pytest.raises(LinkLost, match=r"emumcu://nobody: .*no emulated MCU registered there"):
        SerialLink("emumcu://nobody", 115200).open()
