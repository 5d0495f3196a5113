"""The firmware's hello is untrusted input: a hello whose channel numbers or meter constants are
not what the protocol (and the trace reader) allow stops the recorder with one line naming the
field and a `bus_error` event; it never crashes it, never sets how counts become joules, and
never leaves a segment meta.json the trace reader refuses."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from epi.core.errors import UserError
from epi.formats.trace import read_trace, segment_paths
from meter.bridge.recorder import BridgeRecorder
from meter.clock import SimulatedClock
from meter.daemon.service import DaemonOptions, MeterDaemon
from meter.daemon.trace import TraceWriter
from meter.firmware.crc import unseal
from meter.firmware.telemetry import message


class OneShotLink:
    """A link that delivers `data` on its first read, then nothing (time passes)."""

    def __init__(self, clock: SimulatedClock, data: bytes) -> None:
        self.clock = clock
        self.data = data

    def open(self) -> None:
        return None

    def read(self, timeout_s: float) -> bytes:
        data, self.data = self.data, b""
        if not data:
            self.clock.advance(round(timeout_s * 1e9))
        return data

    def write(self, data: bytes) -> None:
        return None

    def close(self) -> None:
        return None

    def describe(self) -> dict[str, object]:
        return {"kind": "test"}


def _hello(channels: object) -> bytes:
    return bytes(message("hello", {"boot": "b1", "fw": "1.0.0", "proto": 2, "rate_hz": 10,
                                   "enc": "json", "channels": channels}))


def _events(trace_dir: Path) -> list[dict[str, str]]:
    import csv

    with segment_paths(trace_dir, 1)[2].open(newline="") as f:
        return list(csv.DictReader(f))


GOOD = {"n": 0, "meter_constant_imp_per_kwh": 1e8, "cal": "flash"}


BAD_HELLOS = [
    ([{**GOOD, "meter_constant_imp_per_kwh": -1e8}], "meter_constant_imp_per_kwh -100000000.0"),
    ([{**GOOD, "meter_constant_imp_per_kwh": 0}], "meter_constant_imp_per_kwh 0 is not"),
    ([{**GOOD, "meter_constant_imp_per_kwh": math.nan}], "meter_constant_imp_per_kwh nan"),
    ([{**GOOD, "meter_constant_imp_per_kwh": "1e8"}], "meter_constant_imp_per_kwh '1e8'"),
    ([{"n": 0, "cal": "flash"}], "meter_constant_imp_per_kwh None"),
    # beyond what the trace reader accepts (epi.formats.trace.MAX_METER_CONSTANT = 1e9)
    ([{**GOOD, "meter_constant_imp_per_kwh": 1e12}], "meter_constant_imp_per_kwh 1000000000000"),
    ([{"meter_constant_imp_per_kwh": 1e8}], "channels[0].n None is not a channel"),
    ([{**GOOD, "n": "0"}], "channels[0].n '0' is not a channel"),
    ([GOOD, GOOD], "channel 0 given twice"),
    ("all", "channels 'all' is not a list"),
    ([], "channels [] is not a list"),
    ([7], "channels[0] is not an object"),
]


@pytest.mark.parametrize(("channels", "why"), BAD_HELLOS)
def test_a_bad_hello_stops_the_recorder_with_one_line(tmp_path: Path, channels: object,
                                                      why: str) -> None:
    clock = SimulatedClock()
    writer = TraceWriter(tmp_path, {"channels": [{"channel": 0, "name": "ch0"}]})
    rec = BridgeRecorder(OneShotLink(clock, _hello(channels)), clock, writer, baud=115200)
    with pytest.raises(UserError) as exc:
        rec.run(duration_s=0.3)
    writer.close()
    message = str(exc.value)
    assert "\n" not in message and "hello is refused" in message and why in message
    assert rec.hello is None and all(ch.jpc is None for ch in rec.channels.values())
    errors = [row["detail"] for row in _events(tmp_path) if row["kind"] == "bus_error"]
    assert len(errors) == 1 and "hello refused" in errors[0] and why in errors[0]


def test_a_hello_without_a_channel_the_board_records_stops_the_recorder(tmp_path: Path) -> None:
    clock = SimulatedClock()
    writer = TraceWriter(tmp_path, {"channels": [{"channel": 0, "name": "ch0"},
                                                 {"channel": 2, "name": "ch2"}]})
    rec = BridgeRecorder(OneShotLink(clock, _hello([GOOD])), clock, writer, baud=115200,
                         channels=[0, 2])
    with pytest.raises(UserError, match=r"without the board's channel\(s\) \[2\]"):
        rec.run(duration_s=0.3)
    writer.close()


def _bad_firmware_hello(monkeypatch: pytest.MonkeyPatch, constant: object) -> None:
    """The emulated firmware announces `constant` as every channel's meter constant."""
    from meter.firmware.app import Firmware

    honest = Firmware.hello_message

    def hello_message(self: Firmware) -> object:
        line = bytes(honest(self))
        fields = json.loads(unseal(line))
        for c in fields["channels"]:
            c["meter_constant_imp_per_kwh"] = constant
        fields.pop("k")
        return message("hello", fields)

    monkeypatch.setattr(Firmware, "hello_message", hello_message)


