"""ATM90E26 driver: verified register access, start-up/calibration, readings, fault recovery.

What it guarantees, and how:

- Every read is confirmed by LastData (application note §4.3.1): the target read and the
  LastData read must agree; on a mismatch LastData is read again, and an ordinary register
  is simply re-read. Read-clear registers (SysStatus, energy) are never re-read once the chip
  may have cleared them: the value is recovered from LastData. To tell "the chip executed the
  read" from "the frame never reached it" (a partial frame, a lost UART request), every
  read-clear read immediately follows a verified read whose word is known (the *sentinel*):
  LastData still holding the sentinel means the read did not happen and may be repeated.
- Every write is confirmed by LastData (§4.3.2); when LastData already holds the value about
  to be written, a different register is read first, so a dropped write cannot pass.
- `start()` runs the sequence of reference §4.1: SoftReset, FuncEn (presence check), SagTh,
  CalStart 5678 → PLconstH..MMode → CS1 (read back: the chip's own computation must equal
  ours), AdjStart 5678 → Ugain..QoffsetN → CS2, CalStart/AdjStart 8765, SysStatus clean.
- `read_sample()` reads FuncEn, SysStatus, the measurements (RMS and power with the LSB
  extension), CalStart and ATenergy, and classifies the chip's state first: absent (all
  0xFFFF/0x0000), stuck (one word for everything), reset (FuncEn/CalStart back at their
  defaults), checksum error (CalErr/AdjErr). A reset or checksum error is recovered by
  re-initialising with the calibration, reported through `on_event`, and raised once
  (`ChipResetError` / `ChecksumError`) so the sweep writes no row for the disturbed interval.
- Energy: ATenergy (absolute active, read-clear, 0.1 pulse per count) is accumulated into a
  monotonic count since `start()`; a read that spans more than one register wrap (a stalled
  sampler) is corrected from the mean power and reported. Energy during an interval the chip
  could not meter (reset, checksum error) is reported by event with an estimate; the
  cumulative total is kept across re-initialisation.

Event kinds (docs/formats.md): `bus_error`, `chip_reset`, `reinit`, `absent`,
`checksum_error`, `late` (energy wrap corrected after a long gap between reads).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable

from meter.bus.base import Bus, BusError, BusTimeout
from meter.chip import calibration as calib
from meter.chip import registers as regs
from meter.chip.calibration import EMULATED_FRONTEND, Calibration, CalibrationError
from meter.clock import Clock, SystemClock
from meter.driver import plausibility
from meter.driver.plausibility import Limits
from meter.driver.reading import Reading

__all__ = [
    "ATM90E26Driver",
    "BusError",
    "BusTimeout",
    "CalibrationError",
    "ChecksumError",
    "ChipAbsentError",
    "ChipResetError",
    "ChipStuckError",
    "ImplausibleReadingError",
    "Reading",
    "Sample",
    "VerifyError",
]


class ChipResetError(BusError):
    """The chip had reset (defaults back); the driver re-initialised it when `recovered`."""

    def __init__(self, message: str = "chip reset", *, recovered: bool = False) -> None:
        super().__init__(message)
        self.recovered = recovered


class ChipAbsentError(BusError):
    """No chip answers: every word reads 0xFFFF or 0x0000 (unplugged, unpowered, wrong CS)."""


class ChipStuckError(BusError):
    """The chip answers the same word to every register and ignores writes."""


class ChecksumError(BusError):
    """CalErr/AdjErr: a calibration block does not match its checksum (metering or
    measurement stopped); the driver re-initialised it when `recovered`."""

    def __init__(self, message: str = "checksum error", *, recovered: bool = False) -> None:
        super().__init__(message)
        self.recovered = recovered


class VerifyError(BusError):
    """A register access could not be confirmed by LastData within the retry budget."""


class ImplausibleReadingError(BusError):
    """The measurement registers failed the plausibility checks twice in a row (a bit error or
    cut frame the LastData check cannot see, or a genuinely out-of-range mains): no reading."""


Sample = Reading  # the earlier name of the reading record

_SAMPLE_VALUES = ("Urms", "Irms", "Pmean", "Qmean", "Smean", "PowerF", "Pangle", "Freq")
_N_LINE_VALUES = ("Irms2", "Pmean2", "Qmean2", "Smean2", "PowerF2", "Pangle2")
_ABSENT_WORDS = (0x0000, 0xFFFF)
_RESET_FUNC_EN = regs.BY_NAME["FuncEn"].reset
_SENTINEL_CANDIDATES = (regs.CAL_START, regs.FUNC_EN, regs.ADJ_START, 0x2B)  # MMode last


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
        self.calibration = calibration
        self.on_event = on_event
        self.clock: Clock = clock if clock is not None else SystemClock()
        self.first_measurement_ns = int(first_measurement_s * 1e9)
        self.limits = limits or Limits.for_frontend(calibration.frontend or EMULATED_FRONTEND)
        self._measuring_since_ns: int | None = None
        self.n_line = n_line
        self.retries = max(1, retries)
        self.reset_settle_ns = int(reset_settle_s * 1e9)
        self._ld_expected: int | None = None  # what LastData holds after our last verified access
        self._rc_t_ns = 0  # when the last read-clear read reached the chip
        self._rc_other: int | None = None  # the word read when LastData said otherwise
        self._needs_init = True
        self._energy_counts = 0
        self.energy_epoch_mono_ns: int | None = None
        self._t_energy_ns: int | None = None
        self._last_power_w: float | None = None
        self.unmetered: list[dict] = []  # intervals the chip could not meter, with estimates
        self.stats = {
            "reads": 0,
            "writes": 0,
            "read_retries": 0,
            "write_retries": 0,
            "lastdata_recoveries": 0,
            "verify_failures": 0,
            "reinits": 0,
            "wrap_corrections": 0,
            "implausible_rereads": 0,
            "implausible_rejected": 0,
            "energy_misreads": 0,
        }

    @staticmethod
    def frames_per_clean_read(n_line: bool = False) -> int:
        """Bus transactions of one `read_sample()` without faults: every register access is a
        read and its LastData confirmation; extended values also read the LSB register."""
        names = [*_SAMPLE_VALUES, *(_N_LINE_VALUES if n_line else ())]
        words = 4 + sum(2 if regs.BY_NAME[n].extended else 1 for n in names)
        return 2 * words  # FuncEn, SysStatus, CalStart, ATenergy + the values

    # ---- events ---------------------------------------------------------------------------
    def _event(self, kind: str, detail: str) -> None:
        if self.on_event is not None:
            self.on_event(kind, detail)

    # ---- raw and verified access ------------------------------------------------------------
    def _raw_read(self, address: int) -> int | None:
        """One bus read; None if the bus itself reported a failure (UART timeout/checksum)."""
        try:
            return self.bus.read_register(address)
        except BusError:
            return None

    def read_register(self, address: int) -> int:
        """A register word confirmed by LastData (for read-clear registers: `read_clear`)."""
        r = regs.BY_ADDRESS.get(address)
        if r is not None and r.read_clear:
            return self.read_clear(address)
        self.stats["reads"] += 1
        seen = []
        for attempt in range(self.retries):
            if attempt:
                self.stats["read_retries"] += 1
            v = self._raw_read(address)
            l1 = self._raw_read(regs.LAST_DATA)
            if v is not None and v == l1:
                self._ld_expected = v
                return v
            l2 = self._raw_read(regs.LAST_DATA)
            if v is not None and l2 == v:
                self._ld_expected = v
                return v
            seen.append((v, l1, l2))
        self.stats["verify_failures"] += 1
        self._ld_expected = None
        if all(x is None for attempt in seen for x in attempt):
            raise ChipAbsentError(f"{_name(address)}: no answer from the chip ({len(seen)} tries)")
        raise VerifyError(f"{_name(address)}: read not confirmed by LastData ({_fmt_seen(seen)})")

    def read_clear(self, address: int) -> int:
        """A read-clear register, never re-read once the chip may have cleared it."""
        self.stats["reads"] += 1
        self._rc_other = None
        sentinel = self._ensure_sentinel()
        for attempt in range(self.retries):
            if attempt:
                self.stats["read_retries"] += 1
            v = self._raw_read(address)
            self._rc_t_ns = self.clock.monotonic_ns()
            lastdata: list[int] = []
            executed = None  # unknown yet
            for _ in range(self.retries + 1):
                ld = self._raw_read(regs.LAST_DATA)
                if ld is None:
                    continue
                if v is not None and ld == v:
                    self._ld_expected = v
                    if lastdata:
                        self.stats["lastdata_recoveries"] += 1
                    return v
                if ld in lastdata:  # LastData is stable at ld
                    if ld == sentinel:
                        executed = False  # the read never reached the chip
                        break
                    self._ld_expected = ld
                    self.stats["lastdata_recoveries"] += 1
                    # v was garbled on MISO, or a redirected LastData read overwrote LastData
                    # with another register's word: keep v for the caller's plausibility check
                    self._rc_other = v
                    return ld
                lastdata.append(ld)
            if executed is False:
                continue  # safe to repeat: nothing was cleared
            break  # LastData never settled: the cleared value is unknowable
        self.stats["verify_failures"] += 1
        self._ld_expected = None
        if v is None and not lastdata:
            raise ChipAbsentError(f"{_name(address)}: no answer from the chip")
        raise VerifyError(
            f"{_name(address)}: read-clear value not recoverable from LastData "
            f"(read {_hex(v)}, LastData {', '.join(_hex(x) for x in lastdata) or 'no answer'})"
        )

    def _ensure_sentinel(self) -> int:
        """Make sure LastData holds a known word before a read-clear read; return it."""
        if self._ld_expected is None:
            self.read_register(regs.CAL_START)
        assert self._ld_expected is not None
        return self._ld_expected

    def write_register(self, address: int, value: int) -> None:
        """Write a word and confirm it through LastData (re-writing if it did not land)."""
        value &= 0xFFFF
        self.stats["writes"] += 1
        if self._ld_expected is None or self._ld_expected == value:
            self._make_lastdata_differ(value)
        seen = []
        answered = False
        for attempt in range(self.retries):
            if attempt:
                self.stats["write_retries"] += 1
            try:
                self.bus.write_register(address, value)
                answered = True
            except BusError as exc:
                seen.append(str(exc))
            l1 = self._raw_read(regs.LAST_DATA)
            if l1 == value:
                self._ld_expected = value
                return
            l2 = self._raw_read(regs.LAST_DATA)
            if l2 == value:
                self._ld_expected = value
                return
            seen.append(f"LastData {_hex(l1)}/{_hex(l2)}")
            answered = answered or l1 is not None or l2 is not None
            if l1 is not None and l1 == l2 and l1 != value:
                self._ld_expected = l1
        self.stats["verify_failures"] += 1
        self._ld_expected = None
        if not answered:
            raise ChipAbsentError(f"{_name(address)} <- 0x{value:04X}: no answer from the chip")
        raise VerifyError(
            f"{_name(address)} <- 0x{value:04X}: write not confirmed ({'; '.join(seen[-3:])})"
        )

    def _make_lastdata_differ(self, value: int) -> None:
        for address in _SENTINEL_CANDIDATES:
            try:
                if self.read_register(address) != value:
                    return
            except VerifyError:
                continue
        # every candidate holds `value` (or cannot be read): the write check may pass falsely
        self._ld_expected = None

    # ---- start-up and calibration -----------------------------------------------------------
    def start(self) -> None:
        """Reset the chip, write the calibration (verified), clear energy; energy_j = 0."""
        self._init_chip()
        self._energy_counts = 0
        self.energy_epoch_mono_ns = self._t_energy_ns
        self._last_power_w = None

    def _init_chip(self) -> None:
        with contextlib.suppress(BusError):  # a lost reset shows in the presence check below
            self.bus.write_register(regs.SOFT_RESET, regs.SOFT_RESET_CODE)
        self._ld_expected = 0x0000  # LastData after a reset
        self.clock.sleep_until(self.clock.monotonic_ns() + self.reset_settle_ns)
        cal = self.calibration
        try:
            self.write_register(regs.FUNC_EN, cal.get("FuncEn"))
        except VerifyError as exc:
            words = [self._raw_read(regs.LAST_DATA), self._raw_read(regs.FUNC_EN)]
            if all(w in _ABSENT_WORDS for w in words):
                self._needs_init = True
                raise ChipAbsentError(
                    f"no ATM90E26 answers: FuncEn and LastData read {_hex(words[1])}/"
                    f"{_hex(words[0])} after writing FuncEn (unplugged, unpowered, wrong "
                    f"chip-select or SPI mode)"
                ) from exc
            if words[0] is not None and words[0] == words[1]:
                self._needs_init = True
                raise ChipStuckError(
                    f"the chip answers {_hex(words[0])} to every register and ignores writes"
                ) from exc
            self._needs_init = True
            raise
        self.write_register(regs.SAG_TH, cal.get("SagTh"))
        self._write_blocks(cal)
        self._measuring_since_ns = self.clock.monotonic_ns()
        self._needs_init = False
        self.stats["reinits"] += 1
        self.read_clear(regs.AT_ENERGY)  # discard what was metered during the sequence
        self._t_energy_ns = self._rc_t_ns

    def _write_blocks(self, cal: Calibration) -> None:
        """CalStart 5678 → metering → CS1; AdjStart 5678 → measurement → CS2; both 8765."""
        blocks = (
            (regs.CAL_START, calib.METERING_NAMES, regs.CS1, cal.cs1(), "CS1"),
            (regs.ADJ_START, calib.MEASUREMENT_NAMES, regs.CS2, cal.cs2(), "CS2"),
        )
        for start_address, names, cs_address, cs_value, cs_name in blocks:
            self.write_register(start_address, regs.START_CODE)
            for name in names:
                self.write_register(regs.address(name), cal.get(name))
            self.write_register(cs_address, cs_value)
            readback = self.read_register(cs_address)
            if readback != cs_value:
                raise ChecksumError(
                    f"{cs_name}: the chip computes 0x{readback:04X} over the block just "
                    f"written, we computed 0x{cs_value:04X} (a write did not land?)"
                )
        self.write_register(regs.CAL_START, regs.CHECK_CODE)
        self.write_register(regs.ADJ_START, regs.CHECK_CODE)
        # LastData confirms a word, not its address: a write redirected by a bit error (8765H
        # into a gain register) passes it. The start registers must read back 8765H.
        for address in (regs.CAL_START, regs.ADJ_START):
            word = self.read_register(address)
            if word != regs.CHECK_CODE:
                raise VerifyError(
                    f"{_name(address)} reads 0x{word:04X} after writing 8765H (the write "
                    f"went elsewhere?)"
                )
        status = self.read_clear(regs.SYS_STATUS)
        if status & (regs.CAL_ERR_MASK | regs.ADJ_ERR_MASK):
            raise ChecksumError(f"SysStatus 0x{status:04X} after the 8765H checks")

    def apply_calibration(self, cal: Calibration) -> None:
        """Write a new calibration to a running chip (blocks + checksums, verified).

        Energy metered while the blocks are rewritten is discarded (reported as unmetered).
        """
        t0 = self.clock.monotonic_ns()
        counts_before = self.read_clear(regs.AT_ENERGY)
        self._energy_counts += counts_before
        self._write_blocks(cal)
        self._measuring_since_ns = self.clock.monotonic_ns()
        self.calibration = cal
        self.read_clear(regs.AT_ENERGY)
        self._t_energy_ns = self._rc_t_ns
        self._note_unmetered(t0, self._t_energy_ns, "calibration rewritten")

    # ---- readings ---------------------------------------------------------------------------
    def read_value(self, name: str) -> float:
        """One measurement register as a value in its unit (with the LSB extension)."""
        r = regs.BY_NAME[name]
        raw = self.read_register(r.address)
        if r.extended:
            return regs.extended_value(r, raw, self.read_register(regs.LSB))
        return r.decode(raw)

    @property
    def energy_counts(self) -> int:
        return self._energy_counts

    @property
    def energy_t_mono_ns(self) -> int | None:
        """When the last energy read reached the chip (energy_j is metered up to then)."""
        return self._t_energy_ns

    @property
    def energy_j(self) -> float:
        """Cumulative absolute active energy since `start()`, J."""
        return self._energy_counts * self.calibration.joules_per_count()

    def read_sample(self) -> Reading:
        """Read the chip once; raises a `BusError` subclass on a fault (after recovering).

        Every fault is also reported through `on_event` exactly once; the exception then
        carries `reported = True` so a caller that logs exceptions can skip a duplicate.
        """
        try:
            return self._read_sample()
        except BusError as exc:
            if isinstance(exc, (ChipAbsentError, ChipStuckError)):
                self._needs_init = True
            if not getattr(exc, "reported", False):
                kind = "absent" if isinstance(exc, ChipAbsentError) else "bus_error"
                self._event(kind, str(exc))
            exc.reported = True
            raise

    def measurement_ready(self, t_mono_ns: int) -> bool:
        """Whether a read begun at `t_mono_ns` sees a complete measurement (not reset zeros)."""
        since = self._measuring_since_ns
        return since is not None and t_mono_ns >= since + self.first_measurement_ns

    def _read_values(self) -> dict[str, float]:
        return {name: self.read_value(name) for name in _SAMPLE_VALUES}

    def _plausible_values(self) -> tuple[dict[str, float], str | None]:
        """The measurement registers, re-read once when they fail the plausibility checks.

        Returns (values, problem): problem is None for values that passed (first or second
        time; a first failure is reported as a ``misread`` event: the reading kept is valid),
        else the reasons of
        the second failure (the caller writes no reading).
        """
        values = self._read_values()
        reasons = plausibility.check_measurements(values, self.limits)
        if not reasons:
            return values, None
        self.stats["implausible_rereads"] += 1
        again = self._read_values()
        reasons2 = plausibility.check_measurements(again, self.limits)
        if not reasons2:
            self._event(
                "misread",
                f"measurement read rejected ({'; '.join(reasons)}); the re-read is consistent",
            )
            return again, None
        self.stats["implausible_rejected"] += 1
        return again, "; ".join(reasons2)

    def _read_sample(self) -> Reading:
        clock = self.clock
        t0 = clock.monotonic_ns()
        r0 = clock.realtime_ns()
        if self._needs_init:
            self._recover("chip not initialised (earlier fault)", None)
            t0 = clock.monotonic_ns()
            r0 = clock.realtime_ns()
        ready = self.measurement_ready(t0)
        func_en = self.read_register(regs.FUNC_EN)
        status = self.read_clear(regs.SYS_STATUS)
        problem = None
        if ready:
            values, problem = self._plausible_values()
        else:
            values = self._read_values()
        n_line = None
        if self.n_line and ready:
            n_line = {
                "current_a": self.read_value("Irms2"),
                "power_w": self.read_value("Pmean2"),
                "reactive_power_var": self.read_value("Qmean2"),
                "apparent_power_va": self.read_value("Smean2"),
                "power_factor": self.read_value("PowerF2"),
                "phase_angle_deg": self.read_value("Pangle2"),
            }
        cal_start = self.read_register(regs.CAL_START)
        counts = self.read_clear(regs.AT_ENERGY)
        t_energy = self._rc_t_ns
        self._classify(func_en, cal_start, status, counts, t_energy)
        power = values["Pmean"] if ready and problem is None else None
        counts = self._checked_energy(counts, t_energy, power, values["Smean"] if power else None)
        counts = self._unwrap(counts, t_energy, power)
        self._energy_counts += counts
        self._t_energy_ns = t_energy
        if power is not None:
            self._last_power_w = power
        if problem is not None:
            detail = f"measurements implausible twice in a row: {problem}; no reading"
            self._event("implausible", detail)
            raise _reported(ImplausibleReadingError(detail))
        t1 = clock.monotonic_ns()
        r1 = clock.realtime_ns()
        if not ready:
            return Reading(
                t_mono_ns=(t0 + t1) // 2,
                t_real_ns=(r0 + r1) // 2,
                power_w=None,
                voltage_v=None,
                current_a=None,
                power_factor=None,
                frequency_hz=None,
                energy_j=self.energy_j,
                status=status,
                energy_counts=self._energy_counts,
                energy_t_mono_ns=t_energy,
                ready=False,
            )
        return Reading(
            t_mono_ns=(t0 + t1) // 2,
            t_real_ns=(r0 + r1) // 2,
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
            energy_counts=self._energy_counts,
            energy_t_mono_ns=t_energy,
            n_line=n_line,
        )

    def _checked_energy(
        self, counts: int, t_ns: int, power_w: float | None, apparent_va: float | None
    ) -> int:
        """ATenergy counts checked against the power over the interval since the last read.

        Counts above what the power allows are re-read at once. A redirected read (a MOSI bit
        error sent it to another register) did not clear ATenergy, so the re-read finds the
        interval's counts still there: those are taken and the first word is discarded. A
        genuine read cleared the register, so the re-read finds next to nothing: the first
        first word is not believable either way (a real node's power cannot outrun the bound,
        which allows ``LAG_FACTOR`` times the power read plus a floor, within one interval):
        it is discarded, at the cost of at most that interval's energy: an ``implausible``
        event (a fault: energy may be missing). The cases where the counts taken are exact
        are ``misread`` events (informational: nothing was lost).
        """
        if self._t_energy_ns is None:
            return counts
        jpc = self.calibration.joules_per_count()
        dt_s = (t_ns - self._t_energy_ns) / 1e9
        if power_w is None:  # no trusted power yet (settling, or rejected): physics only
            bound = plausibility.physical_bound_counts(dt_s, jpc, self.limits)
        else:
            powers = [power_w, apparent_va or 0.0]
            if self._last_power_w is not None:
                powers.append(self._last_power_w)
            bound = plausibility.energy_bound_counts(powers, dt_s, jpc, self.limits)
        other = self._rc_other
        if other is not None and other != counts and power_w is not None:
            # the word read and LastData disagreed: take the one the power supports
            last = self._last_power_w if self._last_power_w is not None else power_w
            expected = (abs(power_w) + abs(last)) / 2 * dt_s / jpc
            if abs(other - expected) < abs(counts - expected):
                self._event(
                    "misread",
                    f"ATenergy read {other} but LastData then held {counts}; {expected:.0f} "
                    f"expected from the power: {other} counted",
                )
                counts, other = other, None
        if counts <= bound:
            return counts
        again = self.read_clear(regs.AT_ENERGY)
        t2 = self._rc_t_ns
        # what the load can have metered between the two reads (microseconds): next to nothing
        residue = plausibility.energy_bound_counts(
            [power_w or 0.0, apparent_va or 0.0], (t2 - t_ns) / 1e9, jpc, self.limits
        )
        first = f"ATenergy read {counts} counts ({counts * jpc:.3f} J) in {dt_s:.3f} s " \
                f"where the power allows {bound:.0f}"
        if again > residue:
            self.stats["energy_misreads"] += 1
            self._event(
                "misread",
                f"{first}; the register still held {again} counts, so the first read did not "
                f"reach ATenergy: discarded, {again} counted",
            )
            return again
        if other is not None and other <= bound:
            self.stats["energy_misreads"] += 1
            self._event(
                "misread",
                f"{first}; the register read {other} but LastData then said {counts} (a "
                f"redirected LastData read overwrites it): {other} counted",
            )
            return other + again
        self.stats["energy_misreads"] += 1
        self._event(
            "implausible",
            f"{first}; a re-read found {again} counts: the register was read, but the word is "
            f"not believable (a load that rose that fast would show in the power registers): "
            f"discarded, {again} counted (at most this interval's energy is lost)",
        )
        return again

    def _classify(self, func_en: int, cal_start: int, status: int, counts: int, t: int) -> None:
        """Raise (after recovering) if the words read say the chip is not in its set state.

        A configuration word that looks wrong is read once more before anything is done: a
        bit error on one read must not cost a re-initialisation (which loses the energy the
        chip metered since the last read).
        """
        configured = self.calibration.get("FuncEn")
        if func_en != configured or cal_start != regs.CHECK_CODE:
            try:
                again = (self.read_register(regs.FUNC_EN), self.read_register(regs.CAL_START))
            except BusError:
                again = None
            if again == (configured, regs.CHECK_CODE):
                self._event(
                    "misread",
                    f"FuncEn/CalStart read 0x{func_en:04X}/0x{cal_start:04X}, then "
                    f"0x{configured:04X}/0x8765 at once: a misread, the chip is as configured",
                )
                func_en, cal_start = again
        if func_en in _ABSENT_WORDS and cal_start in _ABSENT_WORDS:
            self._needs_init = True
            detail = f"FuncEn and CalStart read 0x{func_en:04X}/0x{cal_start:04X}: no chip answers"
            self._event("absent", detail)
            raise _reported(ChipAbsentError(detail))
        if func_en == cal_start:
            self._needs_init = True
            detail = f"every register reads 0x{func_en:04X}: chip stuck"
            self._event("bus_error", detail)
            raise _reported(ChipStuckError(detail))
        reset = cal_start == regs.POWER_ON_CODE or (
            func_en == _RESET_FUNC_EN and configured != _RESET_FUNC_EN
        )
        if reset:
            detail = (
                f"chip reset detected (FuncEn 0x{func_en:04X}, CalStart 0x{cal_start:04X}); "
                f"energy metered since the last read is lost"
            )
            self._event("chip_reset", detail)
            self._recover("chip reset", t)
            raise _reported(ChipResetError(detail + "; re-initialised", recovered=True))
        err_bits = regs.CAL_ERR_MASK | regs.ADJ_ERR_MASK
        if status & err_bits:
            # CalErr/AdjErr are levels that stay while the error lasts: a second read tells a
            # real checksum error from a garbled or redirected SysStatus read
            again = self.read_clear(regs.SYS_STATUS)
            if not again & err_bits:
                self._event(
                    "misread",
                    f"SysStatus read 0x{status:04X} (checksum error bits) but 0x{again:04X} "
                    f"at once after: a misread, not a checksum error",
                )
            status = again
        if status & err_bits:
            self._energy_counts += counts  # metered before the block stopped: real energy
            which = []
            if status & regs.CAL_ERR_MASK:
                which.append("CS1 (metering stopped)")
            if status & regs.ADJ_ERR_MASK:
                which.append("CS2 (measurements frozen)")
            detail = f"SysStatus 0x{status:04X}: checksum error in {' and '.join(which)}"
            self._event("checksum_error", detail)
            self._recover("checksum error", t)
            raise _reported(ChecksumError(detail + "; calibration re-loaded", recovered=True))
        if func_en != configured or cal_start != regs.CHECK_CODE:
            detail = (
                f"unexpected FuncEn 0x{func_en:04X} / CalStart 0x{cal_start:04X} "
                f"(want 0x{configured:04X} / 0x8765)"
            )
            if counts <= plausibility.physical_bound_counts(
                (t - (self._t_energy_ns or t)) / 1e9, self.calibration.joules_per_count(),
                self.limits,
            ):  # metering ran until now: keep what it counted
                self._energy_counts += counts
                self._t_energy_ns = t
            self._event("bus_error", detail)
            self._recover("unexpected configuration", t)
            raise _reported(BusError(detail + "; re-initialised"))

    def _recover(self, reason: str, t_detected: int | None) -> None:
        """Re-initialise the chip with the calibration; keep the cumulative energy."""
        t_from = self._t_energy_ns
        self._needs_init = True
        try:
            self._init_chip()
        except ChipAbsentError as exc:
            self._event("absent", str(exc))
            raise _reported(exc) from None
        except BusError as exc:
            self._event("bus_error", f"re-initialisation after {reason} failed: {exc}")
            raise _reported(exc) from None
        t_to = self._t_energy_ns
        note = self._note_unmetered(t_from, t_to, reason)
        self._event("reinit", f"re-initialised after {reason}; {note}")

    def _note_unmetered(self, t_from: int | None, t_to: int | None, reason: str) -> str:
        if t_from is None or t_to is None or t_to <= t_from:
            return "no metered interval lost"
        dt_s = (t_to - t_from) / 1e9
        p = self._last_power_w
        est = None if p is None else abs(p) * dt_s
        self.unmetered.append(
            {"t0_mono_ns": t_from, "t1_mono_ns": t_to, "reason": reason, "estimate_j": est}
        )
        est_text = "unknown" if est is None else f"≈{est:.3f} J at the last power"
        return f"energy over {dt_s:.3f} s not metered ({est_text}), excluded from energy_j"

    def _unwrap(self, counts: int, t_ns: int, power_w: float | None) -> int:
        """Add whole register wraps that a long gap between reads can hide."""
        if self._t_energy_ns is None or power_w is None:
            return counts
        dt_s = (t_ns - self._t_energy_ns) / 1e9
        powers = [abs(power_w)]
        if self._last_power_w is not None:
            powers.append(abs(self._last_power_w))
        expected = sum(powers) / len(powers) * dt_s / self.calibration.joules_per_count()
        if not math.isfinite(expected) or expected < regs.ENERGY_WRAP / 2:
            return counts
        wraps = round((expected - counts) / regs.ENERGY_WRAP)
        if wraps <= 0:
            return counts
        self.stats["wrap_corrections"] += 1
        fixed = counts + wraps * regs.ENERGY_WRAP
        self._event(
            "late",
            f"{dt_s:.1f} s between energy reads: the register wrapped {wraps}× "
            f"(read {counts}, ≈{expected:.0f} counts expected from the mean power); "
            f"counted {fixed}",
        )
        return fixed

    # ---- energy bookkeeping for procedures (meter/driver/calibration_procedures.py) ----------
    @property
    def last_read_clear_t_ns(self) -> int:
        """When the last read-clear read reached the chip."""
        return self._rc_t_ns

    def add_energy_counts(self, counts: int, t_mono_ns: int | None = None) -> None:
        """Count energy a procedure read from ATenergy itself (metered up to `t_mono_ns`)."""
        self._energy_counts += counts
        if t_mono_ns is not None:
            self._t_energy_ns = t_mono_ns

    def close(self) -> None:
        self.bus.close()


def _reported(exc: BusError) -> BusError:
    """Mark an exception whose fault already went out through `on_event`."""
    exc.reported = True
    return exc


def _name(address: int) -> str:
    r = regs.BY_ADDRESS.get(address)
    return f"{r.name} ({address:02X}H)" if r else f"{address:02X}H"


def _hex(word: int | None) -> str:
    return "no answer" if word is None else f"0x{word:04X}"


def _fmt_seen(seen: list) -> str:
    last = seen[-1] if seen else (None, None, None)
    return f"last try: read {_hex(last[0])}, LastData {_hex(last[1])} then {_hex(last[2])}"
