"""Option types of the meter commands: finite numbers in a documented range.

click's ``FloatRange`` lets ``nan`` through (every comparison with nan is false), and a nan
or inf that later becomes an integer number of nanoseconds ends in a traceback. Every float
option of `epi meter` uses ``Finite`` instead.
"""

from __future__ import annotations

import math

import click


class Finite(click.ParamType):
    """A finite float within [lo, hi] (``lo_open``: > lo)."""

    name = "number"

    def __init__(self, lo: float, hi: float, *, lo_open: bool = False) -> None:
        self.lo, self.hi, self.lo_open = lo, hi, lo_open

    def convert(self, value: object, param: click.Parameter | None,
                ctx: click.Context | None) -> float:
        if isinstance(value, float):
            number = value
        else:
            try:
                number = float(str(value))
            except ValueError:
                self.fail(f"{value!r} is not a number", param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r}: must be a finite number", param, ctx)
        low_ok = number > self.lo if self.lo_open else number >= self.lo
        if not low_ok or number > self.hi:
            bracket = "(" if self.lo_open else "["
            self.fail(f"{number:g} is outside {bracket}{self.lo:g}, {self.hi:g}]", param, ctx)
        return number

    def __repr__(self) -> str:
        return f"Finite({self.lo}, {self.hi})"
