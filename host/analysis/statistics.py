"""EPI and the statistics behind it: repeat summaries, EPI, Pareto, matched pairs, layer groups.

Pure functions over numbers and small tables (one row per configuration, phase or repeat); the
per-window work lives in host.analysis.align and
host.analysis.windows. Every figure that could be missing is
NaN with a reason, never 0.

* `repeat_stats`: median over repeats, CV (sample std / mean) and a percentile bootstrap CI of
  the median (resampling repeats; fixed seed so reruns agree).
* `epi`: EPI = (J per generated token) / accuracy, with an interval from the J/token CI and the
  accuracy CI (lower EPI = J_lo / acc_hi, upper = J_hi / acc_lo).
* `pareto_front`: configurations no other configuration beats on both accuracy (higher) and
  J/token (lower).
* `perplexity_pairs`: configurations whose perplexities agree within a relative tolerance but
  whose J/token confidence intervals do not overlap.
* `differential_groups`: for configurations that differ in exactly one layer group's type, the
  J/token difference attributed to that group, with a bootstrap CI of the difference.
* `time_share_split`: a node's J/token split over the layer groups it holds in proportion to
  their weight bytes — an estimate, labelled as one, only when asked.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

TIME_SHARE_LABEL = (
    "estimate: node energy split by the groups' share of weight bytes (decode is memory-bound); "
    "not measured"
)


@dataclass(frozen=True)
class RepeatStats:
    """Summary of one figure over repeats (NaN fields carry `reason`)."""

    n: int
    median: float
    mean: float
    cv: float
    ci_lo: float
    ci_hi: float
    reason: str = ""


def bootstrap_median_ci(values: np.ndarray, *, n_boot: int = 2000, level: float = 0.95,
                        seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap CI of the median (vectorised: one (n_boot, n) resample matrix)."""
    v = np.asarray(values, dtype=np.float64)
    if len(v) < 2:
        return float("nan"), float("nan")
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(v), size=(n_boot, len(v)))
    meds = np.median(v[idx], axis=1)
    alpha = (1.0 - level) / 2.0
    lo, hi = np.quantile(meds, [alpha, 1.0 - alpha])
    return float(lo), float(hi)


def repeat_stats(values: Sequence[float] | np.ndarray, *, n_boot: int = 2000,
                 level: float = 0.95, seed: int = 0) -> RepeatStats:
    """Median, CV and bootstrap CI over repeat values; NaN values are refused (reason)."""
    v = np.asarray(values, dtype=np.float64)
    if len(v) == 0:
        nan = float("nan")
        return RepeatStats(0, nan, nan, nan, nan, nan, "no valid repeats")
    if np.isnan(v).any():
        nan = float("nan")
        return RepeatStats(len(v), nan, nan, nan, nan, nan,
                           f"{int(np.isnan(v).sum())} of {len(v)} repeats are null")
    med, mean = float(np.median(v)), float(np.mean(v))
    if len(v) < 2:
        return RepeatStats(1, med, mean, float("nan"), float("nan"), float("nan"),
                           "one repeat: no CV or confidence interval")
    cv = float(np.std(v, ddof=1) / abs(mean)) if mean != 0 else float("nan")
    lo, hi = bootstrap_median_ci(v, n_boot=n_boot, level=level, seed=seed)
    return RepeatStats(len(v), med, mean, cv, lo, hi)


def cv(values: np.ndarray) -> float:
    """Coefficient of variation (sample std / |mean|); NaN for < 2 values."""
    v = np.asarray(values, dtype=np.float64)
    if len(v) < 2 or np.isnan(v).any() or np.mean(v) == 0:
        return float("nan")
    return float(np.std(v, ddof=1) / abs(np.mean(v)))


@dataclass(frozen=True)
class Accuracy:
    """One configuration's accuracy and where it comes from."""

    value: float
    ci_lo: float
    ci_hi: float
    basis: str  # e.g. "composite acc_norm (hellaswag 0.50, arc_easy 0.50) from acc.json"


def epi(j_per_token: float, ci_lo: float, ci_hi: float,
        acc: Accuracy | None) -> tuple[float, float, float, str]:
    """(EPI, lo, hi, reason) — EPI = J per generated token / accuracy in (0, 1]."""
    nan = float("nan")
    if acc is None:
        return nan, nan, nan, "no accuracy for this configuration"
    if not np.isfinite(acc.value) or not 0.0 < acc.value <= 1.0:
        return nan, nan, nan, f"accuracy {acc.value!r} is not in (0, 1]"
    if not np.isfinite(j_per_token):
        return nan, nan, nan, "J per generated token is null"
    a_hi = acc.ci_hi if np.isfinite(acc.ci_hi) else acc.value
    if np.isfinite(acc.ci_lo) and acc.ci_lo <= 0:
        # The accuracy interval reaches 0: EPI has no finite upper bound (never the point).
        return j_per_token / acc.value, ci_lo / a_hi, float("inf"), ""
    a_lo = acc.ci_lo if np.isfinite(acc.ci_lo) else acc.value
    return j_per_token / acc.value, ci_lo / a_hi, ci_hi / a_lo, ""


