"""A read-clear read's sentinel is never 0000H or FFFFH.

The sentinel is the word LastData holds before a read-clear read: LastData still holding it
afterwards means the read never reached the chip, so it may be repeated. A MOSI bit error that
redirects a read to an invalid or empty register leaves 0000H in LastData. With 0000H as the
sentinel (a CalStart read redirected that way, "confirmed" by LastData), an ATenergy read that
did clear the register, followed by a LastData read redirected the same way, looked like a
read that never happened: it was repeated, and the interval's counts were lost without an
event (the bridge's bit-error soak: 0.0072 J recorded where 0.4 J was due, -0.29 % on ch1).
"""

from __future__ import annotations

from meter.chip import registers as regs
from meter.chip.access import VerifiedAccess

INVALID = 0x7E  # an address no register answers: reads 0, and LastData becomes 0


class RedirectingChip:
    """Registers with read-clear energy and LastData; the reads numbered in `redirect` go to an
    invalid register instead (a MOSI bit error in the address)."""

    def __init__(self, redirect: set[int]) -> None:
        self.words = {regs.CAL_START: 0x8765, regs.FUNC_EN: 0x0030, regs.AT_ENERGY: 111}
        self.last_data = 0x1234
        self.redirect = redirect
        self.n = 0
        self.log: list[tuple[int, int]] = []

    def read_word(self, address: int) -> int:
        self.n += 1
        if self.n in self.redirect:
            address = INVALID
        if address == regs.LAST_DATA:
            word = self.last_data
        else:
            word = self.words.get(address, 0)
            if address == regs.AT_ENERGY:
                self.words[address] = 0  # read-clear
            self.last_data = word
        self.log.append((address, word))
        return word

    def write_word(self, address: int, value: int) -> bool:
        return True


def test_a_redirected_lastdata_read_never_throws_cleared_counts_away() -> None:
    # read 1: CalStart, redirected (returns 0, LastData 0); read 2: LastData confirms 0.
    # The ATenergy read then clears 111 counts; the LastData read after it is redirected.
    chip = RedirectingChip(redirect={1})
    access = VerifiedAccess(chip.read_word, chip.write_word, lambda: 0)
    assert access.read(regs.CAL_START) == 0  # "confirmed": LastData agreed
    assert access.ld == 0
    at_energy_read = None

    def read_word(address: int) -> int:
        nonlocal at_energy_read
        if address == regs.AT_ENERGY and at_energy_read is None:
            at_energy_read = chip.n + 1
            chip.redirect.add(chip.n + 2)  # the LastData read right after it
        return chip.read_word(address)

    access.read_word = read_word
    word = access.read_clear(regs.AT_ENERGY)
    # the ATenergy register was read once: its 111 counts are kept for the energy check
    # (the word read, LastData having said otherwise), never lost to a repeated read
    assert [a for a, _ in chip.log].count(regs.AT_ENERGY) == 1
    assert 111 in (word, access.read_clear_other)


def test_a_sentinel_of_zero_is_replaced_by_a_distinctive_word() -> None:
    chip = RedirectingChip(redirect={1})
    access = VerifiedAccess(chip.read_word, chip.write_word, lambda: 0)
    access.read(regs.CAL_START)
    assert access.ensure_sentinel() == 0x8765
