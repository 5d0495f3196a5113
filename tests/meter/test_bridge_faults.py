"""Faults at the UART layer between the emulated MCU and the bridge recorder.

The real firmware (on CPython) and the real recorder, on a SimulatedClock, with faults
injected into the byte stream (meter.bridge.faults): dropped bytes, flipped bits, lost
lines, the serial port unplugged and back, an MCU reset in mid-stream. Each must appear in the
trace as an event or a gap; the recorder must keep recording to the end; and the energy over
the gap must be exact from the cumulative counts (compared with the scripted power's exact
energy, independent of the code under test).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from epi.formats.trace import read_trace
from meter.clock import SimulatedClock
from meter.daemon.service import DaemonOptions, MeterDaemon
from meter.emulation.power_models import ScriptedProfile

NS = 1_000_000_000
T0 = 5 * NS
J_PER_COUNT = 3.6e6 / 1e8 * 0.1  # 0.1 pulse per count at 1e8 imp/kWh: 3.6 mJ


def _profile() -> ScriptedProfile:
    return ScriptedProfile([(0, 5.0), (3.3, 9.0), (3.9, 4.0), (5.1, 7.5), (7.0, 6.0)],
                           start_mono_ns=T0)


def _run(tmp_path: Path, faults: tuple[str, ...], seconds: float = 10.0,
         encoding: str = "json") -> tuple:
    board = tmp_path / "bridge.toml"
    board.write_text('format = "epi-board"\nformat_version = 1\nbus = "bridge"\n[bridge]\n'
                     f'port = "(emulated)"\nbaud = 115200\nrate_hz = 10\nencoding = "{encoding}"\n'
                     '[[channel]]\nname = "c0"\n')
    model = _profile()
    opts = DaemonOptions(out_dir=tmp_path / "trace", board_path=board, emulate_bridge=True,
                         duration_s=seconds, listen=None, clock=SimulatedClock(T0),
                         power_model=[model], faults=faults)
    MeterDaemon(opts, log=lambda line: None).run()
    trace = read_trace(tmp_path / "trace")
    return trace, model


def _energy_across(trace, model, gap_event: dict) -> None:
    """Energy between the samples either side of a gap equals the model's, to a count."""
    start = gap_event["t_mono_ns"]
    end = int(gap_event["detail"].split()[0].split("=")[1])
    rows = [r for r in trace.samples() if r["channel"] == 0]
    before = max((r for r in rows if r["t_mono_ns"] <= start), key=lambda r: r["t_mono_ns"])
    after = min((r for r in rows if r["t_mono_ns"] >= end), key=lambda r: r["t_mono_ns"])
    assert after["t_mono_ns"] - before["t_mono_ns"] > 0.3 * NS  # a real gap
    measured = after["energy_j"] - before["energy_j"]
    truth = model.energy_j(before["t_mono_ns"], after["t_mono_ns"])
    # one count at each end, and the clock mapping's uncertainty at ≤ 10 W
    assert abs(measured - truth) <= 2 * J_PER_COUNT + 10.0 * 0.001, (measured, truth)


def _kinds(trace) -> list[tuple[str, str]]:
    return [(e["kind"], e["detail"]) for e in trace.events()]


def _ran_to_the_end(trace, seconds: float) -> None:
    rows = [r for r in trace.samples() if r["channel"] == 0]
    assert rows[-1]["t_mono_ns"] > T0 + (seconds - 0.6) * NS
    kinds = [k for k, _ in _kinds(trace)]
    assert kinds[-1] == "stop"
    energies = [r["energy_j"] for r in rows]
    assert energies == sorted(energies)  # monotonic, whatever happened


@pytest.mark.parametrize("encoding", ["json", "compact"])
def test_lost_lines_are_a_gap_and_the_energy_over_it_is_exact(tmp_path: Path,
                                                              encoding: str) -> None:
    trace, model = _run(tmp_path, ("lose-lines@3+1.5",), encoding=encoding)
    gaps = [e for e in trace.events() if e["kind"] == "gap" and "lost (seq" in e["detail"]]
    assert len(gaps) == 1, _kinds(trace)
    assert "energy continuous" in gaps[0]["detail"]
    _energy_across(trace, model, gaps[0])
    _ran_to_the_end(trace, 10.0)
    meta = trace.segments[0].meta
    assert meta["bridge"]["stats"]["lost_lines"] >= 13


@pytest.mark.parametrize("fault", ["drop-bytes@3+1", "flip-bits@3+1"])
def test_corrupted_bytes_are_crc_events_and_gaps(tmp_path: Path, fault: str) -> None:
    trace, model = _run(tmp_path, (fault,))
    crc = [d for k, d in _kinds(trace) if k == "bus_error" and ("CRC" in d or "unparsable" in d)]
    assert crc, _kinds(trace)
    gaps = [e for e in trace.events() if e["kind"] == "gap" and "lost (seq" in e["detail"]]
    assert gaps
    for g in gaps:
        _energy_across_if_wide(trace, model, g)
    stats = trace.segments[0].meta["bridge"]["stats"]
    assert stats["bad_crc"] + stats["unparsable"] >= 5
    _ran_to_the_end(trace, 10.0)


