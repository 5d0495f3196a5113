"""The study's fourth and fifth questions as statistics, words left to the report.

RQ4 — is the EPI-optimal mixed configuration smaller or larger than uniform Q4_K_M?
  The EPI-optimal set is the configuration with the lowest EPI and every configuration whose
  EPI interval reaches below the optimum's upper end (they cannot be told from it). The set's
  file sizes are compared with the reference map's: all smaller, all larger or all the same
  (within `same_tol`) is an answer, decided when the set has one member and undecided
  otherwise (the answer holds for every member the optimum cannot be told from); a set that
  straddles the reference is undecided, with the set named.

RQ5 — does the energy benefit come from reduced memory bandwidth, reduced compute, or both?
  Across configurations, J/token is regressed on two work terms per token:
  `J = c + a · bytes + b · compute` by ordinary least squares (Student-t intervals on a and b,
  n − 3 degrees of freedom). `bytes` is the weight bytes a decoded token streams (the work
  account); `compute` a measured compute cost per token. A term whose interval excludes 0
  explains part of the differences; "both" when both do. When the two terms move together
  (|correlation| above `max_corr`, variance inflation 1/(1 − r²)), the data cannot separate
  them and the answer is "cannot be told apart", whatever the fit says; with fewer than 4
  configurations there is no interval at all (needs n ≥ 4). Ordinary least squares
  assumes errors independent of the terms with a common variance (Fox, *Applied Regression
  Analysis*, 3rd ed., ch. 6 and 13 on collinearity).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

import numpy as np

from host.analysis.intervals import student_t_ppf

Status = Literal["decided", "undecided"]
SizeAnswer = Literal["smaller", "larger", "the same size", "on both sides"]
WorkAnswer = Literal["bandwidth", "compute", "both", "neither term resolved",
                     "cannot be told apart"]

#: sizes within this fraction of the reference count as the same
SAME_SIZE_TOL = 0.01
#: |correlation| of the two work terms above which they cannot be separated
MAX_CORR = 0.95


@dataclass(frozen=True)
class SizeVerdict:
    optimum: tuple[str, ...]  # the EPI-optimal configuration and those it cannot be told from
    reference: str
    answer: SizeAnswer
    status: Status
    ratios: dict[str, float]  # member → its size / the reference's


def epi_optimal_set(epi: Mapping[str, tuple[float, float, float]]) -> tuple[str, ...]:
    """(median, lo, hi) per configuration → the lowest-EPI one first, then every one whose
    interval reaches below the optimum's upper end. Non-finite entries are left out."""
    ok = {c: v for c, v in epi.items() if all(np.isfinite(x) for x in v)}
    if not ok:
        return ()
    best = min(ok, key=lambda c: ok[c][0])
    hi = ok[best][2]
    rivals = sorted((c for c in ok if c != best and ok[c][1] <= hi), key=lambda c: ok[c][0])
    return (best, *rivals)


def size_vs_reference(epi: Mapping[str, tuple[float, float, float]],
                      sizes: Mapping[str, float], reference: str,
                      same_tol: float = SAME_SIZE_TOL) -> SizeVerdict | None:
    """RQ4; None when there is no optimum or no size for it or the reference."""
    optimum = epi_optimal_set(epi)
    ref = sizes.get(reference)
    if not optimum or ref is None or not np.isfinite(ref) or ref <= 0:
        return None
    ratios = {c: float(sizes[c]) / float(ref) for c in optimum
              if c in sizes and np.isfinite(sizes[c])}
    if len(ratios) != len(optimum):
        return None
    def kind(r: float) -> SizeAnswer:
        return "the same size" if abs(r - 1.0) <= same_tol else \
            "smaller" if r < 1.0 else "larger"

    kinds = {kind(r) for r in ratios.values()}
    answer: SizeAnswer = next(iter(kinds)) if len(kinds) == 1 else "on both sides"
    status: Status = "decided" if len(optimum) == 1 else "undecided"
    return SizeVerdict(optimum, reference, answer, status, ratios)


@dataclass(frozen=True)
class Decomposition:
    n: int
    a: float  # J per byte streamed per token
    a_ci: tuple[float, float]
    b: float  # J per unit of compute per token
    b_ci: tuple[float, float]
    r2: float
    corr: float  # correlation of the two work terms across configurations
    vif: float  # variance inflation of each coefficient from that correlation
    answer: WorkAnswer
    status: Status
    level: float


def decompose(j_per_token: Mapping[str, float], bytes_per_token: Mapping[str, float],
              compute_per_token: Mapping[str, float], level: float = 0.95,
              max_corr: float = MAX_CORR) -> Decomposition | None:
    """RQ5's regression over the configurations that have all three figures; None with
    fewer than 4 (no residual degree of freedom for an interval)."""
    keys = [c for c in j_per_token if c in bytes_per_token and c in compute_per_token
            and all(np.isfinite(m[c]) for m in (j_per_token, bytes_per_token,
                                                 compute_per_token))]
    n = len(keys)
    if n < 4:
        return None
    y = np.array([j_per_token[c] for c in keys], dtype=float)
    x1 = np.array([bytes_per_token[c] for c in keys], dtype=float)
    x2 = np.array([compute_per_token[c] for c in keys], dtype=float)
    if np.ptp(x1) == 0 or np.ptp(x2) == 0:
        corr = 1.0
    else:
        corr = float(np.corrcoef(x1, x2)[0, 1])
    vif = float(1.0 / max(1.0 - corr * corr, 1e-12))
    # scaled columns keep the normal equations well conditioned; coefficients scaled back
    s1, s2 = float(np.std(x1)) or 1.0, float(np.std(x2)) or 1.0
    X = np.column_stack([np.ones(n), x1 / s1, x2 / s2])
    beta, *_ = np.linalg.lstsq(X, y, rcond=None)
    resid = y - X @ beta
    dof = n - 3
    s2_res = float(resid @ resid) / dof
    cov = s2_res * np.linalg.pinv(X.T @ X)
    t = student_t_ppf(0.5 + level / 2, dof)
    a, b = float(beta[1] / s1), float(beta[2] / s2)
    se_a, se_b = float(np.sqrt(cov[1, 1])) / s1, float(np.sqrt(cov[2, 2])) / s2
    a_ci, b_ci = (a - t * se_a, a + t * se_a), (b - t * se_b, b + t * se_b)
    ss_tot = float(((y - y.mean()) ** 2).sum())
    r2 = 1.0 - float(resid @ resid) / ss_tot if ss_tot > 0 else float("nan")
    a_res = not (a_ci[0] <= 0.0 <= a_ci[1])
    b_res = not (b_ci[0] <= 0.0 <= b_ci[1])
    answer: WorkAnswer
    if abs(corr) > max_corr:
        answer = "cannot be told apart"
    elif a_res and b_res:
        answer = "both"
    elif a_res:
        answer = "bandwidth"
    elif b_res:
        answer = "compute"
    else:
        answer = "neither term resolved"
    status: Status = "decided" if answer in ("bandwidth", "compute", "both") else "undecided"
    return Decomposition(n, a, a_ci, b, b_ci, r2, corr, vif, answer, status, level)
