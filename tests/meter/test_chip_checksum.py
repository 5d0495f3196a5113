"""CS1/CS2 against the reference's test vectors (§3), incl. the public drivers' constants."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from meter.chip.checksum import checksum, cs1, cs2

VECTORS = [
    ("CS1 power-on defaults",
     [0x0015, 0xD174, 0, 0, 0, 0, 0x08BD, 0, 0x0AEC, 0, 0x9422], cs1, 0x55CB),
    ("CS2 power-on defaults", [0x6720, 0x7A13, 0x7530] + [0] * 7, cs2, 0x6BB9),
    ("whatnick CS1 (_crc1)",
     [0x00B9, 0xC1F3, 0x1D39, 0, 0, 0, 0x08BD, 0, 0x0AEC, 0, 0x9422], cs1, 0x4A34),
    ("whatnick CS2 (_crc2)", [0xD464, 0x6E49, 0x7530] + [0] * 7, cs2, 0xD294),
    ("ESPHome defaults CS1",
     [0x0015, 0xD174, 7481, 0, 0, 0, 0x08BD, 0, 0x0AEC, 0, 0x9422], cs1, 0x7121),
]


@pytest.mark.parametrize(("label", "words", "fn", "expected"), VECTORS, ids=[v[0] for v in VECTORS])
def test_checksum_vectors(label: str, words: list[int], fn: Callable[[list[int]], int],
                          expected: int) -> None:
    assert fn(words) == expected


def test_checksum_is_sum_low_byte_and_xor_high_byte() -> None:
    assert checksum([0x0102, 0x0304]) == ((1 ^ 2 ^ 3 ^ 4) << 8) | (1 + 2 + 3 + 4)
    assert checksum([0xFFFF, 0xFFFF]) == (0x00 << 8) | ((0xFF * 4) & 0xFF)


def test_checksum_block_sizes_are_enforced() -> None:
    with pytest.raises(ValueError, match="11 registers"):
        cs1([0] * 10)
    with pytest.raises(ValueError, match="10 registers"):
        cs2([0] * 11)
