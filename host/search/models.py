"""The two fitted models a search predicts with, and how well each holds.

- Energy: J per generated token = a + b · (GB of weights in the file). Decode reads every weight
  once per generated token, so its energy grows with the bytes read; prefill and the fixed
  per-token work go into `a`. Fitted by least squares on every measured configuration, with its
  residuals kept and shown.
- Accuracy: composite accuracy = a + s · KL, with s ≤ 0. It is fitted on the KL measured
  directly on each measured file (the whole file scored against the base: every measured map
  has one), and applied to a candidate's summed per-layer proxy, so a prediction is only as
  good as the proxy's additivity (shown beside it). A file further from the base cannot be
  expected to score better, so a positive fitted slope is taken for what it is (a composite
  too small to resolve the KL differences) and replaced by the constant model, flagged
  `clamped`: predicted accuracy is then the mean, and candidates rank by energy alone. Rank
  correlations are reported, labelled: with the measured composite, the summed per-layer
  proxy's (the quantity the search ranks candidates by; on every measured map whose layers all
  take allowed types) and the direct KL's; and with the measured perplexity (a far finer
  accuracy measure than a small composite), the direct KL's and the proxy's.

With too few measured points a model says so (`fitted` is False) instead of inventing a slope:
an unfitted energy model ranks by bytes alone and predicts no joules.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True)
class LinearFit:
    """y = intercept + slope · x, with the residual spread and the points it came from."""

    intercept: float
    slope: float
    residual_sd: float
    n: int
    x_mean: float
    sxx: float
    residuals: tuple[float, ...] = field(default=())
    clamped: bool = False  # a constant model standing in for a fit whose slope had the wrong sign

    @property
    def fitted(self) -> bool:
        return self.n >= 2 and math.isfinite(self.slope)

    def predict(self, x: float) -> float:
        if not self.fitted:
            return math.nan
        return self.intercept + self.slope * x

    def prediction_sd(self, x: float) -> float:
        """Standard deviation of a new observation at x (residual + slope uncertainty)."""
        if not self.fitted or self.n < 3 or self.sxx <= 0:
            return math.nan
        if self.clamped:  # a constant model: only the mean's uncertainty, no slope's
            return self.residual_sd * math.sqrt(1 + 1 / self.n)
        return self.residual_sd * math.sqrt(1 + 1 / self.n + (x - self.x_mean) ** 2 / self.sxx)


def fit_line(x: Sequence[float], y: Sequence[float]) -> LinearFit:
    """Ordinary least squares of y on x over the finite pairs; unfitted below two points or
    when x does not vary."""
    xs = np.asarray(x, dtype=np.float64)
    ys = np.asarray(y, dtype=np.float64)
    ok = np.isfinite(xs) & np.isfinite(ys)
    xs, ys = xs[ok], ys[ok]
    n = len(xs)
    if n < 2 or np.ptp(xs) == 0:
        return LinearFit(math.nan, math.nan, math.nan, n, math.nan, 0.0)
    x_mean = float(xs.mean())
    sxx = float(np.sum((xs - x_mean) ** 2))
    slope = float(np.sum((xs - x_mean) * (ys - ys.mean())) / sxx)
    intercept = float(ys.mean() - slope * x_mean)
    res = ys - (intercept + slope * xs)
    sd = float(math.sqrt(np.sum(res**2) / (n - 2))) if n > 2 else math.nan
    return LinearFit(intercept, slope, sd, n, x_mean, sxx, tuple(float(r) for r in res))


def fit_nonincreasing(x: Sequence[float], y: Sequence[float]) -> LinearFit:
    """Least squares of y on x with the slope constrained to ≤ 0: where the free fit's slope is
    positive, the constrained optimum is the constant model (y = mean, `clamped`), whose
    residual spread has n − 1 degrees of freedom."""
    free = fit_line(x, y)
    if not free.fitted or free.slope <= 0:
        return free
    xs = np.asarray(x, dtype=np.float64)
    ys = np.asarray(y, dtype=np.float64)
    ys = ys[np.isfinite(xs) & np.isfinite(ys)]
    mean = float(ys.mean())
    res = ys - mean
    sd = float(math.sqrt(np.sum(res**2) / (len(ys) - 1)))
    return LinearFit(mean, 0.0, sd, free.n, free.x_mean, free.sxx,
                     tuple(float(r) for r in res), clamped=True)


def spearman(x: Sequence[float], y: Sequence[float]) -> float:
    """Spearman rank correlation (average ranks for ties); NaN below three finite pairs."""
    xs = np.asarray(x, dtype=np.float64)
    ys = np.asarray(y, dtype=np.float64)
    ok = np.isfinite(xs) & np.isfinite(ys)
    xs, ys = xs[ok], ys[ok]
    if len(xs) < 3:
        return math.nan

    def ranks(v: np.ndarray) -> np.ndarray:
        order = np.argsort(v, kind="mergesort")
        r = np.empty(len(v))
        r[order] = np.arange(len(v), dtype=np.float64)
        for value in np.unique(v):  # ties get their average rank
            tie = v == value
            r[tie] = r[tie].mean()
        return r

    rx, ry = ranks(xs), ranks(ys)
    if np.std(rx) == 0 or np.std(ry) == 0:
        return math.nan
    return float(np.corrcoef(rx, ry)[0, 1])


@dataclass(frozen=True)
class Predictor:
    """Predicted J/token, accuracy and EPI of a candidate from its bytes and summed KL."""

    energy: LinearFit  # J per generated token on GB of weights
    accuracy: LinearFit  # composite accuracy on summed KL (nats/token)
    proxy_rank_correlation: float  # Spearman(−summed per-layer proxy KL, measured accuracy)
    direct_kl_rank_correlation: float = math.nan  # Spearman(−whole-file KL, measured accuracy)
    proxy_n: int = 0  # measured maps with a summed proxy (the first correlation's points)
    # Spearman(KL, measured perplexity): whole-file KL, and the summed per-layer proxy
    direct_kl_ppl_rank_correlation: float = math.nan
    proxy_ppl_rank_correlation: float = math.nan
    ppl_n: int = 0  # measured maps with a perplexity and a direct KL

    def j_per_token(self, gb: float) -> float:
        return self.energy.predict(gb)

    def accuracy_of(self, kl: float) -> float:
        a = self.accuracy.predict(kl)
        return min(max(a, 0.0), 1.0) if math.isfinite(a) else math.nan

    def epi(self, gb: float, kl: float) -> float:
        """Predicted EPI; NaN when either model is unfitted or accuracy is not positive."""
        j = self.j_per_token(gb)
        a = self.accuracy_of(kl)
        return j / a if math.isfinite(j) and math.isfinite(a) and a > 0 else math.nan

    def epi_interval(self, gb: float, kl: float, z: float = 1.96) -> tuple[float, float]:
        """Approximate prediction interval of EPI from the two models' prediction spreads
        (independent, first order); NaN where a spread is unknown."""
        j, a = self.j_per_token(gb), self.accuracy_of(kl)
        sj, sa = self.energy.prediction_sd(gb), self.accuracy.prediction_sd(kl)
        if not all(math.isfinite(v) for v in (j, a, sj, sa)) or a <= 0:
            return (math.nan, math.nan)
        e = j / a
        rel = math.sqrt((sj / j) ** 2 + (sa / a) ** 2) if j > 0 else math.nan
        return (e * (1 - z * rel), e * (1 + z * rel))


def _n_pairs(x: Sequence[float], y: Sequence[float]) -> int:
    return sum(1 for a, b in zip(x, y, strict=True) if math.isfinite(a) and math.isfinite(b))


def fit_predictor(gb: Sequence[float], j_per_token: Sequence[float], kl: Sequence[float],
                  accuracy: Sequence[float],
                  proxy_kl: Sequence[float] | None = None,
                  perplexity: Sequence[float] | None = None) -> Predictor:
    """Both models from measured configurations (NaN entries are left out of each fit).

    `kl` is each configuration's directly measured whole-file KL (the accuracy fit's x);
    `proxy_kl` its summed per-layer proxy, NaN where it has none. Without `proxy_kl` the
    proxy's correlation is unknown (NaN), never silently the direct KL's; likewise the
    perplexity correlations without `perplexity`.
    """
    energy = fit_line(gb, j_per_token)
    acc = fit_nonincreasing(kl, accuracy)
    rho_direct = spearman([-k for k in kl], accuracy)
    # a missing series is all-NaN: its correlations are NaN and its counts 0, by construction
    proxy = list(proxy_kl) if proxy_kl is not None else [math.nan] * len(kl)
    ppl = list(perplexity) if perplexity is not None else [math.nan] * len(kl)
    return Predictor(
        energy, acc, spearman([-k for k in proxy], accuracy), rho_direct,
        _n_pairs(proxy, accuracy),
        direct_kl_ppl_rank_correlation=spearman(kl, ppl),
        proxy_ppl_rank_correlation=spearman(proxy, ppl),
        ppl_n=_n_pairs(kl, ppl),
    )
