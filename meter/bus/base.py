"""The bus protocol every ATM90E26 transport implements (errors: `meter.errors`).

A bus moves one register access: `read_register(address) -> word` and
`write_register(address, word)`. SPI buses implement only `transfer(frame) -> frame` (one
3-byte, 24-clock frame with chip-select low for exactly that frame) and inherit the register
methods from `SpiFrameBus`; the UART bus implements the register methods directly, since
its transactions carry their own framing and checksums. The driver adds LastData
verification on top, so a bus reports only what it can see itself (timeouts, bad UART
checksums) by raising `meter.errors.BusError`.
"""

from __future__ import annotations

from epi.formats.json_types import JSON
from meter.chip.frames import spi_read_frame, spi_read_value, spi_write_frame

MAX_SPEED_HZ = 160_000  # datasheet §6.1: SPI bit rate 200 bps .. 160 kbps
ABS_MAX_SPEED_HZ = 200_000  # what many public drivers run; above the datasheet maximum


class Bus:
    """Protocol: one ATM90E26 behind some transport."""

    kind = "abstract"

    def read_register(self, address: int) -> int:
        """One verified-by-the-caller register read (abstract: each transport provides it)."""
        raise NotImplementedError(type(self).__name__ + " must implement read_register")

    def write_register(self, address: int, value: int) -> None:
        """One register write (abstract: each transport provides it)."""
        raise NotImplementedError(type(self).__name__ + " must implement write_register")

    def close(self) -> None:
        """Release the transport (idempotent)."""

    def describe(self) -> dict[str, JSON]:
        return {"kind": self.kind}

    def __enter__(self) -> Bus:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class SpiFrameBus(Bus):
    """An SPI bus: subclasses move one 3-byte frame; register access is built on that."""

    kind = "spi"

    def transfer(self, frame: bytes) -> bytes:
        """Move one 24-bit frame, returning the 3 bytes clocked in (abstract)."""
        raise NotImplementedError(type(self).__name__ + " must implement transfer")

    def read_register(self, address: int) -> int:
        return spi_read_value(self.transfer(spi_read_frame(address)))

    def write_register(self, address: int, value: int) -> None:
        self.transfer(spi_write_frame(address, value))


def check_spi_settings(speed_hz: int, mode: int) -> None:
    """Refuse settings the ATM90E26 cannot work with (ValueError with the reason)."""
    if mode != 3:
        raise ValueError(f"SPI mode {mode}: the ATM90E26 needs mode 3 (CPOL=1, CPHA=1)")
    if not 200 <= speed_hz <= ABS_MAX_SPEED_HZ:
        raise ValueError(
            f"SPI speed {speed_hz} Hz: the ATM90E26 is specified for 200 Hz..{MAX_SPEED_HZ} Hz "
            f"(drivers run up to {ABS_MAX_SPEED_HZ} Hz)"
        )
