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
  power over the interval (`checked_energy`: counts above the hard bound, outside what the
  Pmean before and after the window allow (`meter.chip.energy_window`), or equal to another
  register's word of the reading, are re-read once, which tells a read redirected to another
  register from a genuine one; a genuine one is counted), unwrapped after a long gap, and
  added to `counts`, an int that never
  wraps — less its reverse part: ANenergy (reverse active) is read right after it and kept
  apart in `reverse_counts`, so reverse energy (a CT clamped the wrong way round, or export)
  is never added as consumption; the first reverse counts of an episode send a
  `reverse_energy` event with the fix.

A fault raises a `meter.chip.errors.BusError` subclass whose `kind` is its event kind. With
`report_faults` the fault is also sent to `on_event` (and marked `reported`); with
`recover_at_once` a reset, checksum error or unexpected configuration is recovered before the
raise (`recovered = True`), else the chip is marked `needs_init` for the caller to re-start.
"""

from meter.chip import energy_window, plausibility
from meter.chip import registers as regs
from meter.chip.access import ABSENT_WORDS, VerifiedAccess, all_absent, hexword, reg_name
from meter.chip.calibration import EMULATED_FRONTEND
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
# ANenergy counts accepted without a negative Pmean (a direction change inside one interval)
REVERSE_SLACK_COUNTS = 2
# windows whose counts wait for a first trusted power to tell their direction
UNDIRECTED_MAX_WINDOWS = 10
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
        self.counts = 0  # type: int  # cumulative forward counts: ATenergy less ANenergy
        self.reverse_counts = 0  # type: int  # cumulative ANenergy counts (reverse active)
        self.reverse_carry = 0  # type: int  # ANenergy read ahead of ATenergy (read later)
        self.reversing = False  # type: bool  # inside a reverse-energy episode
        self.reverse_episode = 0  # type: int  # reverse counts since the episode began
        self.undirected = 0  # type: int  # counts metered before any trusted power
        self.undirected_windows = 0  # type: int  # windows held so (at most the limit)
        self.t_energy = None  # type: int | None  # when the last ATenergy read was
        self.last_power = None  # type: float | None  # W of the last accepted reading
        self.rejected = []  # type: list[int]  # words of this reading rejected as misreads
        self.known_words = []  # type: list[int]  # other registers' words of this reading
        # intervals the chip could not meter: (t_from, t_to, reason, estimate_j or None)
        self.unmetered = []  # type: list[tuple[int, int, str, float | None]]
        for key in PROTOCOL_STATS:
            self.stats[key] = 0

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
        self.read_clear(regs.AT_ENERGY)  # discard what was metered during the sequence
        self.t_energy = self.t_read_clear
        # a discarding read a bit error sent elsewhere clears nothing: the next reading would
        # count the interval just declared unmetered. Read again: a cleared register holds
        # what the few ms since can meter (kept); more, and the first read did not clear
        # (this read's counts are the discarded ones: metering restarts from it)
        again = self.read_clear(regs.AT_ENERGY)
        dt_s = self.seconds(self.t_read_clear - self.t_energy)
        j_per_count = self.calibration.joules_per_count()
        if self.last_power is None:
            residue = plausibility.physical_bound_counts(dt_s, j_per_count, self.limits)
        else:
            residue = energy_window.counts_range(self.last_power, self.last_power, dt_s,
                                                 j_per_count, self.pmean_step_w())[1]
        if again <= residue:
            self.counts += again
        self.t_energy = self.t_read_clear
        self.reverse_carry = 0

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
            readback = self.read(cs_address)
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
        counts = self.checked_energy(counts, t_energy, power, apparent)
        counts = self.unwrap(counts, t_energy, power)
        self.counts += self.split_reverse(counts, t_energy, power)
        self.t_energy = t_energy
        if power is not None:
            self.last_power = power
        if problem is not None:
            self.fault(ImplausibleReadingError(
                "measurements implausible twice in a row: %s; no reading" % problem))
        return t0, status, t_energy, values, words

    # ---- classification ---------------------------------------------------------------------
    def classify(self, func_en, cal_start, status, counts, t):
        """Raise unless the words read say the chip is in its set state; returns SysStatus."""
        configured = self.calibration.get("FuncEn")
        if func_en != configured or cal_start != regs.CHECK_CODE:
            try:
                again = (self.read(regs.FUNC_EN), self.read(regs.CAL_START))
            except BusError:
                again = None
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
            bound = plausibility.physical_bound_counts(
                self.seconds(t - (self.t_energy if self.t_energy is not None else t)),
                self.calibration.joules_per_count(), self.limits)
            if counts <= bound:  # metering ran until now: keep what it counted
                self.counts += counts
                self.t_energy = t
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
            try:
                chip = self.read(cs_address)
            except BusError:
                chip = None
            if chip != ours:
                broken.append("%s (reads %s, calibration 0x%04X: %s)" % (
                    regs.BY_ADDRESS[cs_address].name, hexword(chip), ours, what))
        return broken

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

    def note_unmetered(self, t_from, t_to, reason):
        # type: (int | None, int | None, str) -> str
        if t_from is None or t_to is None or t_to <= t_from:
            return "no metered interval lost"
        dt_s = self.seconds(t_to - t_from)
        p = self.last_power
        est = None if p is None else abs(p) * dt_s
        self.unmetered.append((t_from, t_to, reason, est))
        est_text = "unknown" if est is None else "≈%.3f J at the last power" % est
        return "energy over %.3f s not metered (%s), excluded from energy_j" % (dt_s, est_text)

    # ---- energy -----------------------------------------------------------------------------
    def checked_energy(self, counts, t, power_w, apparent_va):
        """ATenergy counts checked against the power over the interval since the last read.

        A word read and a LastData that disagreed (`read_clear_other`): the one the power
        supports is taken. Counts above what the power allows (with no trusted power: what any
        load in the channel's ranges allows) are re-read at once. A redirected read (a MOSI bit
        error sent it to another register) did not clear ATenergy, so the re-read finds the
        interval's counts still there: those are taken (`misread`). A genuine read found next
        to nothing left: the first word is not believable and is discarded, at the cost of at
        most that interval's energy (`implausible`).
        """
        if self.t_energy is None:
            return counts
        j_per_count = self.calibration.joules_per_count()
        dt_s = self.seconds(t - self.t_energy)
        if power_w is None:
            bound = plausibility.physical_bound_counts(dt_s, j_per_count, self.limits)
        else:
            powers = [power_w, apparent_va or 0.0]
            if self.last_power is not None:
                powers.append(self.last_power)
            bound = plausibility.energy_bound_counts(powers, dt_s, j_per_count, self.limits)
        other = self.read_clear_other
        if other is not None and other != counts and power_w is not None:
            expected = self._expected_counts(power_w, dt_s, j_per_count)
            if abs(other - expected) < abs(counts - expected):
                self.event("misread", "ATenergy read %d but LastData then held %d; %d expected "
                           "from the power: %d counted" % (other, counts, int(expected), other))
                counts, other = other, None
        if counts <= bound:
            if power_w is None and self.last_power is None:
                return counts
            before = self.last_power if self.last_power is not None else power_w
            after = power_w if power_w is not None else before  # no trusted power now
            counts = self._recovered_counts(counts, dt_s, after, j_per_count)
            lo, hi = energy_window.counts_range(before, after, dt_s, j_per_count,
                                                self.pmean_step_w())
            if lo <= counts <= hi and counts not in self.known_words:
                return counts
            power_w = after
            expected = self._expected_counts(power_w, dt_s, j_per_count)
            return self._reread_energy(counts, t, expected, power_w, apparent_va, j_per_count)
        self.stats["energy_misreads"] += 1
        again = self.read_clear(regs.AT_ENERGY)
        residue = plausibility.energy_bound_counts(
            [power_w or 0.0, apparent_va or 0.0], self.seconds(self.t_read_clear - t),
            j_per_count, self.limits)
        first = "ATenergy read %d counts (%.3f J) in %.3f s where the power allows %d" % (
            counts, counts * j_per_count, dt_s, int(bound))
        if again > residue:
            self.event("misread", "%s; the register still held %d counts, so the first read "
                       "did not reach ATenergy: discarded, %d counted" % (first, again, again))
            return again
        if other is not None and other <= bound:
            self.event("misread", "%s; the register read %d but LastData then said %d (a "
                       "redirected LastData read overwrites it): %d counted"
                       % (first, other, counts, other))
            return other + again
        note = self.note_unmetered(self.t_energy, t, "ATenergy word not believable")
        self.event("implausible", "%s; a re-read found %d counts: the register was read, but "
                   "the word is not believable (a load that rose that fast would show in the "
                   "power registers): discarded, %d counted; %s" % (first, again, again, note))
        return again

    def _reread_energy(self, counts, t, expected, power_w, apparent_va, j_per_count):
        """Counts within the bounds but outside what the Pmean before and after the window
        allow (`energy_window`), or equal to another register's word: read ATenergy again.
        Finding the interval's counts still there, the first read went to another register
        (discarded). Finding next to nothing, the register was read: a load that changed
        within the window (the Pmean registers refresh once a measurement cycle, so a drop
        may not show yet): both reads counted, never refused."""
        self.stats["energy_rereads"] += 1
        try:
            again = self.read_clear(regs.AT_ENERGY)
        except BusError:
            return counts  # the re-read itself failed: the first word stands
        residue = plausibility.energy_bound_counts(
            [power_w, apparent_va or 0.0], self.seconds(self.t_read_clear - t), j_per_count,
            self.limits)
        if again <= residue:
            return counts + again
        self.stats["energy_misreads"] += 1
        self.event("misread", "ATenergy read %d counts where the power says %d; the register "
                   "still held %d, so the first read did not reach ATenergy: discarded, %d "
                   "counted" % (counts, int(expected), again, again))
        return again

    def pmean_step_w(self):
        # type: () -> float
        """Half the Pmean register step as read (0 when read with its LSB extension)."""
        return self.quanta.get("Pmean", 0.0) if self.quanta else 0.0

    def _expected_counts(self, power_w, dt_s, j_per_count):
        last = self.last_power if self.last_power is not None else power_w
        return (abs(power_w) + abs(last)) / 2 * dt_s / j_per_count

    def _recovered_counts(self, counts, dt_s, power_w, j_per_count):
        """A read that a MOSI bit error redirected to ATenergy (FuncEn 02H and Pmean 4AH are
        one bit away from 42H) cleared it and returned the counts as a misread word: when the
        counts fall short of the power by about such a word, that word is the missing energy."""
        if power_w is None or not (self.rejected or self.unconfirmed):
            return counts
        expected = self._expected_counts(power_w, dt_s, j_per_count)
        if expected < 20 or counts >= expected / 2:
            return counts
        for w in self.rejected + self.unconfirmed:
            if abs(counts + w - expected) <= expected / 4:
                self.event("misread", "ATenergy read %d counts where the power says %d; a "
                           "misread word of this reading was %d (a read redirected to "
                           "ATenergy clears it): counted" % (counts, int(expected), w))
                return counts + w
        return counts

    def split_reverse(self, counts, t, power_w):
        # type: (int, int, float | None) -> int
        """The forward part of `counts` (absolute, ATenergy read at `t`): ANenergy, read now,
        is the reverse part, kept in `reverse_counts`. ANenergy read a moment after ATenergy
        may hold a few counts ATenergy shows next time: carried over, so totals stay exact.

        ANenergy is read only when Pmean was negative in this reading or the last (or counts
        are carried over): a forward-only channel reads exactly what it read before. Reverse
        flow that never turns a reading's Pmean negative stays in ANenergy until one does, and
        is then bounded below. A word above the absolute counts plus what the power allows
        since is a misread (ignored: the sign of Pmean decides); so is a failed read."""
        j_per_count = self.calibration.joules_per_count()
        negative = power_w is not None and power_w < 0
        if (power_w is None and self.last_power is None
                and self.undirected_windows < UNDIRECTED_MAX_WINDOWS):
            # direction unknown (no trusted power now nor before: the first windows after
            # start while the chip is not ready): held, not counted either way, until a
            # trusted power says which way (ANenergy keeps accumulating meanwhile, so the
            # split below then covers these windows too; no extra bus traffic). A channel
            # whose power is never trusted gets its counts back as before, a few windows late.
            self.undirected += counts
            self.undirected_windows += 1
            return 0
        counts += self.undirected
        self.undirected = 0
        may_reverse = negative or (self.last_power is not None and self.last_power < 0)
        if not may_reverse and not self.reverse_carry:
            # forward power now and before: ANenergy is not read (the bus traffic of a
            # forward-only channel stays as it was); what it holds waits for a negative Pmean
            return counts
        try:
            reverse = self.read_clear(regs.AN_ENERGY)
        except BusError:
            reverse = counts if negative else 0
        else:
            room = plausibility.physical_bound_counts(self.seconds(self.t_read_clear - t),
                                                      j_per_count, self.limits)
            if reverse > counts + room:
                self.stats["energy_misreads"] += 1
                self.event("misread", "ANenergy read %d counts (absolute %d, Pmean %s): not "
                           "the reverse register's word; %s" % (
                               reverse, counts, "-" if power_w is None else "%.3f" % power_w,
                               "all reverse" if negative else "none counted as reverse"))
                reverse = counts if negative else 0
        reverse += self.reverse_carry
        used = reverse if reverse < counts else counts
        self.reverse_carry = reverse - used
        self.reverse_counts += used
        self.reverse_episode += used
        if self.reverse_episode > REVERSE_SLACK_COUNTS and not self.reversing:
            # the episode's counts, not one window's: at 20 Hz on a coarse meter constant a
            # window holds fewer counts than the slack, and the event never came
            self.reversing = True
            seen = self.reverse_episode
            self.event("reverse_energy", "%d counts (%.3f J) of REVERSE active energy "
                       "(ANenergy): the CT is clamped the wrong way round, or this node exports "
                       "energy. Not counted as consumption. Fix: turn the clamp round (its arrow "
                       "pointing at the load) and restart the run" % (seen, seen * j_per_count))
        elif not used and not negative:
            self.reversing = False
            self.reverse_episode = 0
        return counts - used

    def unwrap(self, counts, t, power_w):
        """Add whole register wraps that a long gap between reads can hide."""
        if self.t_energy is None or power_w is None:
            return counts
        dt_s = self.seconds(t - self.t_energy)
        expected = self._expected_counts(power_w, dt_s, self.calibration.joules_per_count())
        if not expected < 1e300 or expected < regs.ENERGY_WRAP / 2:  # not finite, or no wrap
            return counts
        wraps = round((expected - counts) / regs.ENERGY_WRAP)
        if wraps <= 0:
            return counts
        self.stats["wrap_corrections"] += 1
        fixed = counts + wraps * regs.ENERGY_WRAP
        self.event("late", "%.1f s between energy reads: the register wrapped %d× (read %d, "
                   "≈%d counts expected from the mean power); counted %d"
                   % (dt_s, wraps, counts, int(expected), fixed))
        return fixed
