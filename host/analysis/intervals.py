"""Confidence intervals that say what they are: method, achieved coverage and n.

Repeat counts in this study are small (3–10), so the choice of interval matters:

* `median_interval`: the distribution-free order-statistic interval of the median,
  [x₍ₖ₎, x₍ₙ₋ₖ₊₁₎] with coverage 1 − 2·P(Bin(n, ½) ≤ k − 1) — exact for any continuous
  distribution of independent repeats. It picks the narrowest such interval whose coverage is
  at least the wanted level; where none reaches it (n ≤ 5 for 95 %: [min, max] covers only
  1 − 2·0.5ⁿ, 75 % at n = 3, 93.75 % at n = 5) it returns [min, max] with that lower coverage
  and `level_met = False`, so no caller can print it as a 95 % interval. (The percentile
  bootstrap of the median used before returns the same [min, max] at n = 3 and called it 95 %.)
* `t_interval`: Student-t interval of a mean, exact at any n ≥ 2 when the values are normal
  (repeat figures are means over many requests, so roughly normal); used for paired
  differences and, as a second figure, for the mean over repeats.
* `student_t_ppf`: Student-t quantiles without scipy (regularised incomplete beta by
  continued fraction, then bisection).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from epi.core.text import as_number

ORDER_STAT_METHOD = "order-statistic interval of the median (distribution-free, exact binomial)"
T_METHOD = "Student-t interval of the mean (assumes normal repeat values)"


@dataclass(frozen=True)
class Interval:
    """An interval with its method, the coverage it achieves, and whether that meets `level`."""

    lo: float
    hi: float
    method: str
    coverage: float
    n: int
    level: float
    level_met: bool
    note: str = ""

    def label(self) -> str:
        """Short text such as "75 % order-statistic, n=3" for tables."""
        if not math.isfinite(self.coverage):
            return f"no interval, n={self.n}"
        kind = "order-statistic" if self.method == ORDER_STAT_METHOD else "t"
        return f"{pct(self.coverage)} {kind}, n={self.n}"


def pct(x: float) -> str:
    p = 100.0 * x
    return f"{p:.0f} %" if abs(p - round(p)) < 0.05 else f"{p:.1f} %"


NAN = float("nan")


def binom_half_cdf(k: int, n: int) -> float:
    """P(Bin(n, ½) ≤ k), exact."""
    if k < 0:
        return 0.0
    return sum(math.comb(n, i) for i in range(min(k, n) + 1)) / 2.0 ** n


def order_stat_coverage(n: int, k: int) -> float:
    """Coverage of [x₍ₖ₎, x₍ₙ₋ₖ₊₁₎] for the median of n continuous iid values."""
    return 1.0 - 2.0 * binom_half_cdf(k - 1, n)


def min_repeats_for(level: float) -> int:
    """Fewest repeats whose [min, max] covers the median with at least `level`."""
    n = 1
    while order_stat_coverage(n, 1) < level:
        n += 1
    return n


def median_interval(values: np.ndarray, level: float = 0.95) -> Interval:
    """Order-statistic interval of the median (see the module docstring)."""
    v = np.sort(np.asarray(values, dtype=np.float64))
    n = len(v)
    if n < 2 or np.isnan(v).any():
        return Interval(NAN, NAN, ORDER_STAT_METHOD, NAN, n, level, False,
                        "needs ≥ 2 valid repeats")
    k = 1
    while k + 1 <= n // 2 and order_stat_coverage(n, k + 1) >= level:
        k += 1
    cov = order_stat_coverage(n, k)
    met = cov >= level
    note = "" if met else (
        f"no {pct(level)} interval of the median exists from n={n} repeats "
        f"(needs n ≥ {min_repeats_for(level)}); [min, max] covers {pct(cov)}")
    return Interval(float(v[k - 1]), float(v[n - k]), ORDER_STAT_METHOD, cov, n, level, met,
                    note)


# --------------------------------------------------------------------------- Student t
def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction of the incomplete beta (modified Lentz)."""
    tiny = 1e-300
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 300):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        h *= d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < 1e-15:
            break
    return h


def _betainc(a: float, b: float, x: float) -> float:
    """Regularised incomplete beta I_x(a, b)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    ln = (math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x)
          + b * math.log1p(-x))
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(ln) * _betacf(a, b, x) / a
    return 1.0 - math.exp(ln) * _betacf(b, a, 1.0 - x) / b


def student_t_cdf(t: float, df: float) -> float:
    x = df / (df + t * t)
    tail = 0.5 * _betainc(df / 2.0, 0.5, x)
    return 1.0 - tail if t > 0 else tail


def student_t_ppf(p: float, df: float) -> float:
    """Quantile of Student's t (bisection on the cdf; |error| < 1e-12)."""
    if not 0.0 < p < 1.0 or df <= 0:
        raise ValueError(f"student_t_ppf needs 0 < p < 1 and df > 0, got {p}, {df}")
    if p < 0.5:
        return -student_t_ppf(1.0 - p, df)
    lo, hi = 0.0, 1.0
    while student_t_cdf(hi, df) < p:
        hi *= 2.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if student_t_cdf(mid, df) < p:
            lo = mid
        else:
            hi = mid
        if hi - lo < 1e-12:
            break
    return 0.5 * (lo + hi)


def t_interval(values: np.ndarray, level: float = 0.95) -> Interval:
    """Student-t interval of the mean of `values` (n ≥ 2)."""
    v = np.asarray(values, dtype=np.float64)
    n = len(v)
    if n < 2 or np.isnan(v).any():
        return Interval(NAN, NAN, T_METHOD, NAN, n, level, False, "needs ≥ 2 valid values")
    mean = float(np.mean(v))
    se = float(np.std(v, ddof=1)) / math.sqrt(n)
    half = student_t_ppf(0.5 + level / 2.0, n - 1) * se
    return Interval(mean - half, mean + half, T_METHOD, level, n, level, True)


# --------------------------------------------------------------------------- text
def finite(x: object) -> bool:
    """Whether a value or table cell is a finite number (epi.core.text.as_number)."""
    return math.isfinite(as_number(x))


_number, _finite = as_number, finite
number = as_number  # the same narrowing for the report's readers of cells


def format_interval(value: object, lo: object, hi: object, coverage: object = None, *,
                    at_least: bool = False, n: object = None, fmt: str = ".4g") -> str:
    """"value [lo, hi] 75 % n=3": an interval printed with the coverage it has, and n.

    Shared by the analyze summary and the report, so both say the same thing: `coverage` is
    the achieved coverage (a fraction, printed as a percent; "≥" when it is a lower bound,
    as for EPI), `n` the repeats or pairs behind it. "null" when there is no value; the value
    alone when there is no interval.
    """
    if not _finite(value):
        return "null"
    v = format(_number(value), fmt)
    if not (_finite(lo) and _finite(hi)):
        return v
    lo_t = format(_number(lo), fmt)
    hi_t = format(_number(hi), fmt)
    cov = (" ≥" if at_least else " ") + pct(_number(coverage)) if _finite(coverage) else ""
    n_txt = f" n={int(_number(n))}" if _finite(n) else ""
    return f"{v} [{lo_t}, {hi_t}]{cov}{n_txt}"
