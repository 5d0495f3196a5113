"""EPI and the statistics behind it: repeat summaries, EPI, Pareto, matched pairs, layer groups.

Pure functions over numbers and small tables (one row per configuration, phase or repeat); the
per-window work lives in host.analysis.align and
host.analysis.windows. Every figure that could be missing is
NaN with a reason, never 0.

* `repeat_stats`: median over repeats, CV (sample std / mean), the order-statistic interval of
  the median with its achieved coverage (host.analysis.intervals: at n = 3 that is [min, max]
  covering 75 %, never called 95 %), and the mean with its Student-t 95 % interval.
* `epi`: EPI = (J per generated token) / accuracy, with an interval from the J/token interval
  and the accuracy interval (lower EPI = J_lo / acc_hi, upper = J_hi / acc_lo); its coverage
  is at least c_J + c_acc − 1 (Bonferroni), which `epi_coverage` gives.
* `pareto_front`: configurations no other configuration beats on both accuracy (higher) and
  J/token (lower).
* `perplexity_pairs`: configurations whose perplexities agree within a relative tolerance; each
  pair's J/token difference with its paired (per-round: by campaign round, else by time)
  interval, or says it cannot be told apart.
* `differential_groups`: for configurations that differ in exactly one layer group's type, the
  J/token difference attributed to that group, with its paired (per-round) or Welch interval.
* `time_share_split`: a node's J/token split over the layer groups it holds in proportion to
  their weight bytes — an estimate, labelled as one, only when asked.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from host.analysis import paired
from host.analysis.intervals import ORDER_STAT_METHOD, median_interval, t_interval
from host.analysis.records import GroupDifferential, PerplexityPair

TIME_SHARE_LABEL = (
    "estimate: node energy split by the groups' share of weight bytes (decode is memory-bound); "
    "not measured"
)


@dataclass(frozen=True)
class RepeatStats:
    """Summary of one figure over repeats (NaN fields carry `reason`).

    `ci_lo`/`ci_hi` is the order-statistic interval of the median; `ci_coverage` its achieved
    coverage and `ci_level_met` whether that reaches the wanted level (`ci_note` says why not).
    `mean_ci_lo`/`mean_ci_hi` is the Student-t interval of the mean at the wanted level.
    """

    n: int
    median: float
    mean: float
    cv: float
    ci_lo: float
    ci_hi: float
    reason: str = ""
    ci_method: str = ORDER_STAT_METHOD
    ci_coverage: float = float("nan")
    ci_level_met: bool = False
    ci_note: str = ""
    mean_ci_lo: float = float("nan")
    mean_ci_hi: float = float("nan")


def repeat_stats(values: Sequence[float] | np.ndarray, *, level: float = 0.95) -> RepeatStats:
    """Median, CV and honest intervals over repeat values; NaN values are refused (reason)."""
    v = np.asarray(values, dtype=np.float64)
    nan = float("nan")
    if len(v) == 0:
        return RepeatStats(0, nan, nan, nan, nan, nan, "no valid repeats")
    if np.isnan(v).any():
        return RepeatStats(len(v), nan, nan, nan, nan, nan,
                           f"{int(np.isnan(v).sum())} of {len(v)} repeats are null")
    med, mean = float(np.median(v)), float(np.mean(v))
    if len(v) < 2:
        return RepeatStats(1, med, mean, nan, nan, nan,
                           "one repeat: no CV or confidence interval",
                           ci_note="one repeat: no interval")
    cv = float(np.std(v, ddof=1) / abs(mean)) if mean != 0 else nan
    ci = median_interval(v, level)
    ti = t_interval(v, level)
    return RepeatStats(len(v), med, mean, cv, ci.lo, ci.hi, "", ci.method, ci.coverage,
                       ci.level_met, ci.note, ti.lo, ti.hi)


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


def epi_coverage(j_coverage: float, acc: Accuracy | None) -> float:
    """Lower bound on the EPI interval's coverage: c_J + c_acc − 1 (Bonferroni).

    Both intervals hold together with at least that probability, and then the EPI interval
    holds the true EPI. An accuracy without an interval counts as exact (c_acc = 1), which
    overstates the coverage; the basis text says so.
    """
    if acc is None or not np.isfinite(j_coverage):
        return float("nan")
    c_acc = 0.95 if np.isfinite(acc.ci_lo) and np.isfinite(acc.ci_hi) else 1.0
    return max(j_coverage + c_acc - 1.0, 0.0)


def pareto_front(accuracy: np.ndarray, j_per_token: np.ndarray) -> np.ndarray:
    """Mask of configurations not dominated (another has ≥ accuracy and ≤ J, one strictly)."""
    a = np.asarray(accuracy, dtype=np.float64)
    j = np.asarray(j_per_token, dtype=np.float64)
    ok = np.isfinite(a) & np.isfinite(j)
    ge = (a[None, :] >= a[:, None]) & (j[None, :] <= j[:, None])
    gt = (a[None, :] > a[:, None]) | (j[None, :] < j[:, None])
    dominated = (ge & gt & ok[None, :]).any(axis=1)
    return ok & ~dominated


def _tail(extra: Sequence[np.ndarray]) -> tuple[np.ndarray | None, np.ndarray | None]:
    """(run of each repeat, campaign round of each repeat) from a repeats tuple's optional
    tail (either may be absent: then the pairing falls back, host.analysis.paired)."""
    return (extra[0] if len(extra) > 0 else None, extra[1] if len(extra) > 1 else None)


def perplexity_pairs(configs: Sequence[str], ppl: np.ndarray,
                     repeats: Mapping[str, tuple[np.ndarray, ...]], *, rel_tol: float,
                     level: float = 0.95) -> list[PerplexityPair]:
    """Pairs with |Δppl| ≤ rel_tol·min(ppl), each with its paired J/token difference.

    `repeats[config]` = (J/token per repeat, repeat start times[, run of each repeat[, campaign
    round of each repeat]]); pairs by campaign round, else by time (host.analysis.paired). The
    cheaper configuration is the one with the lower mean; `distinguishable` is False when the
    paired interval of the difference holds 0 (the two cannot be told apart on energy).
    """
    p = np.asarray(ppl, dtype=np.float64)
    ii, jj = np.triu_indices(len(configs), k=1)
    close = np.abs(p[ii] - p[jj]) <= rel_tol * np.minimum(p[ii], p[jj])
    keep = close & np.isfinite(p[ii]) & np.isfinite(p[jj])
    empty = (np.zeros(0), np.zeros(0))
    out: list[PerplexityPair] = []
    ra: list[np.ndarray]
    rb: list[np.ndarray]
    for a, b in zip(ii[keep], jj[keep], strict=True):  # matched pairs only (a handful)
        va, ta, *ra = repeats.get(configs[a], empty)
        vb, tb, *rb = repeats.get(configs[b], empty)
        mean_a = float(np.mean(va)) if len(va) else float("nan")
        mean_b = float(np.mean(vb)) if len(vb) else float("nan")
        if mean_b > mean_a:  # order as (dearer, cheaper): the difference is the saving
            a, b, va, ta, ra, vb, tb, rb, mean_a, mean_b = (b, a, vb, tb, rb, va, ta, ra,
                                                            mean_b, mean_a)
        (run_a, k_a), (run_b, k_b) = _tail(ra), _tail(rb)
        d = paired.energy_difference(va, ta, vb, tb, level=level, block_a=run_a,
                                     block_b=run_b, round_a=k_a, round_b=k_b)
        out.append(PerplexityPair(
            cheaper=configs[b], dearer=configs[a],
            ppl_cheaper=float(p[b]), ppl_dearer=float(p[a]),
            ppl_rel_diff=float(abs(p[a] - p[b]) / min(p[a], p[b])),
            j_per_token_cheaper=mean_b, j_per_token_dearer=mean_a,
            saving_pct=d["saving_pct"], saving_pct_ci_lo=d["saving_pct_ci_lo"],
            saving_pct_ci_hi=d["saving_pct_ci_hi"],
            delta_j_per_token=d["delta"], delta_ci_lo=d["delta_ci_lo"],
            delta_ci_hi=d["delta_ci_hi"], ci_coverage=d["ci_coverage"],
            ci_method=d["method"], n_pairs=d["n_pairs"],
            distinguishable=d["distinguishable"], reason=d["reason"],
            ppl_tolerance=rel_tol,
        ))
    return out


def differential_groups(
    group_types: Mapping[str, Mapping[str, str]],
    repeats: Mapping[str, tuple[np.ndarray, ...]],
    *, level: float = 0.95,
) -> list[GroupDifferential]:
    """Energy attributed to one layer group by runs that differ only in that group's type.

    `group_types[config][group]` is the group's type signature; configurations must share the
    same group names. `repeats[config]` = (J/token per repeat, repeat start times[, run of each
    repeat[, campaign round of each repeat]]). For each
    pair differing in exactly one group, Δ = mean(B) − mean(A) (J/token) with its paired
    per-round interval (by campaign round, else by time; Welch's, labelled unpaired, when
    nothing pairs).
    """
    names = sorted(c for c in group_types if c in repeats)
    out: list[GroupDifferential] = []
    ra: list[np.ndarray]
    rb: list[np.ndarray]
    for i, a in enumerate(names):  # pairs of configurations (a few dozen at most)
        for b in names[i + 1:]:
            ga, gb = group_types[a], group_types[b]
            if set(ga) != set(gb):
                continue
            diff = [g for g in ga if ga[g] != gb[g]]
            if len(diff) != 1:
                continue
            va, ta, *ra = repeats[a]
            vb, tb, *rb = repeats[b]
            (run_a, k_a), (run_b, k_b) = _tail(ra), _tail(rb)
            d = paired.energy_difference(va, ta, vb, tb, level=level, block_a=run_a,
                                         block_b=run_b, round_a=k_a, round_b=k_b)
            out.append(GroupDifferential(
                group=diff[0], config_a=a, config_b=b, type_a=ga[diff[0]], type_b=gb[diff[0]],
                delta_j_per_token=d["delta"], ci_lo=d["delta_ci_lo"], ci_hi=d["delta_ci_hi"],
                ci_coverage=d["ci_coverage"], ci_method=d["method"], n_a=d["n_a"],
                n_b=d["n_b"], distinguishable=d["distinguishable"], reason=d["reason"]))
    return out


def time_share_split(node_value: float, group_bytes: Mapping[str, float]) -> dict[str, float]:
    """Split a node's figure over its groups by weight bytes (an estimate; see label)."""
    total = float(sum(group_bytes.values()))
    if total <= 0 or not np.isfinite(node_value):
        return {g: float("nan") for g in group_bytes}
    return {g: node_value * b / total for g, b in group_bytes.items()}
