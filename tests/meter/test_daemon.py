"""The daemon end to end: faults survived and visible, endpoints live, CLI errors, rate choice.

The kill -9 and restart tests run the daemon as a subprocess: see test_daemon_crash.py.
"""

from __future__ import annotations

import itertools
import json
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from epi.core.clocksync import estimate_offset
from epi.core.errors import UserError
from epi.formats.trace import read_trace
from meter.clock import SimulatedClock
from meter.daemon.service import (
    DaemonOptions,
    MeterDaemon,
    default_rate_hz,
    frames_per_read,
)
from meter.daemon.trace import TraceLock
from meter.emulation.power_models import ConstantPower, ScriptedProfile

S = 1_000_000_000
FAULTS = [
    "reset:0@5",
    "checksum:1@8",
    "absent:2@10+3",
    "stuck:3@15+2",
    "bit-errors:0@20+3=0.002",
    "partial-frames:1@25+3=0.02",
]


def _profiles(clock: SimulatedClock) -> list[ScriptedProfile]:
    t0 = clock.monotonic_ns()
    return [
        ScriptedProfile([(0, 5.0 + i), (20, 8.0 + i), (30, 3.0 + i)], start_mono_ns=t0)
        for i in range(4)
    ]


def _run_simulated(out: Path, seconds: float, clock: SimulatedClock | None = None,
                   **kw: object) -> tuple[object, SimulatedClock]:
    clock = clock if clock is not None else SimulatedClock()
    opts = DaemonOptions(out_dir=out, emulate=True, duration_s=seconds, listen=None,
                         clock=clock, power_model=_profiles(clock), **kw)  # type: ignore[arg-type]
    return MeterDaemon(opts, log=lambda _line: None).run(), clock


@pytest.mark.long
def test_every_injected_fault_is_in_the_trace_and_sampling_goes_on(tmp_path: Path) -> None:
    result, _ = _run_simulated(tmp_path, 40.0, faults=FAULTS)
    trace = read_trace(tmp_path)
    (seg,) = trace.segments
    meta = seg.meta
    assert meta["stats"]["clean_stop"] is True and meta["emulated"] is True
    assert [f["spec"] for f in meta["fault_injection"]] == FAULTS
    assert meta["clock"]["kind"] == "simulated" and meta["power_model"]["kind"] == "per_channel"
    sched0 = meta["sampler"]["schedule_start_mono_ns"]
    events = list(trace.events())

    def fault_events(channel: int, kind: str, t0_s: float, t1_s: float) -> list[dict]:
        return [e for e in events if e["channel"] == channel and e["kind"] == kind
                and sched0 + t0_s * S <= e["t_mono_ns"] < sched0 + t1_s * S]

    assert fault_events(0, "chip_reset", 5, 5.2) and fault_events(0, "reinit", 5, 5.2)
    assert fault_events(1, "checksum_error", 8, 8.2) and fault_events(1, "reinit", 8, 8.2)
    assert fault_events(2, "absent", 10, 10.2)
    assert fault_events(3, "bus_error", 15, 15.2)  # a stuck chip: every register one word
    assert any(fault_events(0, k, 20, 23)
               for k in ("bus_error", "checksum_error", "implausible", "misread"))
    # every fault left a gap that closed again: the channel delivered afterwards
    gaps = [g for g in trace.gaps if g.source == "event"]
    for ch, t_s in ((0, 5), (1, 8), (2, 10), (3, 15)):
        (g,) = [g for g in gaps if g.channel == ch and sched0 + t_s * S <= g.start_mono_ns
                < sched0 + (t_s + 0.2) * S]
        assert g.end_mono_ns > g.start_mono_ns and "data resumed" in g.reason
    (absent_gap,) = [g for g in gaps if g.channel == 2 and "absent" in g.reason]
    assert absent_gap.end_mono_ns - absent_gap.start_mono_ns >= 3 * S
    rows = list(trace.samples())
    for ch in range(4):
        last = max(r["t_mono_ns"] for r in rows if r["channel"] == ch)
        assert last > sched0 + 39.5 * S  # still sampling at the end
    # no row for lack of data: every written power is a real reading of the profile
    assert min(r["power_w"] for r in rows) > 2.5
    assert result.stats.failed_reads > 0  # type: ignore[attr-defined]