def _energy_across_if_wide(trace, model, gap_event: dict) -> None:
    start = gap_event["t_mono_ns"]
    end = int(gap_event["detail"].split()[0].split("=")[1])
    rows = [r for r in trace.samples() if r["channel"] == 0]
    before = max((r for r in rows if r["t_mono_ns"] <= start), key=lambda r: r["t_mono_ns"])
    after = min((r for r in rows if r["t_mono_ns"] >= end), key=lambda r: r["t_mono_ns"])
    measured = after["energy_j"] - before["energy_j"]
    truth = model.energy_j(before["t_mono_ns"], after["t_mono_ns"])
    assert abs(measured - truth) <= 2 * J_PER_COUNT + 10.0 * 0.001, (measured, truth)


def test_unplugged_port_is_a_reconnect_with_the_gap_recorded(tmp_path: Path) -> None:
    trace, model = _run(tmp_path, ("unplug@3+2",))
    gaps = [e for e in trace.events() if e["kind"] == "gap" and "serial link lost" in e["detail"]]
    assert len(gaps) == 1, _kinds(trace)
    _energy_across(trace, model, gaps[0])
    stats = trace.segments[0].meta["bridge"]["stats"]
    assert stats["reconnects"] == 1 and stats["lost_lines"] >= 15
    _ran_to_the_end(trace, 10.0)


def test_mcu_reset_is_a_gap_and_a_new_clock_mapping(tmp_path: Path) -> None:
    trace, model = _run(tmp_path, ("mcu-reset@4",), seconds=12.0)
    gaps = [e for e in trace.events() if e["kind"] == "gap" and "MCU reset" in e["detail"]]
    assert len(gaps) == 1, _kinds(trace)
    bridge = trace.segments[0].meta["bridge"]
    assert bridge["stats"]["mcu_resets"] == 1
    boots = {h["boot"] for h in bridge["clock_history"]}
    assert len(boots) == 2 and bridge["boot"] in boots
    assert any(h.get("ended") == "MCU reset" for h in bridge["clock_history"])
    # the energy the MCU metered after its reset continues the trace's counter, and is right
    rows = [r for r in trace.samples() if r["channel"] == 0]
    end = int(gaps[0]["detail"].split()[0].split("=")[1])
    after = [r for r in rows if r["t_mono_ns"] > end]
    a, b = after[0], after[-1]
    assert abs((b["energy_j"] - a["energy_j"]) - model.energy_j(a["t_mono_ns"], b["t_mono_ns"])) \
        <= 2 * J_PER_COUNT + 10.0 * 0.001
    _ran_to_the_end(trace, 12.0)


def test_unknown_fault_kind_is_a_user_error(tmp_path: Path) -> None:
    from epi.core.errors import UserError

    with pytest.raises(UserError, match="KIND@START"):
        _run(tmp_path, ("melt@3+1",))


def test_chip_faults_behind_the_mcu_are_trace_events_never_zero_rows(tmp_path: Path) -> None:
    """A chip reset, a corrupted calibration register (CS1 error) and an absent chip on the
    emulated board: the firmware reports each, the trace has the events and gaps, no 0 W row."""
    from meter.bridge.emulate import EmulatedBoard
    from meter.bridge.emulated_port import serve_board
    from meter.bridge.link import SerialLink
    from meter.bridge.recorder import BridgeRecorder
    from meter.daemon.trace import TraceLock, TraceWriter

    clock = SimulatedClock(T0)
    board = EmulatedBoard(clock, [ScriptedProfile([(0, 5.0)], start_mono_ns=T0),
                                  ScriptedProfile([(0, 7.0)], start_mono_ns=T0)])
    chip0, chip1 = board.chips.values()
    writer = TraceWriter(tmp_path, {"test": True}, lock=TraceLock(tmp_path))
    port = serve_board(board, 115200)  # the firmware behind an emumcu:// port
    rec = BridgeRecorder(SerialLink(port.url, 115200), clock, writer, baud=115200,
                         idle_until=port.idle_until)
    chip0.schedule_reset(T0 + 3 * NS)
    rec.run(4.5)
    chip1.corrupt_register("Lgain")
    rec.run(1.5)
    chip1.set_absent(True)
    rec.run(2.0)
    chip1.set_absent(False)
    rec.run(3.0)
    writer.close()
    trace = read_trace(tmp_path)
    events = [(e["channel"], e["kind"]) for e in trace.events()]
    assert (0, "chip_reset") in events
    assert (1, "checksum_error") in events
    assert (1, "absent") in events
    assert (0, "gap") in events and (1, "gap") in events
    rows = list(trace.samples())
    assert rows and all(r["power_w"] and r["voltage_v"] for r in rows)  # never a 0 reading
    # channel 1 delivered again after the chip came back
    last1 = max(r["t_mono_ns"] for r in rows if r["channel"] == 1)
    assert last1 > clock.monotonic_ns() - 2 * NS
