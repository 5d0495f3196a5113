"""ATM90E26 driver for the Pi: the shared chip protocol over a `meter.bus` Bus, typed.

The protocol itself — LastData verification, the read-clear sentinel, the start-up sequence,
readiness, plausibility re-reads, checked and unwrapped energy, fault classification (a
SysStatus checksum error acted on at the first read, confirmed by CS1/CS2 read back) and
recovery — lives once in `meter.chip.protocol.Protocol`, which the board firmware runs too
(docs/atm90e26.md). This wrapper adds what only the Pi needs: the bus (whose `BusError`
becomes "no answer" for the protocol), the `Clock` (ns ticks, so a `SimulatedClock` can drive
it), typed `Reading` records, the N-line registers, energy in joules, the `on_event` events
and the calibration procedures' hooks.

`read_sample()` raises a `meter.errors.BusError` subclass on a fault, after recovering where
it can (`recovered`): `ChipResetError`, `ChecksumError`, `ChipAbsentError`, `ChipStuckError`,
`ImplausibleReadingError`, `VerifyError`. Every fault goes out through `on_event` exactly once
and the exception carries `reported = True`. Energy during an interval the chip could not
meter (reset, checksum error) is listed in `unmetered` with an estimate; the cumulative total
is kept across re-initialisation.

Event kinds (docs/formats.md): `bus_error`, `chip_reset`, `reinit`, `absent`,
`checksum_error`, `implausible`, `misread`, `late` (energy wrap corrected after a long gap).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypedDict

from meter.bus.base import Bus
from meter.chip import registers as regs
from meter.chip.calibration import EMULATED_FRONTEND, Calibration
from meter.chip.protocol import Protocol
from meter.clock import Clock, SystemClock
from meter.driver.plausibility import Limits
from meter.driver.reading import Reading
from meter.errors import BusError

__all__ = ["ATM90E26Driver", "Reading", "UnmeteredInterval"]

_SAMPLE_VALUES = ("Urms", "Irms", "Pmean", "Qmean", "Smean", "PowerF", "Pangle", "Freq")
_N_LINE_VALUES = {  # register -> Reading.n_line key
    "Irms2": "current_a",
    "Pmean2": "power_w",
    "Qmean2": "reactive_power_var",
    "Smean2": "apparent_power_va",
    "PowerF2": "power_factor",
    "Pangle2": "phase_angle_deg",
}


class UnmeteredInterval(TypedDict):
    """An interval the chip could not meter (a reset or checksum error stopped it)."""

    t0_mono_ns: int
    t1_mono_ns: int
    reason: str
    estimate_j: float | None


def _spec(names: tuple[str, ...]) -> tuple[tuple[str, bool], ...]:
    return tuple((name, bool(regs.BY_NAME[name].extended)) for name in names)


class ATM90E26Driver:
    """Drive one ATM90E26 over a `meter.bus.base.Bus`.

    Args:
        bus: the transport (SPI, GPIO-CS SPI, UART or emulated).
        calibration: the channel's `meter.chip.calibration.Calibration` (written by `start()`).
        on_event: `on_event(kind, detail)` for every fault and recovery.
        clock: `SystemClock` (default) or a `SimulatedClock` shared with an emulator.
        n_line: read the N-line registers too (where the N line is wired through a CT).
        retries: attempts per verified access.
        reset_settle_s: wait after SoftReset (the datasheet gives none; 10 ms is generous).
        first_measurement_s: how long after the measurement block starts (start-up,
            re-initialisation) its registers hold a first complete measurement. Readings
            begun earlier are `ready = False`, their measurement fields None. The datasheet
            gives no refresh period: 2 s for real chips (as the CircuitPython driver waits),
            the emulator's refresh period for emulated ones.
        limits: the channel's physical ranges (default: from the calibration's front end).
    """

    def __init__(
        self,
        bus: Bus,
        calibration: Calibration,
        *,
        on_event: Callable[[str, str], None] | None = None,
        clock: Clock | None = None,
        n_line: bool = False,
        retries: int = 5,
        reset_settle_s: float = 0.01,
        first_measurement_s: float = 2.0,
        limits: Limits | None = None,
    ) -> None:
        self.bus = bus
        self.clock: Clock = clock if clock is not None else SystemClock()
        self.n_line = n_line
        self.first_measurement_ns = int(first_measurement_s * 1e9)
        self.reset_settle_ns = int(reset_settle_s * 1e9)
        self.energy_epoch_mono_ns: int | None = None
        self.protocol = Protocol(
            self._read_word,
            self._write_word,
            calibration,
            self.clock.monotonic_ns,
            1_000_000_000,
            _spec(_SAMPLE_VALUES + (tuple(_N_LINE_VALUES) if n_line else ())),
            on_event=self._event,
            sleep=self._sleep_ns,
            retries=retries,
            reset_settle_ticks=self.reset_settle_ns,
            first_measurement_ticks=self.first_measurement_ns,
            limits=limits
            or Limits.for_frontend(calibration.frontend or EMULATED_FRONTEND),
            report_faults=True,
            recover_at_once=True,
            unready_measurements=_spec(_SAMPLE_VALUES),  # a steady bus timing
        )
        self.on_event = on_event

    # ---- the protocol's I/O -----------------------------------------------------------------
    def _read_word(self, address: int) -> int | None:
        """One bus read; None if the bus itself reported a failure (UART timeout/checksum)."""
        try:
            return self.bus.read_register(address)
        except BusError:
            return None

    def _write_word(self, address: int, value: int) -> bool:
        try:
            self.bus.write_register(address, value)
        except BusError:
            return False
        return True

    def _sleep_ns(self, ns: int) -> None:
        self.clock.sleep_until(self.clock.monotonic_ns() + ns)

    def _event(self, kind: str, detail: str) -> None:
        if self.on_event is not None:
            self.on_event(kind, detail)

    # ---- state the callers read ---------------------------------------------------------------
    @property
    def calibration(self) -> Calibration:
        cal: Calibration = self.protocol.calibration
        return cal

    @calibration.setter
    def calibration(self, cal: Calibration) -> None:
        self.protocol.calibration = cal

    @property
    def limits(self) -> Limits:
        limits: Limits = self.protocol.limits
        return limits

    @limits.setter
    def limits(self, limits: Limits) -> None:
        self.protocol.limits = limits

    @property
    def retries(self) -> int:
        return int(self.protocol.retries)

    @property
    def stats(self) -> dict[str, int]:
        """Access counters: reads, writes, retries, LastData recoveries, re-initialisations,
        wrap corrections, plausibility re-reads and rejections, energy and word misreads."""
        return dict(self.protocol.stats)

    @property
    def unmetered(self) -> list[UnmeteredInterval]:
        """Intervals the chip could not meter, with an estimate at the last power."""
        return [
            UnmeteredInterval(t0_mono_ns=t0, t1_mono_ns=t1, reason=reason, estimate_j=est)
            for t0, t1, reason, est in self.protocol.unmetered
        ]

    @staticmethod
    def frames_per_clean_read(n_line: bool = False) -> int:
        """Bus transactions of one `read_sample()` without faults: every register access is a
        read and its LastData confirmation; extended values also read the LSB register."""
        names = [*_SAMPLE_VALUES, *(_N_LINE_VALUES if n_line else ())]
        words = 4 + sum(2 if regs.BY_NAME[n].extended else 1 for n in names)
        return 2 * words  # FuncEn, SysStatus, CalStart, ATenergy + the values

    # ---- verified access ----------------------------------------------------------------------
    def read_register(self, address: int) -> int:
        """A register word confirmed by LastData (read-clear registers: `read_clear`)."""
        return self.protocol.read(address)

    def read_clear(self, address: int) -> int:
        """A read-clear register, never re-read once the chip may have cleared it."""
        return self.protocol.read_clear(address)

    def write_register(self, address: int, value: int) -> None:
        """Write a word and confirm it through LastData (re-writing if it did not land)."""
        self.protocol.write(address, value)

    def read_value(self, name: str) -> float:
        """One measurement register as a value in its unit (with the LSB extension)."""
        r = regs.BY_NAME[name]
        raw = self.read_register(r.address)
        if r.extended:
            return float(regs.extended_value(r, raw, self.read_register(regs.LSB)))
        return float(r.decode(raw))

    # ---- start-up and calibration -------------------------------------------------------------
    def start(self) -> None:
        """Reset the chip, write the calibration (verified), clear energy; energy_j = 0."""
        p = self.protocol
        p.init_chip()
        p.counts = 0
        p.reverse_counts = 0
        p.last_power = None
        self.energy_epoch_mono_ns = p.t_energy

    def apply_calibration(self, cal: Calibration) -> None:
        """Write a new calibration to a running chip (blocks + checksums, verified).

        Energy metered while the blocks are rewritten is discarded (reported as unmetered).
        """
        p = self.protocol
        t0 = self.clock.monotonic_ns()
        p.counts += p.read_clear(regs.AT_ENERGY)
        p.write_blocks(cal)
        p.measuring_since = self.clock.monotonic_ns()
        p.calibration = cal
        p.read_clear(regs.AT_ENERGY)
        p.t_energy = p.t_read_clear
        p.reverse_carry = 0
        p.note_unmetered(t0, p.t_energy, "calibration rewritten")

    # ---- readings -----------------------------------------------------------------------------
    @property
    def energy_counts(self) -> int:
        return self.protocol.counts

    @property
    def energy_t_mono_ns(self) -> int | None:
        """When the last energy read reached the chip (energy_j is metered up to then)."""
        return self.protocol.t_energy

    @property
    def energy_j(self) -> float:
        """Cumulative forward (consumed) active energy since `start()`, J: reverse energy is
        kept apart (`reverse_energy_j`), never added here."""
        return self.energy_counts * self.calibration.joules_per_count()

    @property
    def reverse_energy_j(self) -> float:
        """Cumulative reverse active energy since `start()` (ANenergy), J."""
        return self.protocol.reverse_counts * self.calibration.joules_per_count()

    def measurement_ready(self, t_mono_ns: int) -> bool:
        """Whether a read begun at `t_mono_ns` sees a complete measurement (not reset zeros)."""
        return self.protocol.measurement_ready(t_mono_ns)

    def read_sample(self) -> Reading:
        """Read the chip once; raises a `BusError` subclass on a fault (after recovering).

        Every fault is also reported through `on_event` exactly once; the exception then
        carries `reported = True` so a caller that logs exceptions can skip a duplicate.
        """
        m0 = self.clock.monotonic_ns()
        r0 = self.clock.realtime_ns()
        try:
            t0, status, t_energy, values, _words = self.protocol.read_sample()
        except BusError as exc:
            if not exc.reported:
                self._event(exc.kind, str(exc))
                exc.reported = True
            raise
        t_mid = (t0 + self.clock.monotonic_ns()) // 2
        r_mid = r0 + (t_mid - m0)  # the realtime of t_mid (t0 follows any re-initialisation)
        if values is None:
            return Reading(
                t_mono_ns=t_mid,
                t_real_ns=r_mid,
                power_w=None,
                voltage_v=None,
                current_a=None,
                power_factor=None,
                frequency_hz=None,
                energy_j=self.energy_j,
                status=status,
                energy_counts=self.energy_counts,
                energy_t_mono_ns=t_energy,
                ready=False,
            )
        n_line = None
        if self.n_line:
            n_line = {key: values[name] for name, key in _N_LINE_VALUES.items()}
        return Reading(
            t_mono_ns=t_mid,
            t_real_ns=r_mid,
            power_w=values["Pmean"],
            voltage_v=values["Urms"],
            current_a=values["Irms"],
            power_factor=values["PowerF"],
            frequency_hz=values["Freq"],
            energy_j=self.energy_j,
            status=status,
            reactive_power_var=values["Qmean"],
            apparent_power_va=values["Smean"],
            phase_angle_deg=values["Pangle"],
            energy_counts=self.energy_counts,
            energy_t_mono_ns=t_energy,
            n_line=n_line,
        )

    # ---- energy bookkeeping for procedures (meter/driver/calibration_procedures.py) ----------
    @property
    def last_read_clear_t_ns(self) -> int:
        """When the last read-clear read reached the chip."""
        return self.protocol.t_read_clear

    def add_energy_counts(self, counts: int, t_mono_ns: int | None = None) -> None:
        """Count energy a procedure read from ATenergy itself (metered up to `t_mono_ns`)."""
        self.protocol.counts += counts
        if t_mono_ns is not None:
            self.protocol.t_energy = t_mono_ns

    def close(self) -> None:
        self.bus.close()
