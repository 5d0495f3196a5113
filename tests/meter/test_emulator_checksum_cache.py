"""The emulator's cached CS1/CS2 (meter/emulation/register_file.py: summing the covered bytes
on every register access was about a quarter of a simulated sampler run) gives the verdicts an
uncached chip gives, whatever changes the covered registers: SPI writes, the CalStart/AdjStart
5678H block reset, soft reset, a reset fault (now or scheduled), unplugging, an injected upset,
a direct edit of the register words.

Expected checksums come from outside the code under test: the datasheet formula re-written
here (`_datasheet_cs`, DS p.33/p.38: low byte the sum, high byte the XOR of the covered
bytes) and the chip's test vectors (docs/atm90e26.md, "Test vectors": power-on defaults
0x55CB / 0x6BB9; the whatnick calibration 0x4A34 / 0xD294)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from meter.chip import registers as regs
from meter.chip.frames import spi_read_frame, spi_read_value, spi_write_frame
from meter.clock import SimulatedClock
from meter.emulation.chip_emulator import EmulatedChip
from meter.emulation.power_models import ConstantPower

MS = 1_000_000
DEFAULT_CS = {regs.CS1: 0x55CB, regs.CS2: 0x6BB9}
# whatnick's calibration and its checksums (the library's hard-coded _crc1/_crc2)
WHATNICK_WORDS = {
    regs.CS1: (0x00B9, 0xC1F3, 0x1D39, 0, 0, 0, 0x08BD, 0, 0x0AEC, 0, 0x9422),
    regs.CS2: (0xD464, 0x6E49, 0x7530, 0, 0, 0, 0, 0, 0, 0),
}
WHATNICK_CS = {regs.CS1: 0x4A34, regs.CS2: 0xD294}
COVERED = {regs.CS1: regs.METERING_ADDRESSES, regs.CS2: regs.MEASUREMENT_CAL_ADDRESSES}
START = {regs.CS1: regs.CAL_START, regs.CS2: regs.ADJ_START}
ERR_MASK = {regs.CS1: regs.CAL_ERR_MASK, regs.CS2: regs.ADJ_ERR_MASK}


def _datasheet_cs(words: list[int]) -> int:
    data = [b for w in words for b in (w >> 8, w & 0xFF)]
    xor = 0
    for b in data:
        xor ^= b
    return (xor << 8) | (sum(data) % 256)


class _UncachedChip(EmulatedChip):
    """The emulator with CS1/CS2 recomputed (by the datasheet formula) at every use."""

    def _computed_cs(self, address: int) -> int:
        return _datasheet_cs([self._regs[a] for a in COVERED[address]])


def _rd(chip: EmulatedChip, address: int) -> int:
    return spi_read_value(chip.spi_transfer(spi_read_frame(address)))


def _wr(chip: EmulatedChip, address: int, value: int) -> None:
    chip.spi_transfer(spi_write_frame(address, value))


def _words(chip: EmulatedChip, cs: int) -> list[int]:
    return [chip.peek(a) for a in COVERED[cs]]


def _seal(chip: EmulatedChip, cs: int) -> None:
    """Write the right checksum of the block as it is, then start the 8765H check."""
    _wr(chip, cs, _datasheet_cs(_words(chip, cs)))
    _wr(chip, START[cs], regs.CHECK_CODE)


def _whatnick_chip() -> EmulatedChip:
    """A chip loaded with the whatnick calibration over SPI, both blocks checked OK, and its
    checksums read (so the cache holds them)."""
    chip = EmulatedChip(ConstantPower(10.0), SimulatedClock())
    for cs, words in WHATNICK_WORDS.items():
        _wr(chip, START[cs], regs.START_CODE)
        for address, word in zip(COVERED[cs], words, strict=True):
            _wr(chip, address, word)
        assert _rd(chip, cs) == WHATNICK_CS[cs]
        _wr(chip, cs, WHATNICK_CS[cs])
        _wr(chip, START[cs], regs.CHECK_CODE)
    assert _rd(chip, regs.SYS_STATUS) == 0
    return chip


def _schedule_reset(chip: EmulatedChip) -> None:
    chip.schedule_reset(chip.now_ns() + 5 * MS)
    assert isinstance(chip.clock, SimulatedClock)
    chip.clock.advance(6 * MS)


def _unplug(chip: EmulatedChip) -> None:
    chip.set_absent(True)
    chip.set_absent(False)


# Paths that bring every register back to its power-on value: CS1/CS2 read the defaults'.
RESETS: dict[str, Callable[[EmulatedChip], None]] = {
    "soft-reset-over-spi": lambda chip: _wr(chip, regs.SOFT_RESET, regs.SOFT_RESET_CODE),
    "reset-fault-now": EmulatedChip.reset_now,
    "reset-fault-scheduled": _schedule_reset,
    "unplugged-and-back": _unplug,
}


@pytest.mark.parametrize("path", RESETS.values(), ids=RESETS.keys())
def test_after_a_reset_the_checksums_are_the_power_on_ones(
        path: Callable[[EmulatedChip], None]) -> None:
    chip = _whatnick_chip()
    path(chip)
    for cs in (regs.CS1, regs.CS2):
        assert _rd(chip, cs) == DEFAULT_CS[cs]
        _wr(chip, cs, DEFAULT_CS[cs])  # the defaults' checksum now passes the check
        _wr(chip, START[cs], regs.CHECK_CODE)
    assert _rd(chip, regs.SYS_STATUS) & (regs.CAL_ERR_MASK | regs.ADJ_ERR_MASK) == 0
    assert chip.cal_state == chip.adj_state == "checked"


@pytest.mark.parametrize("cs", [regs.CS1, regs.CS2], ids=["CS1", "CS2"])
def test_a_5678_start_resets_the_block_and_its_checksum(cs: int) -> None:
    chip = _whatnick_chip()
    _wr(chip, START[cs], regs.START_CODE)
    assert _rd(chip, cs) == DEFAULT_CS[cs]
    other = regs.CS2 if cs == regs.CS1 else regs.CS1
    assert _rd(chip, other) == WHATNICK_CS[other]  # the other block is untouched


def _spi_write(chip: EmulatedChip, address: int) -> None:
    _wr(chip, address, chip.peek(address) ^ 0x0001)


def _upset(chip: EmulatedChip, address: int) -> None:
    chip.corrupt_register(regs.BY_ADDRESS[address].name, 0x0001)


def _direct_edit(chip: EmulatedChip, address: int) -> None:
    chip._regs[address] ^= 0x0001  # what any emulator code assigning a word does


CHANGES: dict[str, Callable[[EmulatedChip, int], None]] = {
    "spi-write": _spi_write, "upset-fault": _upset, "direct-edit": _direct_edit,
}


@pytest.mark.parametrize("change", CHANGES.values(), ids=CHANGES.keys())
@pytest.mark.parametrize("cs", [regs.CS1, regs.CS2], ids=["CS1", "CS2"])
def test_a_changed_covered_register_changes_the_checksum_and_fails_the_running_check(
        cs: int, change: Callable[[EmulatedChip, int], None]) -> None:
    chip = _whatnick_chip()
    for address in COVERED[cs]:
        words = _words(chip, cs)
        assert _rd(chip, cs) == _datasheet_cs(words)  # cached now
        change(chip, address)
        changed = _words(chip, cs)
        assert changed != words
        assert _rd(chip, cs) == _datasheet_cs(changed) != _datasheet_cs(words), hex(address)
        status = _rd(chip, regs.SYS_STATUS)
        assert status & ERR_MASK[cs] == ERR_MASK[cs], hex(address)  # the check noticed
        _seal(chip, cs)  # re-sealed on the new words: the check passes again
        assert _rd(chip, regs.SYS_STATUS) & ERR_MASK[cs] == 0


# ---- cached and uncached chips agree on any sequence --------------------------------------
_ADDRESSES = (*regs.METERING_ADDRESSES, *regs.MEASUREMENT_CAL_ADDRESSES, regs.CS1, regs.CS2,
              regs.FUNC_EN, regs.SAG_TH, regs.SMALL_P_MOD)
_CODES = st.sampled_from([regs.START_CODE, regs.CHECK_CODE, regs.POWER_ON_CODE, 0x1234])
_WORD = st.integers(0, 0xFFFF)
_CS = st.sampled_from([regs.CS1, regs.CS2])
_OPS = st.one_of(
    st.tuples(st.just("write"), st.sampled_from(_ADDRESSES), _WORD),
    st.tuples(st.just("noisy-write"), st.sampled_from(_ADDRESSES), _WORD, _WORD),
    st.tuples(st.just("start"), _CS, _CODES),
    st.tuples(st.just("seal"), _CS),
    st.tuples(st.just("soft-reset"), st.sampled_from([regs.SOFT_RESET_CODE, 0x1234])),
    st.tuples(st.just("reset-now")),
    st.tuples(st.just("schedule-reset"), st.integers(0, 50)),
    st.tuples(st.just("unplug")),
    st.tuples(st.just("upset"), st.sampled_from(_ADDRESSES[:-5]), st.integers(1, 0xFFFF)),
    st.tuples(st.just("direct-edit"), st.sampled_from(_ADDRESSES), _WORD),
    st.tuples(st.just("advance"), st.integers(0, 50)),
    st.tuples(st.just("read"), st.sampled_from((*_ADDRESSES, regs.SYS_STATUS, 0x4A, 0x42))),
)


def _apply(chip: EmulatedChip, op: tuple, clock: SimulatedClock) -> int | None:
    kind = op[0]
    if kind == "write":
        _wr(chip, op[1], op[2])
    elif kind == "noisy-write":  # MOSI bit errors may redirect it (same seed: same flips)
        chip.set_spi_faults(mosi_bit_error_rate=0.05, seed=op[3])
        _wr(chip, op[1], op[2])
        chip.set_spi_faults(mosi_bit_error_rate=0.0)
    elif kind == "start":
        _wr(chip, START[op[1]], op[2])
    elif kind == "seal":
        _seal(chip, op[1])
    elif kind == "soft-reset":
        _wr(chip, regs.SOFT_RESET, op[1])
    elif kind == "reset-now":
        chip.reset_now()
    elif kind == "schedule-reset":
        chip.schedule_reset(clock.monotonic_ns() + op[1] * MS)
    elif kind == "unplug":
        _unplug(chip)
    elif kind == "upset":
        chip.corrupt_register(regs.BY_ADDRESS[op[1]].name, op[2])
    elif kind == "direct-edit":
        chip._regs[op[1]] = op[2]
    elif kind == "read":
        return _rd(chip, op[1])
    return None


def _observed(chip: EmulatedChip) -> tuple:
    return (chip.cal_state, chip.adj_state, chip.peek(regs.SYS_STATUS), chip.peek(regs.CS1),
            chip.peek(regs.CS2), dict(chip._regs))


@settings(max_examples=150, deadline=None)
@given(st.lists(_OPS, min_size=1, max_size=40))
def test_cached_and_uncached_chips_agree(ops: list[tuple]) -> None:
    clock = SimulatedClock()
    cached = EmulatedChip(ConstantPower(10.0), clock)
    uncached = _UncachedChip(ConstantPower(10.0), clock)
    for op in ops:
        if op[0] == "advance":
            clock.advance(op[1] * MS)
            continue
        assert _apply(cached, op, clock) == _apply(uncached, op, clock), op
        seen = _observed(cached)
        assert seen == _observed(uncached), op
        for cs in (regs.CS1, regs.CS2):
            assert seen[3 if cs == regs.CS1 else 4] == _datasheet_cs(_words(cached, cs)), op