@pytest.mark.long
def test_trace_energy_matches_the_power_model(tmp_path: Path) -> None:
    """Energy in the trace follows the model's exact integral (to one register LSB)."""
    _run_simulated(tmp_path, 33.0)
    trace = read_trace(tmp_path)
    meta = trace.segments[0].meta
    rows = [r for r in trace.samples() if r["channel"] == 1]
    jpc = meta["channels"][1]["calibration"]["joules_per_count"]
    # between two readings the counter moves by the model's energy, to ±1 count
    first, last = rows[0], rows[-1]
    model = _profiles(SimulatedClock())[1]
    truth = model.energy_j(first["t_mono_ns"], last["t_mono_ns"])
    assert abs((last["energy_j"] - first["energy_j"]) - truth) <= 2 * jpc
    assert all(b["energy_j"] >= a["energy_j"] for a, b in itertools.pairwise(rows))
    assert {r["power_w"] for r in rows} >= {6.0, 9.0, 4.0}


def test_restart_in_process_continues_in_a_new_segment(tmp_path: Path) -> None:
    _, clock = _run_simulated(tmp_path, 2.0)
    clock.advance(5 * S)
    _run_simulated(tmp_path, 2.0, clock=clock)  # the same (simulated) clock, later
    trace = read_trace(tmp_path)
    assert [s.number for s in trace.segments] == [1, 2]
    boots = {s.meta["boot_id"] for s in trace.segments}
    assert len(boots) == 1 and boots.pop().startswith("simulated:")
    (gap_event,) = [e for e in trace.segments[1].events
                    if e.kind == "gap" and e.channel is None]
    assert "daemon restart: segment 1 ended cleanly" in gap_event.detail
    last_1 = max(r.t_mono_ns for r in trace.segments[0].samples)
    assert gap_event.t_mono_ns == last_1
    seg_gaps = [g for g in trace.gaps if g.source == "segments"]
    assert len(seg_gaps) == 4 and all(g.same_clock and "daemon stopped" in g.reason
                                      for g in seg_gaps)
    assert all(g.end_mono_ns - g.start_mono_ns > 5 * S for g in seg_gaps)


def test_another_simulated_clock_is_another_clock_domain(tmp_path: Path) -> None:
    _run_simulated(tmp_path, 1.0)
    _run_simulated(tmp_path, 1.0)  # a new SimulatedClock: its times are not comparable
    trace = read_trace(tmp_path)
    assert trace.segments[0].meta["boot_id"] != trace.segments[1].meta["boot_id"]
    (gap_event,) = [e for e in trace.segments[1].events
                    if e.kind == "gap" and e.channel is None]
    assert "monotonic clocks differ" in gap_event.detail
    assert gap_event.t_mono_ns == trace.segments[1].meta["started_mono_ns"]
    assert not any(g.same_clock for g in trace.gaps if g.source == "segments")


@pytest.mark.slow
def test_live_endpoints_while_running(tmp_path: Path) -> None:
    opts = DaemonOptions(out_dir=tmp_path, emulate=True, listen="127.0.0.1:0",
                         power_model=ConstantPower(12.0), rate_hz=20, duration_s=30)
    daemon = MeterDaemon(opts, log=lambda _line: None)
    thread = threading.Thread(target=daemon.run)
    thread.start()
    try:
        assert daemon.ready.wait(20)
        url = daemon.server.url  # type: ignore[union-attr]
        with urllib.request.urlopen(url + "/stream?limit=8", timeout=10) as resp:
            msgs = [json.loads(line) for line in resp.read().decode().splitlines()]
        samples = [m for m in msgs if m["type"] == "sample"]
        assert len(samples) == 8 and all(m["power_w"] > 11 for m in samples)
        with urllib.request.urlopen(url + "/metrics", timeout=10) as resp:
            fams = {f.name: f for f in text_string_to_metric_families(resp.read().decode())}
        powers = {s.labels["channel"]: s.value for s in fams["epi_meter_power_watts"].samples}
        assert set(powers) == {"0", "1", "2", "3"} and min(powers.values()) > 11
        assert fams["epi_meter_sweeps"].samples[0].value > 0
        est = estimate_offset(url, samples=8)
        # same machine, same CLOCK_MONOTONIC: the offset is zero within the bound
        assert abs(est.offset_ns) <= est.uncertainty_ns < 1_000_000
    finally:
        daemon.stop()
        thread.join(30)
    assert not thread.is_alive()
    meta = read_trace(tmp_path).segments[0].meta
    assert meta["stats"]["clean_stop"] is True and meta["listen"] == url


def test_second_daemon_on_the_same_directory_is_refused(tmp_path: Path) -> None:
    lock = TraceLock(tmp_path)
    with pytest.raises(UserError, match="in use by another daemon"):
        _run_simulated(tmp_path, 1.0)
    lock.release()


