"""SPI buses: kernel chip-select spidev and gpiozero chip-select lines (mock pin factory)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from gpiozero.pins.mock import MockFactory

from meter.bus.gpio_cs_bus import GpioCsSpiBus
from meter.bus.spidev_bus import SpidevBus
from meter.chip import registers as regs
from meter.chip.calibration import Calibration
from meter.clock import SimulatedClock
from meter.driver.atm90e26 import ATM90E26Driver
from meter.emulation.chip_emulator import EmulatedChip
from meter.emulation.emulated_bus import EmulatedSpidev
from meter.emulation.power_models import ConstantPower


def _selected(factory: MockFactory, pin: int) -> Callable[[], bool]:
    """Whether GPIO `pin` (an active-low chip-select) is driven low."""
    return lambda: not factory.pin(pin).state


def _chip(clock: SimulatedClock, power_w: float = 5.0) -> EmulatedChip:
    return EmulatedChip(ConstantPower(power_w), clock)


def test_spidev_bus_is_mode_3_at_160khz_one_xfer2_per_frame() -> None:
    clock = SimulatedClock()
    chip = _chip(clock)
    fake = EmulatedSpidev(kernel_cs={(0, 1): chip})
    bus = SpidevBus(0, 1, spidev_module=fake)
    assert bus.read_register(regs.reg("MMode").address) == 0x9422
    bus.write_register(regs.FUNC_EN, 0x0030)
    assert chip.peek(regs.FUNC_EN) == 0x0030
    assert len(fake.log) == 2  # one xfer2 per 24-bit frame
    for entry in fake.log:
        assert entry["mode"] == 3 and entry["speed_hz"] == 160_000
        assert len(entry["frame"]) == 3 and entry["delay_us"] == 5 and not entry["no_cs"]
    assert bus.describe()["chip_select"] == "CE1"
    bus.close()


def test_spi_settings_the_chip_cannot_take_are_refused() -> None:
    fake = EmulatedSpidev()
    with pytest.raises(ValueError, match="mode 3"):
        SpidevBus(0, 0, mode=0, spidev_module=fake)
    with pytest.raises(ValueError, match="160000"):
        SpidevBus(0, 0, speed_hz=500_000, spidev_module=fake)  # the spidev/gpiozero default


def test_a_chip_at_the_wrong_mode_or_speed_reads_garbage() -> None:
    """The spidev stand-in models the chip not understanding a wrong clock phase."""
    clock = SimulatedClock()
    fake = EmulatedSpidev(kernel_cs={(0, 0): _chip(clock)})
    dev = fake.SpiDev()
    dev.open(0, 0)
    dev.mode = 0
    assert dev.xfer2([0xAB, 0, 0]) == [0xFF, 0xFF, 0xFF]


def test_gpio_chip_selects_idle_high_from_construction_and_frame_each_transfer() -> None:
    clock = SimulatedClock()
    factory = MockFactory()
    chips = {pin: _chip(clock, 2.0 + k) for k, pin in enumerate((8, 7, 25, 24))}
    fake = EmulatedSpidev(gpio_cs=[
        (_selected(factory, pin), chip) for pin, chip in chips.items()
    ])
    buses = {}
    for pin in chips:
        buses[pin] = GpioCsSpiBus(pin, spidev_module=fake, pin_factory=factory)
        # claimed as an output driven high the moment the bus exists: never a low glitch
        p = factory.pin(pin)
        assert p.function == "output" and p.state is True
        assert [s.state for s in p.states] == [False, True]  # floating input, then high
    for pin in chips:
        factory.pin(pin).clear_states()
    # a frame on one chip: its CS goes low for exactly that frame; the others stay high
    buses[25].write_register(regs.FUNC_EN, 0x0030)
    assert [s.state for s in factory.pin(25).states] == [True, False, True]
    for other in (8, 7, 24):
        assert [s.state for s in factory.pin(other).states] == [True]
    assert chips[25].peek(regs.FUNC_EN) == 0x0030
    assert all(chips[p].peek(regs.FUNC_EN) == 0x000C for p in (8, 7, 24))
    # the shared spidev runs without kernel CS, mode 3, 160 kHz, and exactly one chip listens
    entry = fake.log[-1]
    assert entry["no_cs"] and entry["mode"] == 3 and entry["speed_hz"] == 160_000
    assert entry["selected"] == 1
    # N frames -> N low pulses
    factory.pin(8).clear_states()
    for _ in range(3):
        buses[8].read_register(regs.LAST_DATA)
    assert [s.state for s in factory.pin(8).states] == [True] + [False, True] * 3
    for bus in buses.values():
        bus.close()


def test_four_drivers_on_gpio_chip_selects_read_their_own_chips() -> None:
    clock = SimulatedClock()
    factory = MockFactory()
    pins = (8, 7, 25, 24)
    chips = [_chip(clock, 2.0 + k) for k in range(4)]
    fake = EmulatedSpidev(gpio_cs=[
        (_selected(factory, pin), chip) for pin, chip in zip(pins, chips,
                                                                           strict=True)
    ])
    drivers = [
        ATM90E26Driver(GpioCsSpiBus(pin, spidev_module=fake, pin_factory=factory),
                       Calibration.default(1e6), clock=clock)
        for pin in pins
    ]
    for d in drivers:
        d.start()
    clock.advance(2_000_000_000)
    powers = [d.read_sample().power_w for d in drivers]
    assert powers == pytest.approx([2.0, 3.0, 4.0, 5.0], abs=0.005)
    assert max(e["selected"] for e in fake.log) == 1
    for d in drivers:
        d.close()


def test_gpio_cs_bus_releases_the_shared_spidev_when_the_last_user_closes() -> None:
    factory = MockFactory()
    fake = EmulatedSpidev()
    a = GpioCsSpiBus(5, spidev_module=fake, pin_factory=factory)
    b = GpioCsSpiBus(6, spidev_module=fake, pin_factory=factory)
    shared = a._shared
    assert shared is not None and b._shared is shared
    dev = vars(shared.dev)  # the emulator's SpiDev records `closed`
    a.close()
    assert not dev["closed"]
    b.close()
    assert dev["closed"]