def _daemon(out: Path, seconds: float) -> None:
    opts = DaemonOptions(out_dir=out, emulate_bridge=True, n_emulated_channels=2,
                         duration_s=seconds, listen=None, clock=SimulatedClock(5 * 10**9))
    MeterDaemon(opts, log=lambda line: None).run()


@pytest.mark.parametrize("constant", [0, -1e8, "1e8", None])
def test_a_daemon_refusing_a_hello_leaves_a_trace_its_reader_reads(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, constant: object) -> None:
    out = tmp_path / "trace"
    _daemon(out, 2.0)  # a good segment first
    with monkeypatch.context() as m:
        _bad_firmware_hello(m, constant)
        with pytest.raises(UserError, match="meter_constant_imp_per_kwh"):
            _daemon(out, 2.0)
    _daemon(out, 2.0)  # a restart is not blocked
    trace = read_trace(out)  # the reader takes the whole directory, the refused segment too
    assert [s.number for s in trace.segments] == [1, 2, 3]
    assert trace.segments[1].channels[0].meter_constant_imp_per_kwh is None
    assert trace.segments[0].channels[0].meter_constant_imp_per_kwh == 1e8
    assert any(r["channel"] == 0 for r in trace.samples())


def test_a_daemon_stopped_before_the_hello_leaves_a_trace_its_reader_reads(
        tmp_path: Path) -> None:
    """The serial port absent for the whole run: the segment never gets a hello (as when the
    daemon is killed before it comes); its meta is still one the reader takes."""
    out = tmp_path / "trace"
    opts = DaemonOptions(out_dir=out, emulate_bridge=True, n_emulated_channels=2,
                         duration_s=1.0, listen=None, clock=SimulatedClock(5 * 10**9),
                         faults=("unplug@0+5",))
    MeterDaemon(opts, log=lambda line: None).run()
    meta = json.loads(segment_paths(out, 1)[0].read_text())
    assert meta["bridge"]["firmware"] is None  # no hello came
    assert read_trace(out).segments[0].channels[0].meter_constant_imp_per_kwh is None


def test_epi_meter_run_refusing_a_hello_is_one_line_and_exit_2(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    import sys

    from epi.cli import main

    _bad_firmware_hello(monkeypatch, -5)
    out = tmp_path / "t"
    monkeypatch.setattr(sys, "argv", ["epi", "meter", "run", "--emulate-bridge", "--out",
                                      str(out), "--duration", "20", "--listen", "off"])
    with pytest.raises(SystemExit) as exc:
        main()
    err = capsys.readouterr().err.splitlines()
    assert exc.value.code == 2
    problems = [line for line in err if line.startswith("epi: error: ")]
    assert len(problems) == 1 and "meter_constant_imp_per_kwh -5 is not" in problems[0]
    assert not any("Traceback" in line or "crash" in line for line in err)
    read_trace(out)


def test_a_good_hello_sets_the_joules_per_count(tmp_path: Path) -> None:
    clock = SimulatedClock()
    writer = TraceWriter(tmp_path, {"channels": [{"channel": 0, "name": "ch0"}]})
    rec = BridgeRecorder(OneShotLink(clock, _hello([GOOD])), clock, writer, baud=115200)
    rec.run(duration_s=0.3)
    writer.close()
    assert rec.hello is not None and rec.boot == "b1"
    # 1e8 imp/kWh, a count being 0.1 pulse (datasheet): 0.1 × 3.6e6 J / 1e8 = 3.6 mJ
    assert rec.channels[0].jpc == pytest.approx(0.0036)
