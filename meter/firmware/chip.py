"""One ATM90E26 on the MCU's SPI bus: the shared chip protocol over `machine.SPI` + a CS pin.

The protocol — LastData verification, the read-clear sentinel, the start-up sequence,
readiness, plausibility re-reads, checked energy, fault classification (a SysStatus checksum
error acted on at the first read, confirmed by CS1/CS2 read back) — is
`meter.chip.protocol.Protocol`, the same code the Pi's driver runs (docs/atm90e26.md). This
file adds the MCU side: 24-bit frames (`meter.chip.frames`) moved with chip-select low for
exactly one frame, the MCU's microsecond clock, and the firmware's reading format.

A reading reads Pmean with its LSB extension and Urms, Irms, PowerF, Freq without theirs (the
plausibility tolerance widens by half their register steps, `_QUANTA`). `read_sample` returns
(status, energy_t_us, raw) with raw = (Pmean, LSB-after-Pmean, Urms, Irms, PowerF, Freq), or
raw None before the chip's first complete measurement after a start (counts only).

A fault raises `ChipFault` (`meter.chip.errors.BusError`) with `kind` `absent`, `chip_reset`,
`checksum_error`, `bus_error` or `implausible` and `detail`; the caller reports it as an event
and re-starts the chip when `ready` is False. What was rejected and recovered without a fault
goes to `on_event(kind, detail)`. MicroPython subset.
"""

from meter.chip import frames
from meter.chip import registers as regs
from meter.chip.errors import ChipFault
from meter.chip.protocol import Protocol

__all__ = ["Chip", "ChipFault", "decode_raw"]

RETRIES = 3
RESET_SETTLE_US = 1000
FIRST_MEASUREMENT_US = 2000000  # real chips: 2 s after start-up (as the driver waits)
MEASUREMENTS = (("Pmean", True), ("Urms", False), ("Irms", False), ("PowerF", False),
                ("Freq", False))
# half a register step of the values read without their LSB extension (Pmean has it)
_QUANTA = {"Urms": regs.BY_NAME["Urms"].scale / 2, "Irms": regs.BY_NAME["Irms"].scale / 2,
           "PowerF": regs.BY_NAME["PowerF"].scale / 2}


class Chip:
    """The chip behind one chip-select pin. `calibration` is a meter.chip Calibration.

    `now_us()` is the MCU's 64-bit microsecond clock (start-up stamps readiness with it);
    `on_event(kind, detail)` receives what was rejected and recovered without a fault.
    """

    def __init__(self, spi, cs, calibration, sleep_us=None, now_us=None,
                 first_measurement_us=FIRST_MEASUREMENT_US, on_event=None):
        self.spi = spi
        self.cs = cs
        self.now_us = now_us
        self.frames = 0
        self._rx = bytearray(3)
        self.protocol = Protocol(
            self.raw_read, self._write_word, calibration, self._now, 1000000, MEASUREMENTS,
            on_event=on_event, sleep=sleep_us, retries=RETRIES,
            reset_settle_ticks=RESET_SETTLE_US, first_measurement_ticks=int(first_measurement_us),
            quanta=_QUANTA, report_faults=False, recover_at_once=False)
        cs.value(1)

    # ---- state the firmware reads -----------------------------------------------------------
    @property
    def calibration(self):
        return self.protocol.calibration

    @calibration.setter
    def calibration(self, cal):
        self.protocol.calibration = cal

    @property
    def ready(self):
        """Started: the calibration is loaded (see `measurement_ready` for the values)."""
        return not self.protocol.needs_init

    @ready.setter
    def ready(self, ready):
        self.protocol.needs_init = not ready

    @property
    def counts(self):
        """Cumulative ATenergy counts since boot (never wraps)."""
        return self.protocol.counts

    @property
    def stats(self):
        return self.protocol.stats

    @property
    def limits(self):
        return self.protocol.limits

    @property
    def measuring_since(self):
        return self.protocol.measuring_since

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

    def _write_word(self, address, value):
        self.raw_write(address, value)
        return True  # SPI sees no failure itself: LastData tells

    # ---- verified access (the firmware's read/write commands) -------------------------------
    def read(self, address):
        """A register word confirmed by LastData."""
        return self.protocol.read(address)

    def read_clear(self, address):
        """A read-clear register, its value recovered from LastData when the read was
        disturbed (see meter.chip.protocol)."""
        return self.protocol.read_clear(address)

    def write(self, address, value):
        """Write a word and confirm it through LastData."""
        self.protocol.write(address, value)

    # ---- start-up and readings --------------------------------------------------------------
    def start(self):
        """Reset the chip and load the calibration (reference §4.1); counts are kept.

        The chip is ready to read afterwards, its measurements only `first_measurement_us`
        later (`measurement_ready`)."""
        self.protocol.last_power = None
        self.protocol.init_chip()

    def measurement_ready(self, t_us):
        """Whether a read begun at MCU time `t_us` sees a complete measurement (the chip's
        first one after start-up or re-start), not the reset zeros; from the chip's state."""
        return self.protocol.measurement_ready(t_us)

    def _read_raw(self):
        return tuple(self.protocol.read_measurements()[1])

    def read_sample(self, now_us):
        """One reading: (status, energy_t_us, raw), raw None before the chip's first complete
        measurement. `now_us()` stamps the ATenergy read. Raises ChipFault."""
        self.now_us = now_us
        if not self.ready:
            self.start()
        _t0, status, t_energy, _values, words = self.protocol.read_sample()
        return status, t_energy, (tuple(words) if words is not None else None)


def decode_raw(raw):
    """Raw words of `read_sample` -> (power_w, voltage_v, current_a, power_factor, freq_hz)."""
    pmean, lsb, urms, irms, pf, freq = raw
    return (
        regs.extended_value(regs.BY_NAME["Pmean"], pmean, lsb),
        regs.BY_NAME["Urms"].decode(urms),
        regs.BY_NAME["Irms"].decode(irms),
        regs.BY_NAME["PowerF"].decode(pf),
        regs.BY_NAME["Freq"].decode(freq),
    )
