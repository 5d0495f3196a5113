"""CRC-16/CCITT-FALSE (poly 0x1021, init 0xFFFF, no reflection) of a telemetry line.

Table-driven so that a 150-byte line costs about 150 table look-ups on the MCU. CPython's
`binascii.crc_hqx(data, 0xFFFF)` computes the same function (the tests use it as the peer).
MicroPython subset.
"""

POLY = 0x1021
INIT = 0xFFFF


def _make_table():
    table = []
    for byte in range(256):
        crc = byte << 8
        for _ in range(8):
            if crc & 0x8000:
                crc = ((crc << 1) ^ POLY) & 0xFFFF
            else:
                crc = (crc << 1) & 0xFFFF
        table.append(crc)
    return table


_TABLE = _make_table()


def crc16(data, crc=INIT):
    """CRC of `data` (bytes-like), continuing from `crc`."""
    table = _TABLE
    for b in data:
        crc = ((crc << 8) & 0xFFFF) ^ table[((crc >> 8) ^ b) & 0xFF]
    return crc


def hex4(value):
    """A CRC as the 4 upper-case hex digits a line carries."""
    digits = "0123456789ABCDEF"
    return (
        digits[(value >> 12) & 0xF]
        + digits[(value >> 8) & 0xF]
        + digits[(value >> 4) & 0xF]
        + digits[value & 0xF]
    )


def seal(payload):
    """payload (bytes) -> the whole line: payload + b'*' + CRC hex + b'\\n'."""
    return payload + b"*" + hex4(crc16(payload)).encode() + b"\n"


def unseal(line):
    """The payload of a sealed line, or None when the CRC is missing or wrong."""
    if line.endswith(b"\n"):
        line = line[:-1]
    if line.endswith(b"\r"):
        line = line[:-1]
    if len(line) < 5 or line[-5:-4] != b"*":
        return None
    payload = line[:-5]
    if bytes(line[-4:]) != hex4(crc16(payload)).encode():  # exact digits, upper case
        return None
    return payload