def test_default_rate_follows_the_bus() -> None:
    n = frames_per_read()
    assert 20 <= n <= 60  # LastData-verified reads of ~10 registers
    max_4 = 160_000 / (24 * n * 4)
    assert default_rate_hz(max_4) == 20.0  # 4 chips at 160 kHz: 49 Hz wire limit
    assert default_rate_hz(30.0) == 10.0  # at least 10 Hz where the bus allows
    assert default_rate_hz(4.0) == pytest.approx(1.8)  # a UART bus cannot do 10 Hz


def test_board_file_with_emulate_uses_its_channels_and_rate(tmp_path: Path) -> None:
    board = Path(__file__).resolve().parents[2] / "hardware" / "epi-meter.toml"
    clock = SimulatedClock()
    opts = DaemonOptions(out_dir=tmp_path / "t", board_path=board, emulate=True,
                         duration_s=2.0, listen=None, clock=clock)
    result = MeterDaemon(opts, log=lambda _line: None).run()
    meta = read_trace(tmp_path / "t").segments[0].meta
    assert [c["name"] for c in meta["channels"]] == ["node0", "node1", "node2", "node3"]
    assert meta["sample_period_s"] == pytest.approx(1.0 / result.rate_hz)
    assert meta["board"]["path"] == str(board)


def _epi(args: list[str], monkeypatch: pytest.MonkeyPatch,
         capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    from epi.cli import main

    monkeypatch.setattr(sys, "argv", ["epi", *args])
    try:
        main()
        code = 0
    except SystemExit as exc:
        code = int(exc.code or 0)
    return code, capsys.readouterr().err


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([], "give --board FILE, or --emulate"),
        (["--emulate", "--rate", "500"], "--rate: 500 Hz is more than the bus sustains"),
        (["--emulate", "--fault-injection", "melt:0@1"], "unknown kind 'melt'"),
        (["--emulate", "--fault-injection", "reset:9@1"], "no channel '9'"),
        (["--emulate", "--fault-injection", "absent:0@x"], "expected KIND:CHANNEL@START"),
        (["--emulate", "--listen", "localhost"], "--listen 'localhost': expected HOST:PORT"),
        (["--board", "{missing}"], "board file not found"),
        (["--board", "{bad_mode}"], "spi.mode: 0: the ATM90E26 works in SPI mode 3 only"),
        (["--board", "{board}", "--fault-injection", "reset:0@1"], "add --emulate"),
    ],
)
def test_cli_errors_are_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
    args: list[str], message: str,
) -> None:
    board = Path(__file__).resolve().parents[2] / "hardware" / "epi-meter.toml"
    bad_mode = tmp_path / "bad.toml"
    bad_mode.write_text(board.read_text().replace("mode = 3 ", "mode = 0 "))
    subst = {"{missing}": str(tmp_path / "nope.toml"), "{bad_mode}": str(bad_mode),
             "{board}": str(board)}
    args = [subst.get(a, a) for a in args]
    listen = [] if "--listen" in args else ["--listen", "127.0.0.1:0"]
    code, err = _epi(["meter", "run", "--out", str(tmp_path / "t"), "--duration", "1",
                      *listen, *args], monkeypatch, capsys)
    assert code == 2
    assert err.startswith("epi: error: ") and message in err, err
    assert err.count("\n") == 1 and "Traceback" not in err
    if str(bad_mode) in args:
        assert str(bad_mode) in err


def test_cli_error_for_a_real_board_without_calibration(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:
    board = Path(__file__).resolve().parents[2] / "hardware" / "epi-meter.toml"
    code, err = _epi(["meter", "run", "--board", str(board), "--out", str(tmp_path / "t"),
                      "--listen", "off"], monkeypatch, capsys)
    assert code == 2 and err.startswith(f"epi: error: {board}: channel[0]")
    assert not (tmp_path / "t").exists() or not list((tmp_path / "t").glob("seg-*"))


def test_cli_out_is_a_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                           capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "file"
    target.write_text("")
    code, err = _epi(["meter", "run", "--emulate", "--out", str(target / "t"), "--duration",
                      "1", "--listen", "off"], monkeypatch, capsys)
    assert code == 2 and "--out" in err and "is not a writable directory (not a directory)" in err


@pytest.mark.parametrize("emulate", ["--emulate", "--emulate-bridge"])
@pytest.mark.parametrize(("out", "message"), [
    ("", "--out: is empty"),
    (" ", "--out: is empty"),
    ("/sys/kernel", "--out /sys/kernel: /sys/kernel is not a writable directory"),
    ("/proc/epi-out", "--out /proc/epi-out: /proc is not a writable directory"),
])
def test_cli_out_empty_or_unwritable_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
    emulate: str, out: str, message: str,
) -> None:
    """`--out ''` (an unset shell variable) used to record into the current directory; an
    existing directory nothing can be created in (/sys/kernel) was a crash log."""
    monkeypatch.chdir(tmp_path)
    code, err = _epi(["meter", "run", emulate, "--out", out, "--duration", "1", "--listen",
                      "off"], monkeypatch, capsys)
    assert code == 2, err
    assert err.startswith("epi: error: ") and message in err, err
    assert err.count("\n") == 1 and "Traceback" not in err and "crash" not in err
    assert list(tmp_path.iterdir()) == []  # nothing written where it was run


