"""Plain-text presentation both halves share: numbers, number ranges and aligned tables."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from numbers import Real

# The one rule for a number that is not there (None, NaN, infinite, not a number at all): it
# prints as a word. Tables, summaries and reports that JSON readers share print "null"; the
# community site and the bundle comparison, read by people, print a dash (their `missing`).
MISSING = "null"
DASH = "—"


def as_number(x: object) -> float:
    """A value or table cell as a float: NaN for anything that is not a number (None, pd.NA,
    a bool, text that does not parse). numpy's scalars are numbers.Real too."""
    if isinstance(x, Real) and not isinstance(x, bool):
        return float(x)
    if isinstance(x, str):
        try:
            return float(x)
        except ValueError:
            return math.nan
    return math.nan


def format_number(x: object, spec: str = ".4g", missing: str = MISSING) -> str:
    """`x` formatted with `spec`, or `missing` when it is not a finite number."""
    v = as_number(x)
    return format(v, spec) if math.isfinite(v) else missing


def ranges_text(numbers: Iterable[int], empty: str = "") -> str:
    """Sorted integers as compact ranges: (0, 1, 2, 5) -> '0-2,5'; `empty` when there are none."""
    values = sorted(set(numbers))
    if not values:
        return empty
    out: list[str] = []
    start = prev = values[0]
    for x in [*values[1:], None]:
        if x is not None and x == prev + 1:
            prev = x
            continue
        out.append(f"{start}-{prev}" if prev != start else f"{start}")
        if x is not None:
            start = prev = x
    return ",".join(out)


def format_table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """Left-aligned columns under a header and a dashed rule; trailing spaces trimmed."""
    cells = [[str(c) for c in headers], *[[str(c) for c in r] for r in rows]]
    widths = [max(len(line[i]) for line in cells) for i in range(len(headers))]
    out = []
    for n, line in enumerate(cells):
        out.append("  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip())
        if n == 0:
            out.append("  ".join("-" * w for w in widths))
    return "\n".join(out)


CENTURY_S = 100 * 365.25 * 86400


def format_duration(seconds: float) -> str:
    """A duration as 1h02m03s / 2m03s / 3s (whole seconds), for plans and progress lines.

    An estimate from an absurd rate (a study's `decode_tok_s = 5e-324`) can be infinite or
    astronomically long: it reads "more than a century" rather than failing or printing a
    thirty-digit hour count."""
    if math.isnan(seconds):
        return "unknown"
    if seconds > CENTURY_S:
        return "more than a century"
    s = round(seconds)
    h, rem = divmod(s, 3600)
    m, s = divmod(rem, 60)
    return f"{h}h{m:02d}m{s:02d}s" if h else (f"{m}m{s:02d}s" if m else f"{s}s")
