"""The driver over every bus implementation against the emulator, including every fault.

Buses: the emulator directly; spidev with kernel chip-select and spidev with gpiozero
chip-select lines (mock pins) — both through the spidev stand-in wired to emulated chips —
and the chip's UART mode through a pyserial URL. Faults: bus bit errors / UART noise (with
partial frames on SPI), a chip reset mid-run, checksum corruption, a stuck chip, an absent
chip. Energy must stay within one register LSB of the power model's integral wherever no
interval was reported as unmetered.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from gpiozero.pins.mock import MockFactory

from meter.bus.base import Bus
from meter.bus.gpio_cs_bus import GpioCsSpiBus
from meter.bus.spidev_bus import SpidevBus
from meter.bus.uart_bus import UartBus
from meter.chip.calibration import Calibration
from meter.clock import SimulatedClock
from meter.driver.atm90e26 import ATM90E26Driver, Reading
from meter.emulation import uart_emulator as emulator_uart
from meter.emulation.chip_emulator import EmulatedChip
from meter.emulation.emulated_bus import FRAME_TIME_160K_S, EmulatedSpiBus, EmulatedSpidev
from meter.emulation.power_models import ScriptedProfile
from meter.errors import BusError, ChecksumError, ChipAbsentError, ChipResetError, ChipStuckError

S = 1_000_000_000
BUSES = ["emulated", "spidev", "gpio-cs", "uart"]


class Rig:
    """One emulated chip behind one bus kind, a driver on top, events collected."""

    def __init__(self, kind: str, seed: int = 1) -> None:
        self.kind = kind
        self.clock = SimulatedClock()
        t0 = self.clock.monotonic_ns()
        self.model = ScriptedProfile(
            [(0, 6.0), (20.5, 9.3), (41.25, 3.1), (90, 7.7)], start_mono_ns=t0,
            power_factor=0.7,
        )
        self.chip = EmulatedChip(self.model, self.clock, seed=seed)
        self.bystander = EmulatedChip(self.model, self.clock, seed=seed + 1)
        self.chip_uart: emulator_uart.ChipUart | None = None
        self.factory: MockFactory | None = None
        self.bus: Bus
        if kind == "emulated":
            self.bus = EmulatedSpiBus(self.chip, frame_time_s=FRAME_TIME_160K_S)
        elif kind == "spidev":
            fake = EmulatedSpidev(kernel_cs={(0, 0): self.chip, (0, 1): self.bystander})
            self.bus = SpidevBus(0, 0, spidev_module=fake)
        elif kind == "gpio-cs":
            self.factory = MockFactory()
            f = self.factory
            fake = EmulatedSpidev(gpio_cs=[
                (lambda: not f.pin(25).state, self.chip),
                (lambda: not f.pin(24).state, self.bystander),
            ])
            self.bus = GpioCsSpiBus(25, spidev_module=fake, pin_factory=f)
            self.other_cs = GpioCsSpiBus(24, spidev_module=fake, pin_factory=f)  # idle line
        elif kind == "uart":
            self.chip_uart = emulator_uart.ChipUart(self.chip, seed=seed)
            url = emulator_uart.register_port(f"rig-{id(self)}", self.chip_uart)
            self.bus = UartBus(url, baudrate=9600, clock=self.clock)
        self.events: list[tuple[str, str]] = []
        self.driver = ATM90E26Driver(
            self.bus, Calibration.default(1e6), clock=self.clock, first_measurement_s=0.2,
            on_event=lambda k, d: self.events.append((k, d)),
        )

    def noise(self, rate: float) -> None:
        if self.chip_uart is not None:
            self.chip_uart.set_noise(rate, seed=5)
        else:
            self.chip.set_spi_faults(bit_error_rate=rate, partial_frame_rate=rate * 10, seed=5)

    def run(self, n: int, period_s: float = 1.0) -> tuple[list[Reading], list[BusError]]:
        samples: list[Reading] = []
        errors: list[BusError] = []
        for _ in range(n):
            self.clock.advance(int(period_s * S))
            try:
                samples.append(self.driver.read_sample())
            except BusError as exc:
                errors.append(exc)
        return samples, errors

    def energy_error_lsb(self, unmetered_j: float = 0.0) -> float:
        d = self.driver
        assert d.energy_epoch_mono_ns is not None and d.energy_t_mono_ns is not None
        truth = self.model.energy_j(d.energy_epoch_mono_ns, d.energy_t_mono_ns)
        return (d.energy_j - (truth - unmetered_j)) / d.calibration.joules_per_count()

    def unmetered_truth_j(self) -> float:
        return sum(self.model.energy_j(u["t0_mono_ns"], u["t1_mono_ns"])
                   for u in self.driver.unmetered)

    def close(self) -> None:
        self.driver.close()
        if self.kind == "gpio-cs":
            self.other_cs.close()


@pytest.fixture(params=BUSES)
def rig(request: pytest.FixtureRequest) -> Iterator[Rig]:
    r = Rig(request.param)
    r.driver.start()
    yield r
    r.close()
    if r.kind in ("spidev", "gpio-cs"):
        assert r.bystander.stats["frames"] == 0  # no frame ever reached the other chip


def test_clean_run_reads_the_model_and_meters_exactly(rig: Rig) -> None:
    r0 = rig.chip.pending_counts()
    samples, errors = rig.run(120)
    assert errors == [] and rig.events == []
    s = samples[-1]
    assert s.power_w == pytest.approx(7.7, abs=0.01)
    assert s.voltage_v == pytest.approx(230.0, abs=0.01)
    assert s.current_a == pytest.approx(7.7 / (230 * 0.7), abs=1e-4)
    assert s.power_factor == pytest.approx(0.7, abs=0.002)
    assert s.frequency_hz == pytest.approx(50.0)
    assert s.status == 0
    assert abs(rig.energy_error_lsb()) < 1.0
    # the remainders the chip holds below one LSB close the books exactly
    lsb = rig.driver.calibration.joules_per_count()
    now = rig.clock.monotonic_ns()
    assert rig.driver.energy_epoch_mono_ns is not None
    truth = rig.model.energy_j(rig.driver.energy_epoch_mono_ns, now)
    booked = rig.driver.energy_j + (rig.chip.pending_counts() - r0) * lsb
    assert booked == pytest.approx(truth, abs=0.1 if rig.kind == "uart" else 0.01)
    energies = [x.energy_j for x in samples]
    assert energies == sorted(energies)


def test_bit_errors_lose_no_energy(rig: Rig) -> None:
    rig.noise(2e-3)
    samples, errors = rig.run(300)
    stats = rig.driver.stats
    assert stats["read_retries"] > 20  # the noise really disturbed reads
    assert stats["lastdata_recoveries"] + stats["read_retries"] > 0
    assert len(errors) <= 3 and all(not isinstance(e, ChipResetError) for e in errors)
    assert len(samples) >= 297
    # every disturbed energy read was recovered from LastData: nothing lost
    assert abs(rig.energy_error_lsb()) < 1.0
    # no corrupted word got past LastData verification: constant quantities read exactly
    assert all(s.voltage_v == pytest.approx(230.0, abs=0.01) for s in samples)
    assert all(s.power_factor == pytest.approx(0.7, abs=0.002) for s in samples)
    assert all(s.power_w is not None and 3.0 < s.power_w < 9.4 for s in samples)


def test_chip_reset_mid_run_is_detected_recovered_and_reported(rig: Rig) -> None:
    rig.run(10)
    rig.chip.schedule_reset(rig.clock.monotonic_ns() + 2_500_000_000)
    samples, errors = rig.run(20)
    assert len(errors) == 1 and isinstance(errors[0], ChipResetError) and errors[0].recovered
    kinds = [k for k, _ in rig.events]
    assert kinds == ["chip_reset", "reinit"]
    assert "not metered" in rig.events[1][1]
    assert len(rig.driver.unmetered) == 1
    # energy before the reset is kept; the unknowable interval is excluded and reported
    assert abs(rig.energy_error_lsb(rig.unmetered_truth_j())) < 2.0
    assert samples[-1].status == 0 and (samples[-1].power_w or 0.0) > 0


def test_checksum_corruption_is_detected_and_the_calibration_reloaded(rig: Rig) -> None:
    rig.run(5)
    rig.chip.corrupt_register("PLconstL", 0x0010)
    _samples, errors = rig.run(10)
    assert len(errors) == 1 and isinstance(errors[0], ChecksumError) and errors[0].recovered
    assert [k for k, _ in rig.events] == ["checksum_error", "reinit"]
    assert "CS1" in rig.events[0][1]
    assert rig.chip.cal_state == "checked"
    err = rig.energy_error_lsb()
    assert -rig.unmetered_truth_j() / rig.driver.calibration.joules_per_count() - 2 < err < 1


def test_stuck_chip_is_reported_and_recovered_when_it_answers_again(rig: Rig) -> None:
    rig.run(3)
    rig.chip.set_stuck(0x1234)
    _, errors = rig.run(3)
    assert len(errors) == 3 and all(isinstance(e, BusError) for e in errors)
    assert isinstance(errors[0], ChipStuckError)
    assert "0x1234" in str(errors[0])
    rig.chip.set_stuck(None)
    samples, errors = rig.run(3)
    assert errors == [] and len(samples) == 3
    assert "reinit" in [k for k, _ in rig.events]
    assert abs(rig.energy_error_lsb(rig.unmetered_truth_j())) < 2.0


def test_absent_chip_is_reported_and_comes_back(rig: Rig) -> None:
    rig.run(3)
    rig.chip.set_absent(True)
    _, errors = rig.run(4)
    assert len(errors) == 4
    assert all(isinstance(e, ChipAbsentError) for e in errors)
    assert "absent" in [k for k, _ in rig.events]
    rig.chip.set_absent(False)  # plugged back in: power-on defaults
    samples, errors = rig.run(3)
    assert errors == [] and len(samples) == 3
    assert [k for k, _ in rig.events][-1] == "reinit"
    assert samples[-1].energy_j >= samples[0].energy_j


def test_absent_chip_refuses_start() -> None:
    for kind in BUSES:
        r = Rig(kind)
        r.chip.set_absent(True, level=0x00 if kind == "spidev" else 0xFF)
        with pytest.raises(BusError) as info:
            r.driver.start()
        if kind != "uart":  # UART: no answer at all, a timeout rather than a pattern
            assert isinstance(info.value, ChipAbsentError), kind
        r.close()
