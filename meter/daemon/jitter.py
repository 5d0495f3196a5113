"""Bounded-memory statistics of schedule lateness (how long after its deadline a sweep began).

A daemon may run for weeks, so samples are not kept: count, mean, standard deviation, min
and max are exact (Welford), and quantiles come from a log-spaced histogram (8 buckets per
octave from 1 µs, so a reported quantile is within 9 % of the true one, above 1 µs).
"""

from __future__ import annotations

import math

from epi.formats.json_types import JSON

_BUCKETS_PER_OCTAVE = 8
_BASE_NS = 1_000  # 1 µs: everything below lands in bucket 0
_N_BUCKETS = 1 + _BUCKETS_PER_OCTAVE * 40  # up to 2^40 µs, far beyond any real lateness


class JitterStats:
    """Running statistics of non-negative durations in nanoseconds."""

    def __init__(self) -> None:
        self.count = 0
        self._mean = 0.0
        self._m2 = 0.0
        self.min_ns: int | None = None
        self.max_ns: int | None = None
        self.sum_ns = 0
        self._hist = [0] * _N_BUCKETS

    @staticmethod
    def _bucket(value_ns: int) -> int:
        if value_ns <= _BASE_NS:
            return 0
        idx = 1 + int(math.log2(value_ns / _BASE_NS) * _BUCKETS_PER_OCTAVE)
        return min(idx, _N_BUCKETS - 1)

    @staticmethod
    def _bucket_upper_ns(idx: int) -> float:
        if idx == 0:
            return float(_BASE_NS)
        return _BASE_NS * 2.0 ** (idx / _BUCKETS_PER_OCTAVE)

    def add(self, value_ns: int) -> None:
        """Record one duration (negative values are clamped to 0)."""
        value_ns = max(0, int(value_ns))
        self.count += 1
        self.sum_ns += value_ns
        delta = value_ns - self._mean
        self._mean += delta / self.count
        self._m2 += delta * (value_ns - self._mean)
        self.min_ns = value_ns if self.min_ns is None else min(self.min_ns, value_ns)
        self.max_ns = value_ns if self.max_ns is None else max(self.max_ns, value_ns)
        self._hist[self._bucket(value_ns)] += 1

    def quantile_ns(self, q: float) -> int | None:
        """Upper edge of the histogram bucket holding quantile q (capped at the true max)."""
        if self.count == 0:
            return None
        target = q * self.count
        seen = 0
        for idx, n in enumerate(self._hist):
            seen += n
            if n and seen >= target:
                upper = int(self._bucket_upper_ns(idx))
                return min(upper, self.max_ns if self.max_ns is not None else upper)
        return self.max_ns

    @property
    def mean_ns(self) -> float | None:
        return self._mean if self.count else None

    @property
    def std_ns(self) -> float | None:
        return math.sqrt(self._m2 / (self.count - 1)) if self.count > 1 else None

    def as_dict(self) -> dict[str, JSON]:
        """JSON-ready summary (null where there is no data yet)."""
        mean, std = self.mean_ns, self.std_ns
        return {
            "count": self.count,
            "sum_ns": self.sum_ns,
            "mean_ns": round(mean) if mean is not None else None,
            "std_ns": round(std) if std is not None else None,
            "min_ns": self.min_ns,
            "p50_ns": self.quantile_ns(0.5),
            "p90_ns": self.quantile_ns(0.9),
            "p99_ns": self.quantile_ns(0.99),
            "p999_ns": self.quantile_ns(0.999),
            "max_ns": self.max_ns,
        }
