"""ATM90E26 wire frames: the 24-bit SPI frame and the 0xFE-framed UART transactions.

SPI (datasheet §4.1): R/W bit (1 = read), 7-bit address, 16-bit data, MSB first, exactly 24
clocks with CS low. UART (§4.2): host sends 0xFE, RW_ADDRESS, [MSB, LSB,] checksum; the chip
answers a read with MSB, LSB, (MSB + LSB) mod 256 and a write with the echoed checksum.

Pure functions in the MicroPython subset (the board firmware reuses them).
"""

UART_START = 0xFE
FRAME_BITS = 24


def spi_read_frame(address):
    """MOSI bytes that read register `address`: [0x80 | a, 0, 0]."""
    return bytes([0x80 | (address & 0x7F), 0x00, 0x00])


def spi_write_frame(address, value):
    """MOSI bytes that write `value` to register `address`: [a & 0x7F, MSB, LSB]."""
    return bytes([address & 0x7F, (value >> 8) & 0xFF, value & 0xFF])


def spi_read_value(miso):
    """The 16-bit word in a read frame's MISO bytes (the first byte is don't-care)."""
    if len(miso) != 3:
        raise ValueError(f"an SPI frame is 3 bytes, got {len(miso)}")
    return (miso[1] << 8) | miso[2]


def spi_parse_mosi(mosi):
    """(is_read, address, value) from 3 MOSI bytes."""
    return bool(mosi[0] & 0x80), mosi[0] & 0x7F, (mosi[1] << 8) | mosi[2]


def uart_read_request(address):
    """Host bytes of a UART read: FE, 0x80|a, checksum (= RW_ADDRESS)."""
    rw = 0x80 | (address & 0x7F)
    return bytes([UART_START, rw, rw])


def uart_write_request(address, value):
    """Host bytes of a UART write: FE, a, MSB, LSB, (a + MSB + LSB) mod 256."""
    rw = address & 0x7F
    msb = (value >> 8) & 0xFF
    lsb = value & 0xFF
    return bytes([UART_START, rw, msb, lsb, (rw + msb + lsb) & 0xFF])


def uart_read_reply(value):
    """Chip bytes answering a read: MSB, LSB, (MSB + LSB) mod 256."""
    msb = (value >> 8) & 0xFF
    lsb = value & 0xFF
    return bytes([msb, lsb, (msb + lsb) & 0xFF])


def uart_parse_read_reply(reply):
    """Value from a 3-byte read reply; ValueError on a short reply or a bad checksum."""
    if len(reply) != 3:
        raise ValueError(f"UART read reply needs 3 bytes, got {len(reply)}")
    if (reply[0] + reply[1]) & 0xFF != reply[2]:
        raise ValueError(f"UART read reply checksum mismatch: {bytes(reply).hex()}")
    return (reply[0] << 8) | reply[1]
