"""The ATM90E26 access protocol, once: verified access, start-up, one checked reading.

Both the Pi's driver (`meter.driver.atm90e26.ATM90E26Driver`, over a `meter.bus` Bus) and the
board firmware (`meter.firmware.chip.Chip`, over the MCU's SPI) run this code. It does no I/O
of its own: it moves register words through two callables, `read_word(address) -> word or
None` (None: the transport itself saw the access fail, e.g. a UART timeout) and
`write_word(address, word) -> bool` (False: likewise), and reads time from `now()` in ticks
(`ticks_per_s`: 1e9 on the Pi, 1e6 on the MCU). MicroPython subset.

What it guarantees, and how (application note §4.3; docs/atm90e26.md):

- Every access is verified through LastData, read-clear registers are read once with a
  sentinel before them, writes are confirmed (`meter.chip.access.VerifiedAccess`, which
  `Protocol` extends).
- `init_chip()` runs reference §4.1: SoftReset, FuncEn (presence check), SagTh, CalStart
  5678H → PLconstH..MMode → CS1 (read back: the chip's own computation must equal ours),
  AdjStart 5678H → Ugain..QoffsetN → CS2, CalStart/AdjStart 8765H (read back), SysStatus clean.
- Readiness: after start-up the measurement registers read 0 until the chip's first complete
  measurement; a reading begun less than `first_measurement_ticks` after the measurement
  block started is *not ready* (no values), decided from the chip's state, never the values.
- Plausibility (`meter.chip.plausibility`): values outside the channel's ranges or with P ≠
  U·I·PF are re-read once; a second failure raises `ImplausibleReadingError`.
- Classification of the words FuncEn, CalStart, SysStatus: absent (0000H/FFFFH), stuck (one
  word for everything), reset (defaults back), checksum error, unexpected configuration. A
  configuration word that looks wrong is read once more (a bit error must not cost a
  re-initialisation). CalErr/AdjErr are acted on at the FIRST SysStatus read that shows them,
  confirmed by reading CS1/CS2 back (the chip's own computation over the block, against
  ours), never by a second SysStatus read: a chip may clear those bits on read, and metering
  must not stay stopped with frozen registers.
- Energy: ATenergy (absolute active, read-clear, 0.1 pulse per count) is checked against the
  power over the interval (`EnergyAccount.checked_energy`: counts above the hard bound,
  outside what the Pmean before and after the window allow (`meter.chip.energy_window`), or
  equal to another register's word of the reading, are re-read once, which tells a read
  redirected to another register from a genuine one; a genuine one is counted), unwrapped
  after a long gap, and added to `counts`, an int that never wraps — less its reverse part:
  ANenergy (reverse active) is read right after it and kept apart in `reverse_counts`, so
  reverse energy (a CT clamped the wrong way round, or export) is never added as
  consumption; the first reverse counts of an episode send a `reverse_energy` event with the
  fix. This accounting is `meter.chip.energy_account`'s
  `EnergyAccount`, which the protocol owns (`energy`) and reads the chip through.

A fault raises a `meter.chip.errors.BusError` subclass whose `kind` is its event kind. With
`report_faults` the fault is also sent to `on_event` (and marked `reported`); with
`recover_at_once` a reset, checksum error or unexpected configuration is recovered before the
raise (`recovered = True`), else the chip is marked `needs_init` for the caller to re-start.
"""

from meter.chip import plausibility
from meter.chip import registers as regs
from meter.chip.access import ABSENT_WORDS, VerifiedAccess, all_absent, hexword, reg_name
from meter.chip.calibration import EMULATED_FRONTEND
from meter.chip.energy_account import EnergyAccount
from meter.chip.errors import (
    BusError,
    ChecksumError,
    ChipAbsentError,
    ChipResetError,
    ChipStuckError,
    ImplausibleReadingError,
    VerifyError,
)

RESET_FUNC_EN = regs.BY_NAME["FuncEn"].reset
CHECKSUM_ERR_MASK = regs.CAL_ERR_MASK | regs.ADJ_ERR_MASK
PROTOCOL_STATS = ("reinits", "wrap_corrections", "implausible_rereads", "implausible_rejected",
                  "energy_misreads", "energy_rereads", "misreads")


