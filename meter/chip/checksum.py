"""ATM90E26 calibration checksums CS1 (over 21H..2BH) and CS2 (over 31H..3AH).

Datasheet p.33/p.38: low byte = sum of all bytes (high and low byte of every covered register)
mod 256; high byte = XOR of the same bytes. The chip computes this itself and *reads back its
own computation* from CS1/CS2; after CalStart/AdjStart = 8765H it compares it with the value
written and flags CalErr/AdjErr on a mismatch.

MicroPython subset (reused by the board firmware).
"""


def checksum(words):
    """CS of a sequence of 16-bit register words: (XOR of bytes) << 8 | (sum of bytes) & 0xFF."""
    total = 0
    xor = 0
    for w in words:
        hi = (w >> 8) & 0xFF
        lo = w & 0xFF
        total += hi + lo
        xor ^= hi ^ lo
    return (xor << 8) | (total & 0xFF)


def cs1(metering_words):
    """CS1 over the 11 metering registers 21H..2BH (PLconstH .. MMode), in address order."""
    if len(metering_words) != 11:
        raise ValueError(f"CS1 covers 11 registers (21H..2BH), got {len(metering_words)}")
    return checksum(metering_words)


def cs2(measurement_words):
    """CS2 over the 10 measurement-calibration registers 31H..3AH (Ugain .. QoffsetN)."""
    if len(measurement_words) != 10:
        raise ValueError(f"CS2 covers 10 registers (31H..3AH), got {len(measurement_words)}")
    return checksum(measurement_words)
