"""One ATM90E26 on the MCU's SPI bus: verified register access, start-up, one checked reading.

Frames come from `meter.chip.frames` (24 bits, R/W + address + data, MSB first), the
register table and codecs from `meter.chip.registers`, the checksums through
`meter.chip.calibration.Calibration`, the plausibility rules from `meter.chip.plausibility`
— the same files the Pi's direct-SPI driver uses.

Verification follows the application note §4.3: a read is confirmed by LastData (06H); a
read-clear register (SysStatus, ATenergy) is never re-read once the chip may have cleared
it, its value is recovered from LastData instead. Every read-clear read follows a verified
access whose word is known (the *sentinel*): LastData still holding it means the frame never
reached the chip (a cut frame), so the read may be repeated. A write is confirmed by LastData.
Energy (ATenergy, 0.1 pulse per count, cleared on read) is added to `counts`, a Python int
that never wraps.

Readiness (as the driver's `measurement_ready`): after start-up or a re-start the chip's
measurement registers read 0 until its first complete measurement; a reading begun less than
`first_measurement_us` after the calibration was loaded is *not ready*: `read_sample` returns
its counts with no values (`raw` None), decided from the chip's state, never from the values.

Plausibility (meter.chip.plausibility): the values must be in the channel's physical ranges
and P must equal U·I·PF; a failure is re-read once (a refresh straddled between two register
reads, or a read a bit error redirected, passes the second time: reported through `on_event`
as `misread`, the reading kept), a second failure raises ChipFault("implausible", reasons).
The ATenergy word is checked against the power over the interval and re-read when it cannot
be right.

A fault raises `ChipFault(kind, detail)` with kind `absent`, `chip_reset`, `checksum_error`,
`bus_error` or `implausible`; the caller reports it as an event and sends no reading.
MicroPython subset.
"""

from meter.chip import frames, plausibility
from meter.chip import registers as regs
from meter.chip.calibration import EMULATED_FRONTEND

ABSENT_WORDS = (0x0000, 0xFFFF)
RESET_FUNC_EN = 0x000C  # FuncEn after a reset
RETRIES = 3
FIRST_MEASUREMENT_US = 2000000  # real chips: 2 s after start-up (as the driver waits)
_PMEAN, _URMS, _IRMS, _POWERF, _FREQ = 0x4A, 0x49, 0x48, 0x4D, 0x4C
# half a register step of the values read without their LSB extension (Pmean has it)
_QUANTA = {"Urms": regs.BY_ADDRESS[_URMS].scale / 2, "Irms": regs.BY_ADDRESS[_IRMS].scale / 2,
           "PowerF": regs.BY_ADDRESS[_POWERF].scale / 2}


class ChipFault(Exception):
    """A reading that failed: `kind` is the trace event kind, `detail` says why."""

    def __init__(self, kind, detail):
        super().__init__(detail)
        self.kind = kind
        self.detail = detail


