"""The valid range of every numeric analysis option: one rule set for `epi analyze`'s flags and
the study file's `[analysis]` table, so a value one refuses the other refuses too."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Range:
    """Finite numbers in [lo, hi], or (lo, hi] when `lo_open`."""

    lo: float
    hi: float
    lo_open: bool = False


# thresholds as fractions: 0 would refuse every run (a CV of 0) or pass none
FRACTION = Range(0.0, 1.0, lo_open=True)

RANGES: dict[str, Range] = {
    "cv_threshold": FRACTION,
    "max_offset_frac": FRACTION,
    "max_lag_error_frac": FRACTION,
    "max_resolution_frac": FRACTION,
    "ppl_tolerance": Range(0.0, 1.0),  # 0: perplexities must match exactly
    "guidance_accuracy_loss": Range(0.0, 1.0),
    "guidance_j_budget": Range(1.0, 100.0),
}
