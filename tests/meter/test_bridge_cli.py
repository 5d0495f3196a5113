"""The bridge's commands and board files: `epi meter run --emulate-bridge` through pyserial
(the firmware behind an `emumcu://` port), `epi meter firmware build|deploy|console`, the
doctor check, and one-line errors for bad `bus = "bridge"` board files."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from epi.cli import cli
from meter.clock import SystemClock
from meter.emulation.power_models import ConstantPower

REPO = Path(__file__).resolve().parents[2]


def _board_file(tmp_path: Path, body: str) -> Path:
    p = tmp_path / "b.toml"
    p.write_text('format = "epi-board"\nformat_version = 1\nbus = "bridge"\n' + body)
    return p


@pytest.mark.parametrize(("body", "message"), [
    ("", "bridge: bus = \"bridge\" needs a [bridge] table"),
    ("[bridge]\nbaud = 115200\n", "bridge.port: missing"),
    ('[bridge]\nport = "/dev/ttyAMA0"\nbaud = 12345\n', "bridge.baud: 12345"),
    ('[bridge]\nport = "/dev/ttyAMA0"\nencoding = "xml"\n', "bridge.encoding"),
    ('[bridge]\nport = "/dev/ttyAMA0"\nparity = "E"\n', "bridge.parity: unknown key"),
    ('[bridge]\nport = "/dev/ttyAMA0"\n[[channel]]\nchip_select = "CE0"\n',
     "channel[0].chip_select: unknown key for a bridge board"),
])
def test_bad_bridge_board_is_one_line(tmp_path: Path, body: str, message: str,
                                      monkeypatch: pytest.MonkeyPatch,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    from epi.cli import main

    board = _board_file(tmp_path, body)
    monkeypatch.setattr(sys, "argv", ["epi", "meter", "run", "--board", str(board), "--out",
                                      str(tmp_path / "t"), "--duration", "1", "--listen", "off"])
    with pytest.raises(SystemExit) as exc:
        main()
    err = capsys.readouterr().err
    assert exc.value.code == 2, err
    assert err.startswith("epi: error: ") and message in err and str(board) in err
    assert err.count("\n") == 1 and "Traceback" not in err


def test_example_board_file_loads() -> None:
    from meter.board.channels import load_board

    board = load_board(REPO / "hardware" / "epi-meter-bridge.toml")
    assert board.bridge is not None and board.bridge.port == "/dev/ttyAMA0"
    assert board.bridge.baud == 115200 and len(board.channels) == 4


def test_firmware_build_compiles_every_file(tmp_path: Path) -> None:
    res = CliRunner().invoke(cli, ["meter", "firmware", "build", "--out", str(tmp_path)])
    assert res.exit_code == 0, res.output
    mpys = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*.mpy"))
    assert "meter/chip/registers.mpy" in mpys and "meter/firmware/app.mpy" in mpys
    assert "meter/firmware/selftest.mpy" not in mpys
    for p in tmp_path.rglob("*.mpy"):
        assert p.read_bytes()[:2] == b"M\x06", p
    assert (tmp_path / "main.py").read_text() == (REPO / "meter/firmware/main.py").read_text()


def test_firmware_deploy_dry_run_is_one_mpremote_argv(tmp_path: Path) -> None:
    cfg = tmp_path / "epi_meter.json"
    cfg.write_text('{"format": "epi-bridge-config", "format_version": 1, "rate_hz": 20}')
    res = CliRunner().invoke(cli, ["meter", "firmware", "deploy", "--port", "/dev/ttyACM0",
                                   "--config", str(cfg), "--dry-run"])
    assert res.exit_code == 0, res.output
    argv = res.output.split()
    assert argv[0].endswith("mpremote") and argv[1:3] == ["connect", "/dev/ttyACM0"]
    assert ":main.py" in argv and ":epi_meter.json" in argv and argv[-1] == "reset"
    assert argv[argv.index("cp") + 1] == "-r"


@pytest.fixture
def mcu_port():
    from meter.bridge.emulate import EmulatedBoard
    from meter.bridge.emulated_port import serve_board

    board = EmulatedBoard(SystemClock(), [ConstantPower(4.0), ConstantPower(6.0)],
                          model_spi_time=False)
    port = serve_board(board, 115200)
    yield port.url
    port.close()


def test_probe_and_doctor_see_the_firmware_on_an_emulated_port(
        mcu_port: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from meter.bridge.probe import doctor_rows, hello

    assert mcu_port.startswith("emumcu://")
    info = hello(mcu_port, 115200, timeout_s=10.0)
    assert info is not None and info["fw"] == "1.0.0" and len(info["channels"]) == 2
    monkeypatch.setenv("EPI_BRIDGE_PORT", mcu_port)
    rows = {item: (ok, detail) for item, ok, detail, _ in doctor_rows()}
    assert rows["bridge port"][0] is True and mcu_port in rows["bridge port"][1]
    ok, detail = rows["bridge firmware"]
    assert ok is True and "epi firmware 1.0.0" in detail


@pytest.mark.long
def test_doctor_says_when_no_firmware_answers(tmp_path: Path) -> None:
    import os

    from meter.bridge.probe import doctor_rows

    master, slave = os.openpty()  # a port with nothing behind it
    try:
        rows = {item: ok for item, ok, _, _ in doctor_rows(os.ttyname(slave))}
    finally:
        os.close(master)
        os.close(slave)
    assert rows == {"bridge port": True, "bridge firmware": False}


@pytest.mark.long
def test_console_sends_a_command_and_prints_the_answer(mcu_port: str) -> None:
    res = CliRunner().invoke(cli, ["meter", "firmware", "console", "--port", mcu_port,
                                   "--send", "ping", "--send", '{"cmd": "read", "ch": 0, '
                                   '"reg": "Urms"}', "--seconds", "2"])
    assert res.exit_code == 0, res.output
    assert "kind='pong'" in res.output
    assert "'reg': 'Urms'" in res.output


@pytest.mark.slow
def test_meter_run_emulate_bridge_through_pyserial(tmp_path: Path) -> None:
    out = tmp_path / "trace"
    res = CliRunner().invoke(cli, ["meter", "run", "--emulate-bridge", "--out", str(out),
                                   "--duration", "4", "--listen", "off"])
    assert res.exit_code == 0, res.output
    meta = json.loads((out / "seg-000001.meta.json").read_text())
    assert meta["bridged"] is True and meta["emulated"] is True
    assert meta["bridge"]["link"]["kind"] == "serial"
    assert meta["bridge"]["link"]["port"].startswith("emumcu://")
    assert meta["bridge"]["firmware"]["fw"] == "1.0.0"
    assert meta["stats"]["clean_stop"] is True
    rows = (out / "seg-000001.samples.csv").read_text().splitlines()[1:]
    assert len(rows) >= 4 * 20  # 4 channels, 10 sweeps/s, ~3 s after start-up
    assert {r.split(",")[1] for r in rows} == {"0", "1", "2", "3"}


def _wait(cond, timeout_s: float = 30.0) -> None:
    import time

    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.02)


@pytest.mark.slow
def test_serial_port_unplugged_and_replugged_is_a_recorded_reconnect(tmp_path: Path) -> None:
    """The real SerialLink on an emulated port that vanishes (`unplug`: open, read and write
    fail as for a pulled USB adapter) and comes back; the recorder keeps going, the MCU keeps
    running meanwhile, and the trace has the gap."""
    import threading

    from epi.formats.trace import read_trace
    from meter.bridge.emulate import EmulatedBoard
    from meter.bridge.emulated_port import serve_board
    from meter.bridge.faults import parse_uart_faults
    from meter.bridge.link import SerialLink
    from meter.bridge.recorder import BridgeRecorder
    from meter.daemon.trace import TraceLock, TraceWriter

    clock = SystemClock()
    board = EmulatedBoard(clock, [ConstantPower(4.0)], model_spi_time=False)
    port = serve_board(board, 115200, parse_uart_faults(["unplug@2+1.5"]))
    writer = TraceWriter(tmp_path / "t", {"test": True}, lock=TraceLock(tmp_path / "t"))
    rec = BridgeRecorder(SerialLink(port.url, 115200), clock, writer, baud=115200,
                         reconnect_s=0.2, idle_until=port.idle_until)
    worker = threading.Thread(target=rec.run, daemon=True)
    worker.start()
    try:
        _wait(lambda: rec.stats.samples_written >= 5)
        _wait(lambda: not rec.connected)
        seq_before = rec.last_seq
        _wait(lambda: board.firmware.seq > (seq_before or 0) + 5)  # the MCU goes on
        _wait(lambda: rec.stats.reconnects == 1 and rec.last_seq is not None
              and rec.last_seq > (seq_before or 0) + 5)
        _wait(lambda: rec.stats.samples_written >= 12)
    finally:
        rec.stop()
        worker.join(timeout=10)
        port.close()
        writer.close()
    assert not worker.is_alive()
    trace = read_trace(tmp_path / "t")
    gaps = [e for e in trace.events() if e["kind"] == "gap"
            and "serial link lost" in e["detail"]]
    assert len(gaps) == 1, list(trace.events())
    energies = [r["energy_j"] for r in trace.samples()]
    assert energies == sorted(energies) and rec.stats.lost_lines > 0


@pytest.mark.slow
def test_bridge_daemon_serves_clock_sync_and_status(tmp_path: Path) -> None:
    import threading
    import urllib.request

    from meter.daemon.service import DaemonOptions, MeterDaemon

    opts = DaemonOptions(out_dir=tmp_path / "t", emulate_bridge=True, listen="127.0.0.1:0",
                         n_emulated_channels=2, power_model=[ConstantPower(4.0)] * 2)
    daemon = MeterDaemon(opts, log=lambda line: None)
    worker = threading.Thread(target=daemon.run, daemon=True)
    worker.start()
    try:
        _wait(lambda: daemon.server is not None and daemon.ready.is_set())
        assert daemon.server is not None
        url = daemon.server.url

        def status() -> dict:
            with urllib.request.urlopen(url + "/status", timeout=5) as r:
                return json.loads(r.read())

        _wait(lambda: status()["channels"][0].get("samples_total", 0) >= 3)
        with urllib.request.urlopen(url + "/clock", timeout=5) as r:
            clock = json.loads(r.read())
        assert clock["boot_id"] and clock["clock"] == "system"
        assert status()["bridged"] is True
    finally:
        daemon.stop()
        worker.join(timeout=15)
    assert not worker.is_alive()
    meta = json.loads((tmp_path / "t" / "seg-000001.meta.json").read_text())
    assert meta["listen"] == url and meta["stats"]["clean_stop"] is True


@pytest.mark.long
def test_missing_port_is_waited_for_not_fatal(tmp_path: Path) -> None:
    """A real bridge board whose port is not there (yet): the daemon says so once, keeps
    retrying, and stops cleanly; the trace says the link never came."""
    from meter.daemon.service import DaemonOptions, MeterDaemon

    board = _board_file(tmp_path, f'[bridge]\nport = "{tmp_path / "ttyNONE"}"\n')
    logs: list[str] = []
    opts = DaemonOptions(out_dir=tmp_path / "t", board_path=board, duration_s=1.5, listen=None)
    MeterDaemon(opts, log=logs.append).run()
    assert sum("waiting for the port" in line for line in logs) == 1, logs
    meta = json.loads((tmp_path / "t" / "seg-000001.meta.json").read_text())
    assert meta["stats"]["clean_stop"] is True and meta["bridge"]["firmware"] is None
    assert meta["bridged"] is True and meta["emulated"] is False


def test_meter_read_on_a_bridge_board_says_where_the_chips_are(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from epi.cli import main

    board = REPO / "hardware" / "epi-meter-bridge.toml"
    monkeypatch.setattr(sys, "argv", ["epi", "meter", "read", "--board", str(board)])
    with pytest.raises(SystemExit) as exc:
        main()
    err = capsys.readouterr().err
    assert exc.value.code == 2 and "read by the board's MCU" in err and err.count("\n") == 1