def test_cli_emulated_run_prints_its_plan(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:
    start = time.monotonic()
    code, err = _epi(["meter", "run", "--emulate", "--out", str(tmp_path), "--duration", "0.5",
                      "--listen", "off"], monkeypatch, capsys)
    assert code == 0, err
    assert "sampling 4 emulated channel(s) at 20 Hz" in err and "stopped:" in err
    assert time.monotonic() - start < 20
    assert read_trace(tmp_path).segments[0].meta["stats"]["clean_stop"] is True


def test_a_failed_start_leaves_no_empty_trace_directory(tmp_path: Path) -> None:
    out = tmp_path / "new-trace"
    with pytest.raises(UserError, match="more than the bus sustains"):
        MeterDaemon(DaemonOptions(out_dir=out, emulate=True, rate_hz=1e6, listen=None,
                                  clock=SimulatedClock())).run()
    assert not out.exists()


def test_frames_per_read_matches_an_emulated_chips_frame_counter() -> None:
    from meter.chip.calibration import Calibration
    from meter.driver.atm90e26 import ATM90E26Driver
    from meter.emulation.chip_emulator import EmulatedChip
    from meter.emulation.emulated_bus import EmulatedSpiBus

    for n_line in (False, True):
        clock = SimulatedClock()
        chip = EmulatedChip(ConstantPower(10.0), clock, n_line=n_line)
        bus = EmulatedSpiBus(chip)
        driver = ATM90E26Driver(bus, Calibration.default(1e8), clock=clock, n_line=n_line,
                                first_measurement_s=0.2)
        driver.start()
        clock.advance(S)
        driver.read_sample()
        before = bus.frames
        clock.advance(S)
        driver.read_sample()
        assert bus.frames - before == frames_per_read(n_line)


def test_a_rate_the_bus_cannot_keep_as_driven_is_lowered_with_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """--rate 40 passed the wire check (49 Hz for 4 chips) and then skipped most sweeps."""
    from meter.emulation.emulated_bus import EmulatedSpiBus

    real = EmulatedSpiBus.transfer

    def slow(self: EmulatedSpiBus, frame: bytes) -> bytes:
        self.chip.clock.advance(100_000)  # 100 µs of wake-up latency per frame
        return real(self, frame)

    monkeypatch.setattr(EmulatedSpiBus, "transfer", slow)
    lines: list[str] = []
    opts = DaemonOptions(out_dir=tmp_path, emulate=True, rate_hz=40.0, duration_s=3.0,
                         listen=None, clock=SimulatedClock(),
                         power_model=ConstantPower(4.0, power_factor=0.8))
    result = MeterDaemon(opts, log=lines.append).run()
    # 4 chips x 34 frames x (150 + 100) µs = 34 ms a sweep: 29.4 sweeps/s
    assert result.rate_hz == 29.0
    (note,) = [ln for ln in lines if "lowered" in ln]
    assert "--rate: 40 Hz lowered to 29 Hz" in note and "sustains 29.4" in note
    meta = read_trace(tmp_path).segments[0].meta
    assert meta["rate_note"] and result.stats.skipped_sweeps == 0


@pytest.mark.parametrize(("args", "words"), [
    (["--emulate", "--emulate-bridge"], "--emulate and --emulate-bridge"),
    (["--emulate-bridge", "--source", "auto"], "--emulate-bridge and --source"),
])
def test_options_that_cannot_apply_together_are_refused(
        args: list[str], words: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    code, err = _epi(["meter", "run", *args, "--out", str(tmp_path / "t"), "--duration", "1"],
                     monkeypatch, capsys)
    assert code == 2 and words in err
    assert not (tmp_path / "t").exists()  # refused before anything is written


def test_an_spi_table_in_a_bridge_board_file_is_refused(tmp_path: Path) -> None:
    from epi.core.errors import UserError
    from meter.board.file import load_board

    board = tmp_path / "b.toml"
    repo = Path(__file__).resolve().parents[2]
    text = (repo / "hardware" / "epi-meter-bridge.toml").read_text()
    board.write_text(text + "\n[spi]\nbus = 0\n")
    load_board(repo / "hardware" / "epi-meter-bridge.toml")  # valid without it
    with pytest.raises(UserError, match="spi: a \\[spi\\] table is for bus"):
        load_board(board)
