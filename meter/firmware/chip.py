"""One ATM90E26 on the MCU's SPI bus: verified register access, start-up, one reading.

Frames come from `meter.chip.frames` (24 bits, R/W + address + data, MSB first), the
register table and codecs from `meter.chip.registers`, the checksums through
`meter.chip.calibration.Calibration` — the same files the Pi's driver uses.

Verification follows the application note §4.3: a read is confirmed by LastData (06H); a
read-clear register (SysStatus, ATenergy) is never re-read once the chip may have cleared
it, its value is recovered from LastData instead; a write is confirmed by LastData. Energy
(ATenergy, 0.1 pulse per count, cleared on read) is added to `counts`, a Python int that
never wraps. A fault raises `ChipFault(kind, detail)` with kind `absent`, `chip_reset`,
`checksum_error` or `bus_error`; the caller reports it as an event and sends no reading.
MicroPython subset.
"""

from meter.chip import frames
from meter.chip import registers as regs

ABSENT_WORDS = (0x0000, 0xFFFF)
RESET_FUNC_EN = 0x000C  # FuncEn after a reset
RETRIES = 3


class ChipFault(Exception):
    """A reading that failed: `kind` is the trace event kind, `detail` says why."""

    def __init__(self, kind, detail):
        super().__init__(detail)
        self.kind = kind
        self.detail = detail


class Chip:
    """The chip behind one chip-select pin. `calibration` is a meter.chip Calibration."""

    def __init__(self, spi, cs, calibration, sleep_us=None):
        self.spi = spi
        self.cs = cs
        self.calibration = calibration
        self.sleep_us = sleep_us
        self.counts = 0  # cumulative ATenergy counts since boot (never wraps)
        self.ready = False
        self.frames = 0
        self._rx = bytearray(3)
        cs.value(1)

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
        seen = []
        for _ in range(RETRIES):
            v = self.raw_read(address)
            ld = self.raw_read(regs.LAST_DATA)
            if v == ld:
                return v
            if self.raw_read(regs.LAST_DATA) == v:
                return v
            seen.append(v)
        if all(w in ABSENT_WORDS for w in seen):
            raise ChipFault("absent", "0x%02X reads %s: no chip answers" % (address, seen))
        raise ChipFault("bus_error", "0x%02X: read not confirmed by LastData" % address)

    def read_clear(self, address):
        """A read-clear register, its value taken from LastData when the read was disturbed."""
        v = self.raw_read(address)
        ld = self.raw_read(regs.LAST_DATA)
        if v == ld:
            return v
        ld2 = self.raw_read(regs.LAST_DATA)
        if ld2 == ld:
            return ld  # the chip executed the read: LastData holds what it cleared
        raise ChipFault("bus_error", "0x%02X: read-clear value not recoverable" % address)

    def write(self, address, value):
        """Write a word and confirm it through LastData."""
        for _ in range(RETRIES):
            self.raw_write(address, value)
            if self.raw_read(regs.LAST_DATA) == value:
                return
        raise ChipFault("bus_error", "0x%02X <- 0x%04X: write not confirmed" % (address, value))

    # ---- start-up ---------------------------------------------------------------------------
    def start(self):
        """Reset the chip and load the calibration (reference §4.1); counts are kept."""
        self.ready = False
        cal = self.calibration
        self.raw_write(regs.SOFT_RESET, regs.SOFT_RESET_CODE)
        if self.sleep_us is not None:
            self.sleep_us(1000)
        func_en = cal.get("FuncEn")
        self.raw_write(regs.FUNC_EN, func_en)
        ld = self.raw_read(regs.LAST_DATA)
        if ld != func_en:
            if ld in ABSENT_WORDS:
                raise ChipFault("absent", "FuncEn write not echoed (LastData 0x%04X)" % ld)
            raise ChipFault("bus_error", "FuncEn write not echoed (LastData 0x%04X)" % ld)
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
        status = self.read_clear(regs.SYS_STATUS)
        if status & (regs.CAL_ERR_MASK | regs.ADJ_ERR_MASK):
            raise ChipFault("checksum_error", "SysStatus 0x%04X after the 8765H checks" % status)
        self.read_clear(regs.AT_ENERGY)  # discard what was metered during the sequence
        self.ready = True

    # ---- one reading ------------------------------------------------------------------------
    def read_sample(self, now_us):
        """One reading: (status, energy_offset_us, raw) with raw register words.

        raw = (Pmean, LSB-after-Pmean, Urms, Irms, PowerF, Freq). `now_us()` stamps the
        ATenergy read (the moment the cumulative count is valid for). Raises ChipFault.
        """
        if not self.ready:
            self.start()
        func_en = self.read(regs.FUNC_EN)
        status = self.read_clear(regs.SYS_STATUS)
        pmean = self.read(0x4A)
        lsb = self.read(regs.LSB)
        urms = self.read(0x49)
        irms = self.read(0x48)
        pf = self.read(0x4D)
        freq = self.read(0x4C)
        cal_start = self.read(regs.CAL_START)
        energy = self.read_clear(regs.AT_ENERGY)
        t_energy = now_us()
        if func_en in ABSENT_WORDS and cal_start in ABSENT_WORDS:
            self.ready = False
            raise ChipFault("absent", "FuncEn/CalStart read 0x%04X/0x%04X" % (func_en, cal_start))
        configured = self.calibration.get("FuncEn")
        if cal_start == regs.POWER_ON_CODE or (
            func_en == RESET_FUNC_EN and configured != RESET_FUNC_EN
        ):
            self.ready = False
            raise ChipFault(
                "chip_reset",
                "chip reset (FuncEn 0x%04X, CalStart 0x%04X); energy since the last read lost"
                % (func_en, cal_start),
            )
        if status & (regs.CAL_ERR_MASK | regs.ADJ_ERR_MASK):
            self.counts += energy  # metered before the block stopped: real energy
            self.ready = False
            raise ChipFault("checksum_error", "SysStatus 0x%04X: calibration checksum" % status)
        self.counts += energy
        return status, t_energy, (pmean, lsb, urms, irms, pf, freq)


def decode_raw(raw):
    """Raw words of `read_sample` -> (power_w, voltage_v, current_a, power_factor, freq_hz)."""
    pmean, lsb, urms, irms, pf, freq = raw
    return (
        regs.extended_value(regs.BY_ADDRESS[0x4A], pmean, lsb),
        regs.BY_ADDRESS[0x49].decode(urms),
        regs.BY_ADDRESS[0x48].decode(irms),
        regs.BY_ADDRESS[0x4D].decode(pf),
        regs.BY_ADDRESS[0x4C].decode(freq),
    )
