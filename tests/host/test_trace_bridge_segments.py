"""The analysis reads a bridge trace whose middle segment refused the MCU's hello (no meter
constant, no rows): the good segments before and after it are analysed, not the whole
directory refused (the trace format's own reader already takes it)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from epi.core.errors import UserError
from host.analysis.traces import read_trace
from meter.clock import SimulatedClock
from meter.daemon.service import DaemonOptions, MeterDaemon
from meter.firmware.crc import unseal
from meter.firmware.telemetry import message


def _daemon(out: Path, seconds: float) -> None:
    opts = DaemonOptions(out_dir=out, emulate_bridge=True, n_emulated_channels=2,
                         duration_s=seconds, listen=None, clock=SimulatedClock(5 * 10**9))
    MeterDaemon(opts, log=lambda line: None).run()


def test_a_refused_hello_segment_leaves_the_good_ones_analysable(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from meter.firmware.app import Firmware

    out = tmp_path / "trace"
    _daemon(out, 2.0)
    honest = Firmware.hello_message

    def bad_hello(self: Firmware) -> object:
        fields = json.loads(unseal(bytes(honest(self))))
        for c in fields["channels"]:
            c["meter_constant_imp_per_kwh"] = 0
        fields.pop("k")
        return message("hello", fields)

    with monkeypatch.context() as m:
        m.setattr(Firmware, "hello_message", bad_hello)
        with pytest.raises(UserError):
            _daemon(out, 2.0)
    _daemon(out, 2.0)
    trace = read_trace(out, cache=False)
    assert [s.number for s in trace.segments] == [1, 2, 3]
    assert not trace.segments[1].ends  # the refused segment holds no rows
    assert {1, 3} <= {s.number for s in trace.segments if s.ends}
