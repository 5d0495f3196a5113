"""The emulated ATM90E26's register words, with CS1/CS2 computed once per change of their block.

The chip reads back its own CS1/CS2 computation and a running 8765H check compares it with
the value written (docs/atm90e26.md, reference §3). The emulator consults that verdict on
every register access, and summing the 22 + 20 bytes each time was about a quarter of a
simulated sampler run. The words only change when a register is assigned, so
`RegisterFile` keeps each block's checksum until an assignment to a register that block
covers (21H..2BH for CS1, 31H..3AH for CS2) drops it; any other mutation (never used by the
emulator, kept safe all the same) drops both. A new `RegisterFile` (power-on, soft reset,
reset fault) starts with none. Keeping the invalidation in the container, not in each caller,
means no path that changes a covered word — SPI write, CalStart/AdjStart 5678H block reset,
an injected upset, a future direct edit — can leave a stale verdict behind.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, TypeVar, overload

from meter.chip import registers as regs
from meter.chip.checksum import checksum

COVERED: dict[int, tuple[int, ...]] = {
    regs.CS1: regs.METERING_ADDRESSES,
    regs.CS2: regs.MEASUREMENT_CAL_ADDRESSES,
}
_CS_OF: dict[int, int] = {a: cs for cs, covered in COVERED.items() for a in covered}
_D = TypeVar("_D")
if TYPE_CHECKING:  # typeshed's protocol exists for the checker only
    from typing import TypeAlias

    from _typeshed import SupportsKeysAndGetItem

    Words: TypeAlias = SupportsKeysAndGetItem[int, int] | Iterable[tuple[int, int]]


class RegisterFile(dict[int, int]):
    """Register words by address (a dict, so reads stay plain dict look-ups) that remembers
    the checksum of each covered block until one of its words is assigned."""

    __slots__ = ("_cs",)

    def __init__(self, words: Iterable[tuple[int, int]]) -> None:
        super().__init__(words)
        self._cs: dict[int, int] = {}

    def computed_cs(self, cs_address: int) -> int:
        """The chip's own CS1 (`regs.CS1`) or CS2 (`regs.CS2`) over the words now."""
        cs = self._cs.get(cs_address)
        if cs is None:
            cs = self._cs[cs_address] = checksum([self[a] for a in COVERED[cs_address]])
        return cs

    def __setitem__(self, address: int, word: int) -> None:
        super().__setitem__(address, word)
        cs_address = _CS_OF.get(address)
        if cs_address is not None:
            self._cs.pop(cs_address, None)

    # Bulk and removing mutations: not used by the emulator; they forget both checksums.
    def __delitem__(self, address: int) -> None:
        super().__delitem__(address)
        self._cs.clear()

    def update(self, words: Words = (), /) -> None:
        super().update(words)
        self._cs.clear()

    # `|=` would bypass `update` (dict's own in-place or); typeshed's dict.__or__ overloads
    # admit no narrower in-place signature, hence the ignore.
    def __ior__(self, other: Words) -> RegisterFile:  # type: ignore[override,misc]
        self.update(other)
        return self

    def setdefault(self, address: int, word: int, /) -> int:
        value = super().setdefault(address, word)
        self._cs.clear()
        return value

    @overload
    def pop(self, address: int, /) -> int: ...
    @overload
    def pop(self, address: int, default: _D, /) -> int | _D: ...
    def pop(self, address: int, *default: object) -> object:
        value = super().pop(address, *default)
        self._cs.clear()
        return value

    def popitem(self) -> tuple[int, int]:
        item = super().popitem()
        self._cs.clear()
        return item

    def clear(self) -> None:
        super().clear()
        self._cs.clear()