class Protocol(VerifiedAccess):
    """One ATM90E26 behind `read_word`/`write_word` (see the module docstring).

    `measurements` is the tuple of (register name, with LSB extension) a reading reads, in
    order; `quanta` ({name: half a register step}) widens the P = U·I·PF tolerance for values
    read without their extension. `counts` is the cumulative ATenergy count.
    """

    def __init__(self, read_word, write_word, calibration, now, ticks_per_s, measurements,
                 on_event=None, sleep=None, retries=5, reset_settle_ticks=0,
                 first_measurement_ticks=0, limits=None, quanta=None, report_faults=True,
                 recover_at_once=True, unready_measurements=None):
        super().__init__(read_word, write_word, now, retries)
        self.calibration = calibration
        self.ticks_per_s = ticks_per_s
        self.measurements = measurements
        self.on_event = on_event
        self.sleep = sleep
        self.reset_settle_ticks = reset_settle_ticks
        self.first_measurement_ticks = first_measurement_ticks
        self.limits = limits or plausibility.Limits.for_frontend(
            calibration.frontend or EMULATED_FRONTEND)
        self.quanta = quanta
        self.report_faults = report_faults
        self.recover_at_once = recover_at_once
        self.unready_measurements = unready_measurements  # read (and dropped) when not ready
        self.needs_init = True  # type: bool
        self.measuring_since = None  # type: int | None  # when measuring (re)started
        self.energy = EnergyAccount(self)  # the cumulative energy and its checks
        self.rejected = []  # type: list[int]  # words of this reading rejected as misreads
        self.known_words = []  # type: list[int]  # other registers' words of this reading
        for key in PROTOCOL_STATS:
            self.stats[key] = 0

    # ---- the energy account, as the driver and the firmware read and set it ----------------
    @property
    def counts(self):
        # type: () -> int
        return self.energy.counts

    @counts.setter
    def counts(self, value):
        # type: (int) -> None
        self.energy.counts = value

    @property
    def reverse_counts(self):
        # type: () -> int
        return self.energy.reverse_counts

    @reverse_counts.setter
    def reverse_counts(self, value):
        # type: (int) -> None
        self.energy.reverse_counts = value

    @property
    def reverse_carry(self):
        # type: () -> int
        return self.energy.reverse_carry

    @reverse_carry.setter
    def reverse_carry(self, value):
        # type: (int) -> None
        self.energy.reverse_carry = value

    @property
    def t_energy(self):
        # type: () -> int | None
        return self.energy.t_energy

    @t_energy.setter
    def t_energy(self, value):
        # type: (int | None) -> None
        self.energy.t_energy = value

    @property
    def last_power(self):
        # type: () -> float | None
        return self.energy.last_power

    @last_power.setter
    def last_power(self, value):
        # type: (float | None) -> None
        self.energy.last_power = value

    @property
    def unmetered(self):
        # type: () -> list[tuple[int, int, str, float | None]]
        return self.energy.unmetered

    def note_unmetered(self, t_from, t_to, reason):
        # type: (int | None, int | None, str) -> str
        return self.energy.note_unmetered(t_from, t_to, reason)

    # ---- events -----------------------------------------------------------------------------
    def event(self, kind, detail):
        if self.on_event is not None:
            self.on_event(kind, detail)

    def fault(self, exc):
        """Raise `exc`, first sending it out as an event when this protocol reports faults."""
        if self.report_faults:
            self.event(exc.kind, exc.detail)
            exc.reported = True
        raise exc

    def seconds(self, ticks):
        # type: (int) -> float
        return ticks / self.ticks_per_s

    # ---- start-up and calibration -----------------------------------------------------------
    def init_chip(self):
        # type: () -> None
        """SoftReset and load the calibration (reference §4.1); `counts` is kept."""
        self.needs_init = True
        self.measuring_since = None
        self.write_word(regs.SOFT_RESET, regs.SOFT_RESET_CODE)  # a lost one shows below
        self.last_data = 0x0000  # LastData after a reset
        if self.sleep is not None:
            self.sleep(self.reset_settle_ticks)
        cal = self.calibration
        try:
            self.write(regs.FUNC_EN, cal.get("FuncEn"))
        except VerifyError as exc:
            words = [self.read_word(regs.LAST_DATA), self.read_word(regs.FUNC_EN)]
            if all_absent(words):
                raise ChipAbsentError(
                    "no ATM90E26 answers: FuncEn and LastData read %s/%s after writing FuncEn "
                    "(unplugged, unpowered, wrong chip-select or SPI mode)"
                    % (hexword(words[1]), hexword(words[0]))) from exc
            if words[0] is not None and words[0] == words[1]:
                raise ChipStuckError("the chip answers %s to every register and ignores writes"
                                     % hexword(words[0])) from exc
            raise
        self.write(regs.SAG_TH, cal.get("SagTh"))
        self.write_blocks(cal)
        self.measuring_since = self.now()
        self.needs_init = False
        self.stats["reinits"] += 1
        self.energy.restart()  # discard what was metered during the sequence

    def write_blocks(self, cal):
        """CalStart 5678 → metering → CS1; AdjStart 5678 → measurement → CS2; both 8765."""
        blocks = (
            (regs.CAL_START, regs.METERING_ADDRESSES, regs.CS1, cal.cs1()),
            (regs.ADJ_START, regs.MEASUREMENT_CAL_ADDRESSES, regs.CS2, cal.cs2()),
        )
        for start_address, addresses, cs_address, cs_value in blocks:
            self.write(start_address, regs.START_CODE)
            for a in addresses:
                self.write(a, cal.get(regs.BY_ADDRESS[a].name))
            self.write(cs_address, cs_value)
            readback = self.read_checksum(cs_address, cs_value)
            if readback != cs_value:
                raise ChecksumError(
                    "%s: the chip computes 0x%04X over the block just written, we computed "
                    "0x%04X (a write did not land?)" % (regs.BY_ADDRESS[cs_address].name,
                                                        readback, cs_value))
        self.write(regs.CAL_START, regs.CHECK_CODE)
        self.write(regs.ADJ_START, regs.CHECK_CODE)
        # LastData confirms a word, not its address: a write redirected by a bit error (8765H
        # into a gain register) passes it. The start registers must read back 8765H.
        for address in (regs.CAL_START, regs.ADJ_START):
            word = self.read(address)
            if word != regs.CHECK_CODE:
                raise VerifyError("%s reads 0x%04X after writing 8765H (the write went "
                                  "elsewhere?)" % (reg_name(address), word))
        status = self.read_clear(regs.SYS_STATUS)
        if status & CHECKSUM_ERR_MASK:
            raise ChecksumError("SysStatus 0x%04X after the 8765H checks" % status)

    def measurement_ready(self, t):
        # type: (int) -> bool
        """Whether a read begun at `t` sees a complete measurement (not the reset zeros)."""
        since = self.measuring_since
        return (not self.needs_init and since is not None
                and t - since >= self.first_measurement_ticks)

    # ---- one reading ------------------------------------------------------------------------
    def read_measurements(self, spec=None):
        # type: (tuple | None) -> tuple[dict[str, float], list[int]]
        """(values {name: value}, words [register words in read order, LSB after each
        extended one]) of `spec` ((name, extended) pairs; default `measurements`)."""
        values = {}  # type: dict
        words = []  # type: list
        for name, extended in spec or self.measurements:
            r = regs.BY_NAME[name]
            raw = self.read(r.address)
            words.append(raw)
            if extended:
                lsb = self.read(regs.LSB)
                words.append(lsb)
                values[name] = regs.extended_value(r, raw, lsb)
            else:
                values[name] = r.decode(raw)
        return values, words

    def plausible_measurements(self):
        """(values, words, problem): re-read once when the values fail the plausibility
        checks; problem is None, or the reasons of the second failure."""
        values, words = self.read_measurements()
        reasons = plausibility.check_measurements(values, self.limits, self.quanta)
        if not reasons:
            return values, words, None
        # any of its words may be a read a MOSI bit error sent to ATenergy (Pmean 4AH is one
        # bit from 42H): that read cleared the window's counts (`_recovered_counts`)
        self.rejected.extend(words)
        self.stats["implausible_rereads"] += 1
        values, words = self.read_measurements()
        reasons2 = plausibility.check_measurements(values, self.limits, self.quanta)
        if not reasons2:
            self.event("misread", "measurement read rejected (%s); the re-read is consistent"
                       % "; ".join(reasons))
            return values, words, None
        self.stats["implausible_rejected"] += 1
        self.rejected.extend(words)
        return values, words, "; ".join(reasons2)

    def read_sample(self):
        # type: () -> tuple[int, int, int, dict[str, float] | None, list[int] | None]
        """One checked reading: (t_start, status, t_energy, values, words); values and words
        are None for a reading before the chip's first complete measurement. Raises a
        `BusError` subclass on a fault (see the module docstring)."""
        try:
            return self._read_sample()
        except (ChipAbsentError, ChipStuckError):
            self.needs_init = True
            raise

    def _read_sample(self):
        if self.needs_init:
            if self.recover_at_once:
                self.recover("chip not initialised (earlier fault)", None)
            else:
                self.init_chip()
        self.rejected = []
        self.unconfirmed = []
        self.disagreements = 0
        t0 = self.now()
        ready = self.measurement_ready(t0)
        func_en = self.read(regs.FUNC_EN)
        status = self.read_clear(regs.SYS_STATUS)
        values = words = problem = None
        if ready:
            values, words, problem = self.plausible_measurements()
        elif self.unready_measurements:
            self.read_measurements(self.unready_measurements)
        cal_start = self.read(regs.CAL_START)
        counts = self.read_clear(regs.AT_ENERGY)
        t_energy = self.t_read_clear
        status = self.classify(func_en, cal_start, status, counts, t_energy)
        power = apparent = None
        if values is not None and problem is None:
            power = values["Pmean"]
            apparent = values.get("Smean")
        # words a read redirected to another register would return (FuncEn 02H and Pmean
        # 4AH are one MOSI bit from ATenergy 42H): an energy word equal to one is re-read
        self.known_words = [func_en, cal_start, self.calibration.get("FuncEn")] + (words or [])
        self.energy.add_window(counts, t_energy, power, apparent)
        if problem is not None:
            self.fault(ImplausibleReadingError(
                "measurements implausible twice in a row: %s; no reading" % problem))
        return t0, status, t_energy, values, words

    # ---- classification ---------------------------------------------------------------------
    def classify(self, func_en, cal_start, status, counts, t):
        """Raise unless the words read say the chip is in its set state; returns SysStatus."""
        configured = self.calibration.get("FuncEn")
        if func_en != configured or cal_start != regs.CHECK_CODE:
            again = None
            for _ in range(2):  # a second bit error in the re-read must not cost a re-start
                try:
                    again = (self.read(regs.FUNC_EN), self.read(regs.CAL_START))
                except BusError:
                    again = None
                if again is not None and again[0] == configured and again[1] == regs.CHECK_CODE:
                    break
            if again is not None and again[0] == configured and again[1] == regs.CHECK_CODE:
                self.rejected.append(func_en)
                self.rejected.append(cal_start)
                self.stats["misreads"] += 1
                self.event("misread", "FuncEn/CalStart read 0x%04X/0x%04X, then 0x%04X/0x8765 "
                           "at once: a misread, the chip is as configured"
                           % (func_en, cal_start, configured))
                func_en, cal_start = again
        if func_en in ABSENT_WORDS and cal_start in ABSENT_WORDS:
            self.needs_init = True
            self.fault(ChipAbsentError("FuncEn and CalStart read 0x%04X/0x%04X: no chip "
                                       "answers" % (func_en, cal_start)))
        if func_en == cal_start:
            self.needs_init = True
            self.fault(ChipStuckError("every register reads 0x%04X: chip stuck" % func_en))
        if cal_start == regs.POWER_ON_CODE or (
            func_en == RESET_FUNC_EN and configured != RESET_FUNC_EN
        ):
            self.chip_fault(ChipResetError,
                            "chip reset detected (FuncEn 0x%04X, CalStart 0x%04X); energy "
                            "metered since the last read is lost" % (func_en, cal_start),
                            "chip reset", t)
        if status & CHECKSUM_ERR_MASK:
            broken = self.broken_blocks(status)
            if not broken:
                self.stats["misreads"] += 1
                self.event("misread", "SysStatus read 0x%04X (checksum error bits) but CS1/CS2 "
                           "read back as calibrated: a misread, not a checksum error" % status)
                status &= ~CHECKSUM_ERR_MASK
            else:
                # metered before the block stopped (when, is unknown: the interval since the
                # last read is declared unmetered, these counts kept)
                self.counts += counts
                self.chip_fault(ChecksumError, "SysStatus 0x%04X: checksum error in %s"
                                % (status, " and ".join(broken)), "checksum error", t)
        if func_en != configured or cal_start != regs.CHECK_CODE:
            # either word may be a read a MOSI bit error sent to ATenergy (FuncEn 02H is one
            # bit from 42H): it cleared the window's counts and returned them
            self.rejected.append(func_en)
            self.rejected.append(cal_start)
            self.energy.keep_before_fault(counts, t)
            self.chip_fault(BusError, "unexpected FuncEn 0x%04X / CalStart 0x%04X (want 0x%04X "
                            "/ 0x8765)" % (func_en, cal_start, configured),
                            "unexpected configuration", t)
        return status

    def broken_blocks(self, status):
        """The blocks whose CS1/CS2, read back (the chip's own computation), differ from the
        calibration's, of those SysStatus flags; each as 'CS1 ... (what stopped)'."""
        broken = []  # type: list
        checks = (
            (regs.CAL_ERR_MASK, regs.CS1, self.calibration.cs1(), "metering stopped"),
            (regs.ADJ_ERR_MASK, regs.CS2, self.calibration.cs2(), "measurements frozen"),
        )
        for mask, cs_address, ours, what in checks:
            if not status & mask:
                continue
            chip = self.read_checksum(cs_address, ours)
            if chip != ours:
                broken.append("%s (reads %s, calibration 0x%04X: %s)" % (
                    regs.BY_ADDRESS[cs_address].name, hexword(chip), ours, what))
        return broken

    def read_checksum(self, cs_address, ours):
        """CS1/CS2 as the chip computes it (None: unreadable). A word other than ours is read
        once more: a read a MOSI bit error redirected to another register is confirmed by
        LastData all the same, and must not pass for a checksum error."""
        chip = None
        for _ in range(2):
            try:
                chip = self.read(cs_address)
            except BusError:
                chip = None
            if chip == ours:
                return chip
        return chip

    def chip_fault(self, cls, detail, reason, t):
        """A chip not in its set state: recover at once (or mark it for a re-start), then
        raise `cls` (a BusError subclass) with `detail`."""
        self.needs_init = True
        if not self.recover_at_once:
            self.fault(cls(detail))
        if self.report_faults:
            self.event(cls.kind, detail)
        self.recover(reason, t)
        exc = cls(detail + "; re-initialised", True)
        exc.reported = self.report_faults
        raise exc

    def recover(self, reason, t_detected):
        """Re-initialise the chip with the calibration; keep the cumulative energy."""
        t_from = self.t_energy
        self.needs_init = True
        try:
            self.init_chip()
        except ChipAbsentError as exc:
            self.fault(exc)
        except BusError as exc:
            if self.report_faults:
                self.event(exc.kind, "re-initialisation after %s failed: %s" % (reason, exc))
                exc.reported = True
            raise
        note = self.note_unmetered(t_from, self.t_energy, reason)
        self.event("reinit", "re-initialised after %s; %s" % (reason, note))
