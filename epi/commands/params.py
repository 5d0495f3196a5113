"""Click parameter types that refuse what the library must never see.

`FiniteFloat` and `BoundedInt` replace bare `type=float` / `type=int`: `nan`, `inf` and values
outside the option's range are refused with one line naming the option (so `--cv-threshold nan`
cannot switch a check off). `SafeId` checks an id that becomes part of a file name the way
mix-map ids are checked (never starting with '-' or '.').
"""

from __future__ import annotations

import math
import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

import click

from epi.core.errors import UserError
from epi.core.limits import MAX_SEED, MAX_THREADS
from epi.formats.fields import check_id, range_text

if TYPE_CHECKING:  # types only: `epi meter` loads this module and must not load host/
    from host.campaign.analysis_rules import IntRange, RealRange


class FiniteFloat(click.ParamType):
    """A finite float within [lo, hi] (or (lo, hi] with lo_open)."""

    name = "number"

    def __init__(self, lo: float | None = None, hi: float | None = None, *,
                 lo_open: bool = False) -> None:
        self.lo, self.hi, self.lo_open = lo, hi, lo_open

    def convert(self, value: str | float, param: click.Parameter | None,
                ctx: click.Context | None) -> float:
        try:
            x = float(value)
        except (TypeError, ValueError):
            self.fail(f"{value!r} is not a number", param, ctx)
        below = self.lo is not None and (x <= self.lo if self.lo_open else x < self.lo)
        above = self.hi is not None and x > self.hi
        if not math.isfinite(x) or below or above:
            self.fail(f"{value!r} is not a finite number"
                      f"{range_text(self.lo, self.hi, self.lo_open)}", param, ctx)
        return x

    @classmethod
    def within(cls, r: RealRange) -> FiniteFloat:
        """The option type of a range the study file enforces too (one rule for both)."""
        return cls(r.lo, r.hi, lo_open=r.lo_open)

    def __repr__(self) -> str:
        return f"FiniteFloat({self.lo}, {self.hi})"


class BoundedInt(click.ParamType):
    """A whole number within [lo, hi] ('1e3' and '2.5' are refused, not rounded)."""

    name = "integer"

    def __init__(self, lo: int | None = None, hi: int | None = None) -> None:
        self.lo, self.hi = lo, hi

    def convert(self, value: object, param: click.Parameter | None, ctx: click.Context | None
                ) -> int:
        if isinstance(value, int) and not isinstance(value, bool):
            n = value
        else:
            text = str(value).strip()
            if not text.lstrip("+-").isdigit() or not text.isascii() or len(text) > 20:
                self.fail(f"{value!r} is not a whole number", param, ctx)
            n = int(text)
        if self.lo is not None and n < self.lo:
            self.fail(f"{n} is below the minimum {self.lo}", param, ctx)
        if self.hi is not None and n > self.hi:
            self.fail(f"{n} is above the maximum {self.hi}", param, ctx)
        return n

    @classmethod
    def within(cls, r: IntRange) -> BoundedInt:
        """The option type of a range the study file enforces too (one rule for both)."""
        return cls(r.lo, r.hi)

    def __repr__(self) -> str:
        return f"BoundedInt({self.lo}, {self.hi})"


class Duration(click.ParamType):
    """A duration such as 10m, 90s, 1.5h or 600 (seconds), in seconds; one line when not."""

    name = "duration"

    def convert(self, value: object, param: click.Parameter | None,
                ctx: click.Context | None) -> float:
        from host.campaign.budget import parse_duration

        if isinstance(value, float):
            return value
        try:
            return parse_duration(str(value))
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


class SafeId(click.ParamType):
    """An id that becomes a file name: letters, digits, '.', '_', '-', not starting with
    '-' or '.'."""

    name = "id"

    def convert(self, value: object, param: click.Parameter | None, ctx: click.Context | None
                ) -> str:
        try:
            return check_id(value, "value")
        except UserError as exc:
            self.fail(str(exc).removeprefix("value: "), param, ctx)


THREADS = BoundedInt(1, MAX_THREADS)  # limits shared with the study file (epi.core.limits)
SEED = BoundedInt(0, MAX_SEED)


class OutputDir(click.Path):
    """A directory an output goes to: never the empty string (which a shell passes for an
    unset variable, and a path would read as the current directory)."""

    def __init__(self) -> None:
        super().__init__(path_type=Path, file_okay=False)

    def convert(self, value: str | os.PathLike[str], param: click.Parameter | None,
                ctx: click.Context | None) -> str | bytes | os.PathLike[str]:
        if isinstance(value, str) and not value.strip():
            self.fail("is empty: give a directory (use . for the current one)", param, ctx)
        return super().convert(value, param, ctx)


def _writable_dir(directory: Path) -> str | None:
    """None when a file can be created in `directory`, else the reason. Tried, not inferred:
    os.access says yes to root for /proc and /sys, where nothing can be created."""
    try:
        fd, name = tempfile.mkstemp(prefix=".epi-write-check-", dir=directory)
    except OSError as exc:
        return exc.strerror or str(exc)
    os.close(fd)
    os.unlink(name)
    return None


def check_output_file(path: Path, option: str, *, make_parents: bool = False) -> Path:
    """Refuse, before any work, an output file that cannot be written: an existing directory,
    a missing or read-only parent directory. With `make_parents` (the writer creates missing
    directories) the nearest existing ancestor must be a writable directory instead."""
    path = Path(path)
    if path.is_dir():
        raise UserError(f"{option} {path}: is a directory, expected a file path")
    parent = path.parent if str(path.parent) else Path(".")
    if make_parents:
        while not parent.exists() and parent != parent.parent:
            parent = parent.parent
    if parent.exists() and not parent.is_dir():
        raise UserError(f"{option} {path}: {parent} is a file, not a directory")
    if not parent.is_dir():
        raise UserError(f"{option} {path}: directory {parent} does not exist")
    why = _writable_dir(parent)
    if why is not None or (path.exists() and not os.access(path, os.W_OK)):
        raise UserError(f"{option} {path}: not writable" + (f" ({why})" if why else ""))
    return path


def check_output_dir(path: Path, option: str) -> Path:
    """Refuse, before any work, an output directory that cannot be made or written."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise UserError(f"{option} {path}: exists and is not a directory")
    probe = path
    while not probe.exists():
        probe = probe.parent
    why = _writable_dir(probe) if probe.is_dir() else "not a directory"
    if why is not None:
        raise UserError(f"{option} {path}: {probe} is not a writable directory ({why})")
    return path
