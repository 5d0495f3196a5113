"""Deterministic seeded subsets, so a campaign can trade time for confidence reproducibly.

The subset of size n with seed s is the first n indices of numpy's PCG64 permutation of the
whole data set, seeded with s, then sorted. Subsets with one seed are therefore nested: the
100-item subset lies inside the 200-item one.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

import numpy as np

from epi.core.errors import UserError

T = TypeVar("T")
METHOD = "numpy.random.default_rng(seed).permutation(N)[:n], sorted"


def subset_indices(total: int, n: int | None, seed: int) -> list[int]:
    """Indices of the seeded subset; `n` None or 0 means every item."""
    if n is None or n == 0:
        return list(range(total))
    if n < 0:
        raise UserError(f"--n: subset size must be positive, got {n}")
    if n > total:
        raise UserError(f"--n: subset of {n} items is larger than the data ({total} items)")
    order = np.random.default_rng(seed).permutation(total)[:n]
    return sorted(int(i) for i in order)


def take_subset(items: Sequence[T], n: int | None, seed: int, what: str = "") -> list[T]:
    """The seeded subset of `items` (see module docstring)."""
    try:
        idx = subset_indices(len(items), n, seed)
    except UserError as exc:
        raise UserError(f"{what}: {exc}" if what else str(exc)) from None
    return [items[i] for i in idx]
