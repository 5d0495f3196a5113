"""Chip faults behind the emulated MCU: readiness and plausibility in the firmware.

The real firmware (on CPython) reads register-level emulated chips; the real recorder writes
the trace. Expected figures come from the power models (constant loads: the truth is the
model's power and its exact energy integral), never from the code under test.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from epi.formats.trace import read_trace
from meter.bridge.emulate import EmulatedBoard
from meter.bridge.emulated_port import serve_board
from meter.bridge.link import SerialLink
from meter.bridge.recorder import BridgeRecorder
from meter.chip import registers as regs
from meter.clock import SimulatedClock
from meter.daemon.service import DaemonOptions, MeterDaemon
from meter.daemon.trace import TraceLock, TraceWriter
from meter.emulation.power_models import ConstantPower

NS = 1_000_000_000
T0 = 5 * NS
REFRESH_S = 0.2
_VALUE_REGS = {0x4A, 0x49, 0x48, 0x4D, 0x4C}  # Pmean, Urms, Irms, PowerF, Freq


class StraddlingChip:
    """An emulated chip whose first measurement refresh after every (soft) reset is made to
    fall in the middle of a reading: when a measurement register is read before the refresh,
    the clock is moved past it before the frequency register is read (so a reading that began
    on the reset zeros ends on 50 Hz). `forced` counts them."""

    def __init__(self, chip, clock) -> None:
        self.chip = chip
        self.clock = clock
        self.forced = 0
        self.value_reads_before_refresh = 0  # after the firmware's own (re)start of the chip
        self._started_at: int | None = None  # power-on time of the last SoftReset

    def spi_transfer(self, mosi: bytes) -> bytes:
        address = mosi[0] & 0x7F
        if mosi[0] & 0x80 and address in _VALUE_REGS:
            first = self.chip._t_power_on + self.chip.refresh_ns
            if self.clock.monotonic_ns() < first:
                if self.chip._t_power_on == self._started_at:
                    self.value_reads_before_refresh += 1
                if address == 0x4C:  # Freq: read after the refresh
                    self.clock.sleep_until(first)
                    self.forced += 1
        out = self.chip.spi_transfer(mosi)
        if mosi[0] == regs.SOFT_RESET and (mosi[1] << 8 | mosi[2]) == regs.SOFT_RESET_CODE:
            self._started_at = self.chip._t_power_on
        return out


def test_reads_straddling_the_first_refresh_never_give_a_row(tmp_path: Path) -> None:
    clock = SimulatedClock(T0)
    model = ConstantPower(40.0, power_factor=0.9)
    board = EmulatedBoard(clock, [model], refresh_period_s=REFRESH_S, rate_hz=50.0)
    (cs, chip), = board.chips.items()
    proxy = StraddlingChip(chip, clock)
    board.chips[cs] = proxy  # the MCU's SPI reaches the chip through the proxy
    board.reset_mcu()
    writer = TraceWriter(tmp_path, {"test": True}, lock=TraceLock(tmp_path))
    port = serve_board(board, 921600)  # the firmware behind an emumcu:// port
    rec = BridgeRecorder(SerialLink(port.url, 921600), clock, writer, baud=921600,
                         idle_until=port.idle_until)
    rec.run(1.0)
    # chip resets at many phases of the 20 ms sweep schedule: every re-start is followed by
    # reads that begin on the reset zeros and straddle the first refresh
    for k in range(12):
        chip.schedule_reset(clock.monotonic_ns() + 3_000_000 + k * 1_700_000)
        rec.run(0.6)
    writer.close()
    trace = read_trace(tmp_path)
    rows = list(trace.samples())
    assert len(rows) > 100
    for r in rows:  # never a reset zero, never a half-refreshed reading
        assert r["power_w"] == pytest.approx(40.0, rel=0.01), r
        assert r["voltage_v"] == pytest.approx(230.0, abs=0.5), r
        assert r["frequency_hz"] == pytest.approx(50.0, abs=0.1), r
    resets = [e for e in trace.events() if e["kind"] == "chip_reset"]
    assert len(resets) == 12
    stats = trace.segments[0].meta["bridge"]["stats"] if "bridge" in trace.segments[0].meta \
        else rec.stats.as_dict()
    assert stats["not_ready_readings"] >= 12
    # reads between a reset and its detection were forced to straddle (the reset chip reads
    # zeros: rejected, then the reset is found); after its own re-start the firmware never
    # reads a measurement register before the first refresh (readiness from its start time)
    assert proxy.forced >= 12
    assert proxy.value_reads_before_refresh == 0


def test_a_straddled_read_is_what_the_old_value_check_let_through() -> None:
    """The proxy does produce the straddle when a reading starts on the reset zeros: 0 W and
    0 V with 50 Hz (what the removed value-based readiness check took for a reading)."""
    from meter.emulation import machine_stub
    from meter.firmware.chip import Chip, decode_raw
    from meter.firmware.config import channel_calibration

    clock = SimulatedClock(T0)
    board = EmulatedBoard(clock, [ConstantPower(40.0)], refresh_period_s=REFRESH_S)
    (cs, chip), = board.chips.items()
    proxy = StraddlingChip(chip, clock)
    pins: dict = {}
    spi = machine_stub.SPI(0, baudrate=160000, polarity=1, phase=1, pins=pins,
                           chips={cs: proxy})
    pin = machine_stub.Pin(cs, machine_stub.Pin.OUT, value=1)
    pins[cs] = pin
    cal, _ = channel_calibration({"meter_constant_imp_per_kwh": 1e8})
    c = Chip(spi, pin, cal, first_measurement_us=0)  # readiness switched off
    c.start()
    p, u, _, _, f = decode_raw(c._read_raw())
    assert proxy.forced == 1 and p == 0.0 and u == 0.0 and f == pytest.approx(50.0)


def _soak(tmp_path: Path, seconds: float) -> tuple:
    board = tmp_path / "bridge.toml"
    board.write_text('format = "epi-board"\nformat_version = 1\nbus = "bridge"\n[bridge]\n'
                     'port = "(emulated)"\nbaud = 921600\nrate_hz = 20\nencoding = "json"\n'
                     '[[channel]]\nname = "c0"\n[[channel]]\nname = "c1"\n')
    models = [ConstantPower(4.0, power_factor=0.8), ConstantPower(60.0, power_factor=0.95)]
    faults = tuple(f"{kind}:{ch}@0" for ch in (0, 1) for kind in ("bit-errors",
                                                                  "partial-frames"))
    opts = DaemonOptions(out_dir=tmp_path / "trace", board_path=board, emulate_bridge=True,
                         duration_s=seconds, listen=None, clock=SimulatedClock(T0),
                         power_model=models, faults=faults)
    MeterDaemon(opts, log=lambda line: None).run()
    return read_trace(tmp_path / "trace"), models


@pytest.mark.long
def test_bit_errors_and_partial_frames_give_no_wrong_row_and_exact_energy(
        tmp_path: Path) -> None:
    """The emulator's default bit-error (0.001 per bit, MISO and MOSI) and partial-frame (1 %)
    rates on both chips for 1200 sweeps: every row is right, every rejection is an event, and
    the energy is within 0.2 % of the models' exact integral."""
    trace, models = _soak(tmp_path, 60.0)
    meta = trace.segments[0].meta
    assert meta["bridge"]["stats"]["sweeps"] >= 1150
    assert {f["kind"] for f in meta["fault_injection"]} == {"bit-errors", "partial-frames"}
    events = list(trace.events())
    # the checks were exercised (recovered words are misreads, the rest implausible)
    assert sum(e["kind"] in ("implausible", "misread") for e in events) >= 20
    for ch, model in enumerate(models):
        rows = [r for r in trace.samples() if r["channel"] == ch]
        assert len(rows) >= 1100
        p_true = model.power_w(T0)
        wrong = [r for r in rows if abs(r["power_w"] - p_true) > 0.01 * p_true + 0.05
                 or abs(r["voltage_v"] - 230.0) > 0.5 or abs(r["frequency_hz"] - 50.0) > 0.1]
        assert wrong == []
        a, b = rows[0], rows[-1]
        measured = b["energy_j"] - a["energy_j"]
        truth = model.energy_j(a["t_mono_ns"], b["t_mono_ns"])
        assert measured == pytest.approx(truth, rel=0.002), (ch, measured, truth)


def test_chip_fault_specs_reach_the_emulated_chips_behind_the_mcu() -> None:
    from epi.core.errors import UserError
    from meter.bridge.faults import parse_bridge_faults

    uart, chip = parse_bridge_faults(["bit-errors:1@2+3=0.002,mcu-reset@4", "reset:0@1"])
    assert [f.kind for f in uart] == ["mcu-reset"]
    assert [(f.kind, f.channel, f.start_s, f.value) for f in chip] == [
        ("bit-errors", "1", 2.0, 0.002), ("reset", "0", 1.0, None)]
    with pytest.raises(UserError, match="unknown kind"):
        parse_bridge_faults(["melt:0@1"])