class Chip:
    """The chip behind one chip-select pin. `calibration` is a meter.chip Calibration.

    `now_us()` is the MCU's 64-bit microsecond clock (start-up stamps readiness with it);
    `on_event(kind, detail)` receives what was rejected and recovered without a fault.
    """

    def __init__(self, spi, cs, calibration, sleep_us=None, now_us=None,
                 first_measurement_us=FIRST_MEASUREMENT_US, on_event=None):
        self.spi = spi
        self.cs = cs
        self.calibration = calibration
        self.sleep_us = sleep_us
        self.now_us = now_us
        self.first_measurement_us = int(first_measurement_us)
        self.on_event = on_event
        self.counts = 0  # cumulative ATenergy counts since boot (never wraps)
        self.ready = False  # started (calibration loaded); see measurement_ready()
        self.measuring_since = None  # MCU µs when the measurement block started
        self.frames = 0
        self.stats = {"implausible_rereads": 0, "implausible_rejected": 0,
                      "energy_misreads": 0, "misreads": 0}
        self._ld = None  # the word LastData holds after our last verified access
        self._t_energy = None  # MCU µs of the last ATenergy read
        self._last_power = None  # W of the last accepted reading
        self._rejected = []  # type: list  # words of this reading rejected as misreads
        self._rx = bytearray(3)
        self.limits = plausibility.Limits.for_frontend(calibration.frontend or EMULATED_FRONTEND)
        cs.value(1)

    def _notify(self, kind, detail):
        if self.on_event is not None:
            self.on_event(kind, detail)

    def _now(self):
        return self.now_us() if self.now_us is not None else 0

    # ---- frames -----------------------------------------------------------------------------
    def _xfer(self, mosi):
        self.frames += 1
        self.cs.value(0)
        try:
            self.spi.write_readinto(mosi, self._rx)
        finally:
            self.cs.value(1)
        return (self._rx[1] << 8) | self._rx[2]

    def raw_read(self, address):
        return self._xfer(frames.spi_read_frame(address))

    def raw_write(self, address, value):
        self._xfer(frames.spi_write_frame(address, value))

    # ---- verified access --------------------------------------------------------------------
    def read(self, address):
        """A register word confirmed by LastData."""
        seen = []  # type: list
        for _ in range(RETRIES):
            v = self.raw_read(address)
            ld = self.raw_read(regs.LAST_DATA)
            if v == ld or self.raw_read(regs.LAST_DATA) == v:
                self._ld = v
                return v
            seen.append(v)
        self._ld = None
        if all(w in ABSENT_WORDS for w in seen):
            raise ChipFault("absent", "0x%02X reads %s: no chip answers" % (address, seen))
        raise ChipFault("bus_error", "0x%02X: read not confirmed by LastData" % address)

    def read_clear(self, address):
        """A read-clear register, its value taken from LastData when the read was disturbed;
        repeated only when LastData proves the chip never executed it (sentinel)."""
        if self._ld is None:
            self.read(regs.CAL_START)
        sentinel = self._ld
        v = None
        seen = []  # type: list
        for _ in range(RETRIES):
            v = self.raw_read(address)
            seen = []
            executed = True
            for _ in range(RETRIES + 1):
                ld = self.raw_read(regs.LAST_DATA)
                if ld == v:
                    self._ld = v
                    return v
                if ld in seen:  # LastData is stable at ld
                    if ld == sentinel:
                        executed = False  # the frame never reached the chip: nothing cleared
                        break
                    self._ld = ld  # the chip executed the read: LastData holds what it cleared
                    return ld
                seen.append(ld)
            if executed:
                break  # LastData never settled: the cleared value is unknowable
        self._ld = None
        if v in ABSENT_WORDS and all(w in ABSENT_WORDS for w in seen):
            raise ChipFault("absent", "0x%02X reads 0x%04X: no chip answers" % (address, v))
        raise ChipFault("bus_error", "0x%02X: read-clear value not recoverable" % address)

    def write(self, address, value):
        """Write a word and confirm it through LastData."""
        for _ in range(RETRIES):
            self.raw_write(address, value)
            if self.raw_read(regs.LAST_DATA) == value:
                self._ld = value
                return
        self._ld = None
        raise ChipFault("bus_error", "0x%02X <- 0x%04X: write not confirmed" % (address, value))

    # ---- start-up ---------------------------------------------------------------------------
    def start(self):
        """Reset the chip and load the calibration (reference §4.1); counts are kept.

        The chip is ready to read afterwards, its measurements only `first_measurement_us`
        later (`measurement_ready`)."""
        self.ready = False
        self.measuring_since = None
        cal = self.calibration
        self.limits = plausibility.Limits.for_frontend(cal.frontend or EMULATED_FRONTEND)
        self.raw_write(regs.SOFT_RESET, regs.SOFT_RESET_CODE)
        self._ld = 0x0000  # LastData after a reset
        if self.sleep_us is not None:
            self.sleep_us(1000)
        func_en = cal.get("FuncEn")
        self.raw_write(regs.FUNC_EN, func_en)
        ld = self.raw_read(regs.LAST_DATA)
        if ld != func_en:
            if ld in ABSENT_WORDS:
                raise ChipFault("absent", "FuncEn write not echoed (LastData 0x%04X)" % ld)
            raise ChipFault("bus_error", "FuncEn write not echoed (LastData 0x%04X)" % ld)
        self._ld = func_en
        self.write(regs.SAG_TH, cal.get("SagTh"))
        blocks = (
            (regs.CAL_START, regs.METERING_ADDRESSES, regs.CS1, cal.cs1()),
            (regs.ADJ_START, regs.MEASUREMENT_CAL_ADDRESSES, regs.CS2, cal.cs2()),
        )
        for start, addresses, cs_address, cs_value in blocks:
            self.write(start, regs.START_CODE)
            for a in addresses:
                self.write(a, cal.get(regs.BY_ADDRESS[a].name))
            self.write(cs_address, cs_value)
        self.write(regs.CAL_START, regs.CHECK_CODE)
        self.write(regs.ADJ_START, regs.CHECK_CODE)
        for address in (regs.CAL_START, regs.ADJ_START):  # a redirected write passes LastData
            word = self.read(address)
            if word != regs.CHECK_CODE:
                raise ChipFault("bus_error", "0x%02X reads 0x%04X after writing 8765H"
                                % (address, word))
        status = self.read_clear(regs.SYS_STATUS)
        if status & (regs.CAL_ERR_MASK | regs.ADJ_ERR_MASK):
            raise ChipFault("checksum_error", "SysStatus 0x%04X after the 8765H checks" % status)
        self.measuring_since = self._now()
        self.read_clear(regs.AT_ENERGY)  # discard what was metered during the sequence
        self._t_energy = self._now()
        self._last_power = None
        self.ready = True

    def measurement_ready(self, t_us):
        """Whether a read begun at MCU time `t_us` sees a complete measurement (the chip's
        first one after start-up or re-start), not the reset zeros; from the chip's state."""
        since = self.measuring_since
        return self.ready and since is not None and t_us - since >= self.first_measurement_us

    # ---- one reading ------------------------------------------------------------------------
    def _read_raw(self):
        pmean = self.read(_PMEAN)
        lsb = self.read(regs.LSB)  # the LSB latch of the Pmean read just before
        return (pmean, lsb, self.read(_URMS), self.read(_IRMS), self.read(_POWERF),
                self.read(_FREQ))

    def _plausible_raw(self):
        """(raw, power_w, problem): the measurement words, re-read once when they fail the
        plausibility checks; problem is None, or the reasons of the second failure."""
        raw = self._read_raw()
        reasons = plausibility.check_measurements(_values(raw), self.limits, _QUANTA)
        if not reasons:
            return raw, decode_raw(raw)[0], None
        self._rejected.append(raw[0])
        self.stats["implausible_rereads"] += 1
        again = self._read_raw()
        reasons2 = plausibility.check_measurements(_values(again), self.limits, _QUANTA)
        if not reasons2:
            self._notify("misread", "measurement read rejected (%s); the re-read is "
                         "consistent" % "; ".join(reasons))
            return again, decode_raw(again)[0], None
        self.stats["implausible_rejected"] += 1
        return again, None, "; ".join(reasons2)

    def read_sample(self, now_us):
        """One reading: (status, energy_t_us, raw) with raw register words, or raw None for a
        reading before the chip's first complete measurement (counts only).

        raw = (Pmean, LSB-after-Pmean, Urms, Irms, PowerF, Freq). `now_us()` stamps the
        ATenergy read (the moment the cumulative count is valid for). Raises ChipFault.
        """
        if not self.ready:
            self.start()
        self._rejected = []
        ready = self.measurement_ready(now_us())
        func_en = self.read(regs.FUNC_EN)
        status = self.read_clear(regs.SYS_STATUS)
        power = problem = None
        if ready:
            raw, power, problem = self._plausible_raw()
        else:
            raw = None
        cal_start = self.read(regs.CAL_START)
        energy = self.read_clear(regs.AT_ENERGY)
        t_energy = now_us()
        status = self._classify(func_en, cal_start, status, energy, t_energy)
        energy = self._checked_energy(energy, t_energy, power, now_us)
        self.counts += energy
        self._t_energy = t_energy
        if power is not None:
            self._last_power = power
        if problem is not None:
            raise ChipFault("implausible", "measurements implausible twice in a row: %s; "
                            "no reading" % problem)
        return status, t_energy, raw

    def _classify(self, func_en, cal_start, status, energy, t_energy):
        """Raise ChipFault (and mark the chip for a re-start) unless the chip is in its set
        state; a configuration or status word that looks wrong is read once more first (a
        bit error on one read must not cost a re-start). Returns SysStatus."""
        configured = self.calibration.get("FuncEn")
        if func_en != configured or cal_start != regs.CHECK_CODE:
            try:
                again = (self.read(regs.FUNC_EN), self.read(regs.CAL_START))
            except ChipFault:
                again = None
            if again is not None and again[0] == configured and again[1] == regs.CHECK_CODE:
                self._rejected.append(func_en)
                self._rejected.append(cal_start)
                self.stats["misreads"] += 1
                self._notify("misread", "FuncEn/CalStart read 0x%04X/0x%04X, then "
                             "0x%04X/0x8765 at once: a misread, the chip is as configured"
                             % (func_en, cal_start, configured))
                func_en, cal_start = again
        if func_en in ABSENT_WORDS and cal_start in ABSENT_WORDS:
            self.ready = False
            raise ChipFault("absent", "FuncEn/CalStart read 0x%04X/0x%04X" % (func_en, cal_start))
        if cal_start == regs.POWER_ON_CODE or (
            func_en == RESET_FUNC_EN and configured != RESET_FUNC_EN
        ):
            self.ready = False
            raise ChipFault(
                "chip_reset",
                "chip reset (FuncEn 0x%04X, CalStart 0x%04X); energy since the last read lost"
                % (func_en, cal_start),
            )
        if func_en == cal_start:
            self.ready = False
            raise ChipFault("bus_error", "every register reads 0x%04X: chip stuck" % func_en)
        err_bits = regs.CAL_ERR_MASK | regs.ADJ_ERR_MASK
        if status & err_bits:  # level bits: a second read tells a misread from an error
            again = self.read_clear(regs.SYS_STATUS)
            if not again & err_bits:
                self.stats["misreads"] += 1
                self._notify("misread", "SysStatus read 0x%04X (checksum error bits) but "
                             "0x%04X at once after: a misread" % (status, again))
            status = again
        if status & err_bits:
            self.counts += energy  # metered before the block stopped: real energy
            self._t_energy = t_energy
            self.ready = False
            raise ChipFault("checksum_error", "SysStatus 0x%04X: calibration checksum" % status)
        if func_en != configured or cal_start != regs.CHECK_CODE:
            jpc = self.calibration.joules_per_count()
            dt_s = (t_energy - (self._t_energy or t_energy)) / 1e6
            if energy <= plausibility.physical_bound_counts(dt_s, jpc, self.limits):
                self.counts += energy  # metering ran until now: keep what it counted
                self._t_energy = t_energy
            self.ready = False
            raise ChipFault("bus_error", "unexpected FuncEn 0x%04X / CalStart 0x%04X (want "
                            "0x%04X / 0x8765); re-starting" % (func_en, cal_start, configured))
        return status

    def _checked_energy(self, counts, t_us, power_w, now_us):
        """ATenergy counts checked against the power over the interval since the last read.

        Counts above what the power allows (or, with no trusted power, what any load in the
        channel's ranges allows) are re-read at once. A redirected read (a MOSI bit error
        sent it to another register) did not clear ATenergy: the re-read finds the interval's
        counts, which are taken. A genuine read found next to nothing left: the first word is
        not believable, it is discarded (at most that interval's energy is lost): an
        `implausible` event. Where the counts taken are exact the event is a `misread`.
        """
        if self._t_energy is None:
            return counts
        jpc = self.calibration.joules_per_count()
        dt_s = (t_us - self._t_energy) / 1e6
        if power_w is None:
            bound = plausibility.physical_bound_counts(dt_s, jpc, self.limits)
        else:
            powers = [power_w]
            if self._last_power is not None:
                powers.append(self._last_power)
            bound = plausibility.energy_bound_counts(powers, dt_s, jpc, self.limits)
        if counts <= bound:
            return self._recovered_counts(counts, dt_s, power_w, jpc)
        self.stats["energy_misreads"] += 1
        again = self.read_clear(regs.AT_ENERGY)
        residue = plausibility.energy_bound_counts([power_w or 0.0], (now_us() - t_us) / 1e6,
                                                   jpc, self.limits)
        first = "ATenergy read %d counts in %.3f s where the power allows %d" % (
            counts, dt_s, int(bound))
        if again > residue:
            self._notify("misread", "%s; the register still held %d counts, so the first "
                         "read did not reach ATenergy: discarded, %d counted"
                         % (first, again, again))
        else:
            self._notify("implausible", "%s; a re-read found %d: the word is not believable: "
                         "discarded, %d counted (at most this interval's energy is lost)"
                         % (first, again, again))
        return again


    def _recovered_counts(self, counts, dt_s, power_w, jpc):
        """A read that a MOSI bit error redirected to ATenergy (FuncEn 02H and Pmean 4AH are
        one bit away from 42H) cleared it and returned the counts as a misread word: when the
        counts fall short of the power by about such a word, that word is the missing energy."""
        if power_w is None or not self._rejected:
            return counts
        last = self._last_power if self._last_power is not None else power_w
        expected = (abs(power_w) + abs(last)) / 2 * dt_s / jpc
        if expected < 20 or counts >= expected / 2:
            return counts
        for w in self._rejected:
            if abs(counts + w - expected) <= expected / 4:
                self._notify("misread", "ATenergy read %d counts where the power says %d; "
                             "a misread word of this reading was %d (a read redirected to "
                             "ATenergy clears it): counted" % (counts, int(expected), w))
                return counts + w
        return counts


def _values(raw):
    p, u, i, pf, f = decode_raw(raw)
    return {"Pmean": p, "Urms": u, "Irms": i, "PowerF": pf, "Freq": f}


def decode_raw(raw):
    """Raw words of `read_sample` -> (power_w, voltage_v, current_a, power_factor, freq_hz)."""
    pmean, lsb, urms, irms, pf, freq = raw
    return (
        regs.extended_value(regs.BY_ADDRESS[_PMEAN], pmean, lsb),
        regs.BY_ADDRESS[_URMS].decode(urms),
        regs.BY_ADDRESS[_IRMS].decode(irms),
        regs.BY_ADDRESS[_POWERF].decode(pf),
        regs.BY_ADDRESS[_FREQ].decode(freq),
    )
