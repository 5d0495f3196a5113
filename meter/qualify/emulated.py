"""An emulated board to qualify, with faults a qualification must find.

Each channel has a true load (`SwitchedLoad`, what a reference would measure) and a chip that
sees it through its CT, with injectable faults: a gain error (`energy_l`), a phase error
(`phase_l_rad`), a power offset (`power_offset_w`), a reversed CT, crosstalk from another
channel, or a dead channel (the CT unplugged). The reference is the load's exact integral.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from meter.chip.calibration import Calibration
from meter.clock import SimulatedClock
from meter.driver.atm90e26 import ATM90E26Driver
from meter.emulation.chip_emulator import EmulatedChip
from meter.emulation.emulated_bus import EmulatedSpiBus
from meter.emulation.load_profiles import Coupled, Silent, SwitchedLoad
from meter.emulation.power_models import PowerModel
from meter.qualify.analysis import Window

DEFAULT_MC = 1e8  # imp/kWh, epi's default


@dataclass(frozen=True)
class ChannelFaults:
    errors: dict[str, float] = field(default_factory=dict)  # EmulatedChip front-end errors
    ct_reversed: bool = False
    crosstalk_from: int | None = None
    crosstalk_fraction: float = 0.0
    dead: bool = False


class EmulatedPlant:
    """The loads of an emulated board, switched by the qualification."""

    def __init__(self, loads: Sequence[SwitchedLoad], clock: SimulatedClock, load_w: float):
        self.loads, self.clock, self.load_w = list(loads), clock, load_w

    def set_load(self, channel: int | None, power_factor: float = 1.0) -> None:
        now = self.clock.monotonic_ns()
        for i, load in enumerate(self.loads):
            load.set(now, self.load_w if i == channel else 0.0,
                     power_factor if i == channel else None)


class ExactReference:
    """The emulator's ground truth: the load's exact energy over the window."""

    uncertainty_pct = 0.1  # stated like a good bench reference

    def __init__(self, loads: Sequence[SwitchedLoad]) -> None:
        self.loads = list(loads)

    def energy_j(self, channel: int, t0_mono_ns: int, t1_mono_ns: int,
                 windows: Sequence[Window]) -> float:
        return self.loads[channel].energy_j(t0_mono_ns, t1_mono_ns)


def emulated_board(faults: Sequence[ChannelFaults], *, load_w: float = 7.0,
                   meter_constant: float = DEFAULT_MC
                   ) -> tuple[list[ATM90E26Driver], SimulatedClock, EmulatedPlant,
                              ExactReference]:
    """Started drivers on emulated chips with the given faults, and their plant/reference."""
    clock = SimulatedClock()
    t0 = clock.monotonic_ns()
    loads = [SwitchedLoad(start_mono_ns=t0) for _ in faults]
    drivers = []
    for i, f in enumerate(faults):
        seen: PowerModel = loads[i]
        if f.dead:
            seen = Silent()
        elif f.crosstalk_from is not None:
            seen = Coupled(loads[i], loads[f.crosstalk_from], f.crosstalk_fraction)
        chip = EmulatedChip(seen, clock, meter_constant_imp_per_kwh=meter_constant,
                            errors=dict(f.errors), ct_reversed=f.ct_reversed, seed=i)
        d = ATM90E26Driver(EmulatedSpiBus(chip), Calibration.default(meter_constant),
                           clock=clock, first_measurement_s=0.2)
        d.start()
        drivers.append(d)
    return drivers, clock, EmulatedPlant(loads, clock, load_w), ExactReference(loads)
