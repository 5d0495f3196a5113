"""The ranges `epi analyze`'s options and the study file's `[analysis]` table both enforce.

A threshold given on the command line and the same threshold written in a study are one
setting, so they are refused by one rule: `epi analyze --cv-threshold 0` and
`[analysis] cv_threshold = 0` both fail (a zero threshold would refuse every run). The click
types of epi/commands/params.py and the study reader (host/campaign/study.py) are built from
these records; nothing else spells the bounds.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RealRange:
    """A finite number in [lo, hi], or (lo, hi] when `lo_open`."""

    lo: float
    hi: float
    lo_open: bool = False


@dataclass(frozen=True)
class IntRange:
    """A whole number in [lo, hi]."""

    lo: int
    hi: int


FRACTION = RealRange(0.0, 1.0, lo_open=True)  # a threshold fraction: 0 would refuse everything
TOLERANCE = RealRange(0.0, 1.0)  # a relative tolerance: 0 asks for an exact match

# `[analysis]` key (the option is `--` + the key with '-' for '_') → its range
ANALYSIS_REALS: dict[str, RealRange] = {
    "cv_threshold": FRACTION,
    "max_offset_frac": FRACTION,
    "max_lag_error_frac": FRACTION,
    "ppl_tolerance": TOLERANCE,
    "max_resolution_frac": FRACTION,
}
# the report's guidance by use: an absolute accuracy loss, and a J/token budget as a multiple
# of the lowest (at least 1×)
GUIDANCE_REALS: dict[str, RealRange] = {
    "guidance_accuracy_loss": RealRange(0.0, 1.0),
    "guidance_j_budget": RealRange(1.0, 100.0),
}
MIN_SAMPLES = IntRange(2, 1_000_000)  # `[analysis] min_samples` / `--min-samples`
