"""The chip's UART mode: framing, checksums, timeouts, 2400/9600 baud — over a pyserial URL
handler on a simulated clock, and over a real pseudo-terminal pair."""

from __future__ import annotations

import serial

from meter.bus.uart_bus import UartBus
from meter.chip import registers as regs
from meter.chip.calibration import Calibration
from meter.clock import SimulatedClock, SystemClock
from meter.driver.atm90e26 import ATM90E26Driver
from meter.emulation import uart_emulator as emulator_uart
from meter.emulation.chip_emulator import EmulatedChip
from meter.emulation.power_models import ConstantPower
from meter.emulation.uart_emulator import ChipUart, PtyChipServer, register_port
from meter.errors import BusError, BusTimeout

MS = 1_000_000


def _setup(name: str, baud: int = 9600) -> tuple[SimulatedClock, EmulatedChip, ChipUart, UartBus]:
    clock = SimulatedClock()
    chip = EmulatedChip(ConstantPower(6.0), clock)
    cu = ChipUart(chip)
    url = register_port(name, cu)
    return clock, chip, cu, UartBus(url, baudrate=baud, clock=clock)


def test_read_and_write_transactions_and_their_timing() -> None:
    clock, chip, cu, bus = _setup("uart-basic")
    t0 = clock.monotonic_ns()
    assert bus.read_register(regs.reg("MMode").address) == 0x9422
    # 3 request bytes + 1 ms reply delay + 3 reply bytes, 10 bits each at 9600 baud
    assert clock.monotonic_ns() - t0 == 6 * 1_041_666 + 1 * MS
    bus.write_register(regs.FUNC_EN, 0x0030)
    assert chip.peek(regs.FUNC_EN) == 0x0030 and chip.last_data == 0x0030
    assert cu.stats["transactions"] == 2 and cu.stats["failures"] == 0
    bus.close()


def test_2400_baud_works_and_other_bauds_get_no_answer() -> None:
    _clock, _chip, _cu, bus = _setup("uart-2400", baud=2400)
    assert bus.read_register(regs.CAL_START) == regs.POWER_ON_CODE
    bus.close()
    port = serial.serial_for_url("emuchip://uart-2400", baudrate=4800, timeout=0.05)
    port.write(bytes.fromhex("FEA0A0"))
    assert port.read(3) == b""  # the chip cannot lock onto 4800 baud
    port.close()


def test_bad_checksum_is_silent_and_the_line_is_left_quiet_for_20_ms() -> None:
    clock, chip, cu, bus = _setup("uart-chk")
    port = bus._port
    port.write(bytes.fromhex("FE0200307F"))  # FuncEn <- 0x0030 with a wrong checksum
    assert port.read(1) == b""
    assert chip.peek(regs.FUNC_EN) == 0x000C  # not written
    # the bus itself: a timeout, then it waits >= 20 ms before the next transaction
    cu.set_noise(1.0)  # every bit flipped: nothing valid reaches the chip
    try:
        bus.read_register(regs.FUNC_EN)
        raise AssertionError("expected a timeout")
    except BusTimeout:
        pass
    cu.set_noise(0.0)
    t_fail = clock.monotonic_ns()
    assert bus.read_register(regs.FUNC_EN) == 0x000C
    assert clock.monotonic_ns() - t_fail >= 20 * MS
    bus.close()


def test_a_gap_of_more_than_20_ms_between_host_bytes_aborts_the_transaction() -> None:
    clock = SimulatedClock()
    chip = EmulatedChip(ConstantPower(6.0), clock)
    cu = ChipUart(chip)
    t = clock.monotonic_ns()
    assert cu.receive(bytes([0xFE, 0xA0]), t, 9600) == []
    assert cu.receive(bytes([0xA0]), t + 30 * MS, 9600) == []  # too late: aborted
    reply = cu.receive(bytes.fromhex("FEA0A0"), t + 60 * MS, 9600)  # after 20 ms quiet
    assert bytes(b for _, b in reply) == emulator_uart.uart_read_reply(regs.POWER_ON_CODE)
    # the reply starts within 5 ms of the last request byte (1 ms here)
    assert reply[0][0] - (t + 60 * MS + 3 * emulator_uart.byte_time_ns(9600)) < 5 * MS


def test_write_echo_mismatch_is_a_bus_error() -> None:
    _clock, _chip, cu, bus = _setup("uart-echo")
    cu.set_noise(0.02, seed=11)
    errors = 0
    for _ in range(200):
        try:
            bus.write_register(regs.SAG_TH, 0x1D6A)
        except BusError:
            errors += 1
    assert 0 < errors < 200
    assert bus.stats["timeouts"] + bus.stats["checksum_errors"] == errors
    bus.close()


def test_driver_over_a_real_pty_serial_port() -> None:
    clock = SystemClock()
    chip = EmulatedChip(ConstantPower(6.0), clock, refresh_period_s=0.05)
    with PtyChipServer(ChipUart(chip)) as server:
        bus = UartBus(server.port, baudrate=9600, clock=clock)
        driver = ATM90E26Driver(bus, Calibration.default(1e6), clock=clock,
                                    first_measurement_s=0.05)
        driver.start()
        clock.sleep(0.12)
        sample = driver.read_sample()
        assert sample.power_w is not None and abs(sample.power_w - 6.0) < 0.01
        assert sample.voltage_v is not None and abs(sample.voltage_v - 230.0) < 0.01
        assert sample.status == 0
        driver.close()
        # 2400 baud works on the real tty too; 4800 (not a chip baud) gets no answer
        slow = UartBus(server.port, baudrate=2400, clock=clock)
        assert slow.read_register(regs.FUNC_EN) == 0x0030
        slow.close()
        wrong = serial.Serial(server.port, baudrate=4800, timeout=0.1)
        wrong.write(bytes.fromhex("FE8282"))
        assert wrong.read(3) == b""
        wrong.close()
