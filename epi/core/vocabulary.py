"""The base of epi's closed vocabularies: string enums that read and write as their values.

A closed set of words (an energy basis, an event kind, a step kind) is an Enum whose members are
also ``str``: they compare equal to the plain strings read back from JSON, CSV and TOML, and they
format, print and serialize as their values, so files stay byte-identical to the plain strings
they replace. mypy then knows the set, and `strict_equality` flags a comparison with a member that
does not exist. The meter's MicroPython subset keeps plain string constants (no ``enum`` there).
"""

from __future__ import annotations

from enum import Enum
from typing import TypeVar

W = TypeVar("W", bound="Word")


class Word(str, Enum):
    """A member of a closed vocabulary: a ``str`` whose text is its value, everywhere."""

    def __str__(self) -> str:
        return str(self.value)

    def __format__(self, spec: str) -> str:
        return format(str(self.value), spec)

    def __repr__(self) -> str:
        # the value's repr: messages that quote a word read as they did with plain strings
        return repr(str(self.value))

    @classmethod
    def values(cls) -> tuple[str, ...]:
        """The words, in declaration order (click choices, study-file checks, help texts)."""
        return tuple(str(m.value) for m in cls)

    @classmethod
    def parse(cls: type[W], text: object) -> W | None:
        """The member spelled ``text``, or None when it is not one of the words."""
        for m in cls:
            if m.value == text:
                return m
        return None


def one_of(words: tuple[str, ...]) -> str:
    """'"a" or "b"' / '"a", "b" or "c"': how a refusal names the allowed words."""
    quoted = [f'"{w}"' for w in words]
    return quoted[0] if len(quoted) == 1 else ", ".join(quoted[:-1]) + " or " + quoted[-1]
