"""Confidence intervals and the composite accuracy.

- Benchmark accuracy: Wilson score interval for a binomial proportion (95 %, z = 1.95996),
  the interval llama-perplexity prints for HellaSwag.
- Composite accuracy: weighted mean of benchmark accuracies with weights normalised to sum 1;
  its 95 % interval is the normal approximation for independent binomials,
  ± z·sqrt(Σ wᵢ² pᵢ(1−pᵢ)/nᵢ), clipped to [0, 1].
- Perplexity: exp(mean token NLL); its standard error is llama-perplexity's
  sqrt((mean(nll²) − mean(nll)²)/(N − 1)) · ppl (tokens treated as independent, so it is a
  lower bound on the true uncertainty).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

Z95 = 1.95996398454


def wilson_interval(k: int, n: int, z: float = Z95) -> tuple[float, float]:
    """Wilson score interval of k successes in n trials."""
    if n <= 0:
        raise ValueError("wilson_interval needs n > 0")
    p = k / n
    zz = z * z / n
    half = z * math.sqrt(p * (1 - p) / n + zz / (4 * n))
    centre = p + zz / 2
    return ((centre - half) / (1 + zz), (centre + half) / (1 + zz))


def composite(
    accuracies: Mapping[str, tuple[float, int]], weights: Mapping[str, float], z: float = Z95
) -> tuple[float, tuple[float, float]]:
    """Weighted accuracy and its 95 % interval from {bench: (accuracy, n)}."""
    total = sum(weights.values())
    if total <= 0:
        raise ValueError("composite weights must sum to a positive number")
    acc = 0.0
    var = 0.0
    for bench, w in weights.items():
        p, n = accuracies[bench]
        wn = w / total
        acc += wn * p
        var += wn * wn * p * (1 - p) / n
    half = z * math.sqrt(var)
    return acc, (max(0.0, acc - half), min(1.0, acc + half))


def perplexity_stats(nll_sum: float, nll2_sum: float, count: int) -> dict[str, float | None]:
    """Perplexity, mean NLL and their standard errors from running sums (as llama.cpp)."""
    mean = nll_sum / count
    var = nll2_sum / count - mean * mean
    se = math.sqrt(var / (count - 1)) if count > 1 and var > 0 else None
    ppl = math.exp(mean)
    return {
        "ppl": ppl,
        "ppl_se": se * ppl if se is not None else None,
        "nll_mean": mean,
        "nll_se": se,
    }