def pareto_front(accuracy: np.ndarray, j_per_token: np.ndarray) -> np.ndarray:
    """Mask of configurations not dominated (another has ≥ accuracy and ≤ J, one strictly)."""
    a = np.asarray(accuracy, dtype=np.float64)
    j = np.asarray(j_per_token, dtype=np.float64)
    ok = np.isfinite(a) & np.isfinite(j)
    ge = (a[None, :] >= a[:, None]) & (j[None, :] <= j[:, None])
    gt = (a[None, :] > a[:, None]) | (j[None, :] < j[:, None])
    dominated = (ge & gt & ok[None, :]).any(axis=1)
    return ok & ~dominated


def perplexity_pairs(configs: Sequence[str], ppl: np.ndarray, j_per_token: np.ndarray,
                     ci_lo: np.ndarray, ci_hi: np.ndarray, *, rel_tol: float) -> list[dict]:
    """Pairs with |Δppl| ≤ rel_tol·min(ppl) whose J/token CIs do not overlap."""
    p = np.asarray(ppl, dtype=np.float64)
    lo, hi = np.asarray(ci_lo, np.float64), np.asarray(ci_hi, np.float64)
    jt = np.asarray(j_per_token, np.float64)
    ii, jj = np.triu_indices(len(configs), k=1)
    close = np.abs(p[ii] - p[jj]) <= rel_tol * np.minimum(p[ii], p[jj])
    apart = (hi[ii] < lo[jj]) | (hi[jj] < lo[ii])
    keep = close & apart & np.isfinite(p[ii]) & np.isfinite(p[jj])
    out = []
    for a, b in zip(ii[keep], jj[keep], strict=True):  # matched pairs only (a handful)
        cheap, dear = (a, b) if jt[a] < jt[b] else (b, a)
        out.append({
            "cheaper": configs[cheap], "dearer": configs[dear],
            "ppl_cheaper": float(p[cheap]), "ppl_dearer": float(p[dear]),
            "ppl_rel_diff": float(abs(p[a] - p[b]) / min(p[a], p[b])),
            "j_per_token_cheaper": float(jt[cheap]), "j_per_token_dearer": float(jt[dear]),
            "saving_pct": float((jt[dear] - jt[cheap]) / jt[dear] * 100.0),
            "ppl_tolerance": rel_tol,
        })
    return out


def differential_groups(
    group_types: Mapping[str, Mapping[str, str]],
    repeat_values: Mapping[str, np.ndarray],
    *, n_boot: int = 2000, level: float = 0.95, seed: int = 0,
) -> list[dict]:
    """Energy attributed to one layer group by runs that differ only in that group's type.

    `group_types[config][group]` is the group's type signature; configurations must share the
    same group names. For each pair differing in exactly one group, Δ = median(B) − median(A)
    (J/token), with a bootstrap CI resampling each configuration's repeats independently.
    """
    names = sorted(c for c in group_types if c in repeat_values)
    rng = np.random.default_rng(seed)
    alpha = (1.0 - level) / 2.0
    out: list[dict] = []
    for i, a in enumerate(names):  # pairs of configurations (a few dozen at most)
        for b in names[i + 1:]:
            ga, gb = group_types[a], group_types[b]
            if set(ga) != set(gb):
                continue
            diff = [g for g in ga if ga[g] != gb[g]]
            if len(diff) != 1:
                continue
            va = np.asarray(repeat_values[a], np.float64)
            vb = np.asarray(repeat_values[b], np.float64)
            row = {"group": diff[0], "config_a": a, "config_b": b,
                   "type_a": ga[diff[0]], "type_b": gb[diff[0]],
                   "delta_j_per_token": float("nan"), "ci_lo": float("nan"),
                   "ci_hi": float("nan"), "n_a": len(va), "n_b": len(vb), "reason": ""}
            if len(va) < 2 or len(vb) < 2 or np.isnan(va).any() or np.isnan(vb).any():
                row["reason"] = "needs ≥ 2 valid repeats of each configuration"
                if len(va) and len(vb) and not (np.isnan(va).any() or np.isnan(vb).any()):
                    row["delta_j_per_token"] = float(np.median(vb) - np.median(va))
                out.append(row)
                continue
            ma = np.median(va[rng.integers(0, len(va), (n_boot, len(va)))], axis=1)
            mb = np.median(vb[rng.integers(0, len(vb), (n_boot, len(vb)))], axis=1)
            lo, hi = np.quantile(mb - ma, [alpha, 1.0 - alpha])
            row.update(delta_j_per_token=float(np.median(vb) - np.median(va)),
                       ci_lo=float(lo), ci_hi=float(hi))
            out.append(row)
    return out


def time_share_split(node_value: float, group_bytes: Mapping[str, float]) -> dict[str, float]:
    """Split a node's figure over its groups by weight bytes (an estimate; see label)."""
    total = float(sum(group_bytes.values()))
    if total <= 0 or not np.isfinite(node_value):
        return {g: float("nan") for g in group_bytes}
    return {g: node_value * b / total for g, b in group_bytes.items()}
