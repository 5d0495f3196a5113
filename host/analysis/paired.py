"""Paired comparisons of two configurations: energy per round, accuracy per item.

Two independent intervals hide differences that a paired comparison resolves: every
configuration is scored on the same benchmark items, and (in a campaign) measured in the same
rounds, so what they share cancels in the per-item or per-round difference.

Energy (`energy_difference`): the repeats of A and B are paired by round (`round_pairs`), in
this order of preference:
1. **by campaign round** — when every repeat carries the campaign round it was measured in
   (`campaign_round`: a campaign writes its runs as `runs/<config>/round<k>-attempt<j>`; the
   analysis puts k in repeats.csv / runs.csv `campaign_round`). The pairs are the rounds in
   which *both* configurations have a valid run (`common_rounds`), so n = common rounds:
   adaptive rounds (after the minimum only undecided configurations get more rounds) and an
   invalid run (its round is missing for one configuration) leave the other rounds paired;
2. **by time interleaving** — ad-hoc runs without a round index pair when their rounds
   interleave in time (the r-th round of each starts before the (r+1)-th of either; equal
   numbers of rounds);
3. otherwise nothing pairs: the difference of means gets Welch's t interval, labelled
   unpaired.
A round is a block of repeats measured together (one run; without blocks every repeat is its
own round) and its value is the mean of its repeats (repeats inside one run are not
independent), so n = rounds; the per-round differences d_r = B_r − A_r (and the relative
saving (A_r − B_r)/A_r) get a Student-t interval of their mean with n − 1 degrees of freedom
(exact for normal differences at any n ≥ 2).

Accuracy (`accuracy_difference`): per-item outcomes of A and B on the same items give the
discordant counts b (A right, B wrong) and c (A wrong, B right). Δ = (c − b)/n; its 95 %
interval is Newcombe's hybrid score interval for paired proportions (his method 10, built from
Wilson intervals with the pairs' correlation), and McNemar's exact test gives p for Δ = 0.
A composite over benchmarks sums the weighted per-benchmark differences with a normal
interval from their paired variances.

Two configurations "cannot be told apart" when the interval holds 0.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypedDict

import numpy as np
import pandas as pd

from host.analysis.intervals import student_t_ppf, t_interval

Z95 = 1.959963984540054
PAIRED_CAMPAIGN = ("paired by campaign round (the rounds in which both have a valid run; each "
                   "round = mean of its repeats); Student-t on per-round differences, "
                   "df = common rounds − 1")
PAIRED_ROUNDS = ("paired by round (repeats interleaved in time, no campaign round index; each "
                 "round = mean of its repeats); Student-t on per-round differences, "
                 "df = rounds − 1")
UNPAIRED = ("unpaired: no common campaign rounds and repeats not interleaved in time; Welch t "
            "on the difference of means")
# The campaign's run directory name (host/campaign/layout.py Layout.run_dir):
# <out>/runs/<config>/round<k>-attempt<j>, or round<k>-take<t>-attempt<j> (a re-measure)
_RUN_DIR = re.compile(r"round([0-9]{1,9})(?:-take[0-9]{1,9})?-attempt[0-9]{1,9}")


def campaign_round(run_dir: str | Path) -> int | None:
    """The campaign round k of a run directory `…/runs/<config>/round<k>-attempt<j>` (or
    `round<k>-take<t>-attempt<j>`, a re-measure of a refused run in round k), or None for a
    run a campaign did not lay out (an ad-hoc `epi run`).

    The round is the campaign's, not the run's position in time: adaptive rounds measure only
    some configurations, so the k-th run of two configurations need not be the same round.
    """
    p = Path(run_dir)
    m = _RUN_DIR.fullmatch(p.name)
    if m is None or p.parent.parent.name != "runs":
        return None
    return int(m.group(1))


@dataclass(frozen=True)
class RoundPairs:
    """A's and B's per-round values (each the mean of its repeats), pair by pair in round
    order; `rounds` holds the campaign round indices (None when paired by time)."""

    a: np.ndarray
    b: np.ndarray
    rounds: tuple[int, ...] | None
    method: str

    @property
    def by_campaign_round(self) -> bool:
        return self.rounds is not None


def common_rounds(a: Mapping[int, float | None], b: Mapping[int, float | None]
                  ) -> tuple[tuple[int, ...], np.ndarray, np.ndarray]:
    """(rounds, A's values, B's values) over the campaign rounds in which both have a finite
    value, in round order — the one rule that pairs two configurations by round index
    (a round missing, None or NaN for either is left out of both)."""

    def ok(x: float | None) -> bool:
        return x is not None and math.isfinite(x)

    rounds = tuple(sorted(k for k in a if k in b and ok(a[k]) and ok(b[k])))
    return (rounds, np.array([a[k] for k in rounds], dtype=np.float64),
            np.array([b[k] for k in rounds], dtype=np.float64))


def _round_means(v: np.ndarray, r: np.ndarray) -> dict[int, float]:
    """Campaign round → mean of that round's repeats."""
    return {int(k): float(np.mean(v[r == k])) for k in np.unique(r)}


def _rounds_of(r: np.ndarray | None, n: int) -> np.ndarray | None:
    """The n repeats' campaign rounds as floats, or None unless every repeat has one."""
    if r is None or len(r) != n:
        return None
    x = pd.to_numeric(pd.Series(list(r), dtype=object), errors="coerce").to_numpy(
        dtype=np.float64, na_value=np.nan)
    return x if bool(np.isfinite(x).all()) else None


def round_pairs(va: np.ndarray, ta: np.ndarray, vb: np.ndarray, tb: np.ndarray,
                block_a: np.ndarray | None = None, block_b: np.ndarray | None = None,
                round_a: np.ndarray | None = None, round_b: np.ndarray | None = None
                ) -> RoundPairs | None:
    """A's and B's per-round values paired by round, or None when nothing pairs.

    `round_x` (one per repeat): the campaign round of each repeat. When every repeat of both
    has one, the pairs are the `common_rounds` (≥ 2 needed; fewer: None — a time order is not
    trusted over the campaign's own round index). Otherwise rounds are blocks of repeats
    measured together (`block_x`: one run of each configuration; without blocks every repeat
    is its own round), each block averaged (the repeats inside one run share its warm-up,
    thermal state and background load, so only rounds are independent: df = rounds − 1), and
    blocks pair in time order when A's and B's alternate (`interleaved` on the blocks' start
    times, equal numbers of rounds, ≥ 2).
    """
    ra, rb = _rounds_of(round_a, len(va)), _rounds_of(round_b, len(vb))
    if ra is not None and rb is not None:
        rounds, xa, xb = common_rounds(_round_means(va, ra), _round_means(vb, rb))
        if len(rounds) < 2:
            return None
        return RoundPairs(xa, xb, rounds, PAIRED_CAMPAIGN)
    ba = np.arange(len(va)) if block_a is None else np.asarray(block_a)
    bb = np.arange(len(vb)) if block_b is None else np.asarray(block_b)

    def blocks(v: np.ndarray, t: np.ndarray, b: np.ndarray) -> list[tuple[float, float]]:
        out = []
        for key in dict.fromkeys(b.tolist()):
            sel = b == key
            out.append((float(np.min(t[sel])), float(np.mean(v[sel]))))
        return sorted(out, key=lambda x: x[0])

    xa_t, xb_t = blocks(va, ta, ba), blocks(vb, tb, bb)
    if len(xa_t) != len(xb_t) or len(xa_t) < 2:
        return None
    if not interleaved(np.array([x[0] for x in xa_t]), np.array([x[0] for x in xb_t])):
        return None
    return RoundPairs(np.array([x[1] for x in xa_t]), np.array([y[1] for y in xb_t]), None,
                      PAIRED_ROUNDS)


def pairing_label(method: object) -> str:
    """The short label of an energy interval's pairing, from its method text (a table's
    `energy_ci_method` / `ci_method`): 'paired by campaign round', 'paired by round' (time
    interleaved), 'unpaired (Welch)', or '-' when there is no interval."""
    if not isinstance(method, str) or not method:
        return "-"
    if method.startswith("paired by campaign round"):
        return "paired by campaign round"
    return "paired by round" if method.startswith("paired") else "unpaired (Welch)"


def interleaved(t_a: np.ndarray, t_b: np.ndarray) -> bool:
    """Whether A's and B's repeats (start times) alternate round by round."""
    a, b = np.sort(np.asarray(t_a)), np.sort(np.asarray(t_b))
    if len(a) != len(b) or len(a) < 2:
        return False
    first = np.maximum(a, b)[:-1]
    nxt = np.minimum(a, b)[1:]
    return bool(np.all(first < nxt))


def _welch(va: np.ndarray, vb: np.ndarray, level: float) -> tuple[float, float, float]:
    """(Δ mean, lo, hi) of mean(B) − mean(A), Welch–Satterthwaite df."""
    ma, mb = float(np.mean(va)), float(np.mean(vb))
    sa, sb = float(np.var(va, ddof=1)) / len(va), float(np.var(vb, ddof=1)) / len(vb)
    se = math.sqrt(sa + sb)
    d = mb - ma
    if se == 0:
        return d, d, d
    df = (sa + sb) ** 2 / (sa ** 2 / (len(va) - 1) + sb ** 2 / (len(vb) - 1))
    half = student_t_ppf(0.5 + level / 2.0, df) * se
    return d, d - half, d + half


class EnergyDifference(TypedDict):
    """One B − A energy comparison (a row of comparisons.csv / savings.csv)."""

    delta: float
    delta_ci_lo: float
    delta_ci_hi: float
    saving_pct: float
    saving_pct_ci_lo: float
    saving_pct_ci_hi: float
    n_a: int
    n_b: int
    n_pairs: int
    method: str
    ci_coverage: float
    distinguishable: bool | None
    reason: str


class AccuracyDifference(TypedDict):
    """One B − A accuracy comparison over shared items."""

    delta: float
    ci_lo: float
    ci_hi: float
    n_items: int
    discordant: int
    mcnemar_p: float
    method: str
    distinguishable: bool | None
    reason: str


def energy_difference(a: np.ndarray, t_a: np.ndarray, b: np.ndarray, t_b: np.ndarray, *,
                      level: float = 0.95, block_a: np.ndarray | None = None,
                      block_b: np.ndarray | None = None, round_a: np.ndarray | None = None,
                      round_b: np.ndarray | None = None) -> EnergyDifference:
    """B − A over repeats (J/token), paired by round where possible (`round_pairs`: by
    campaign round, else by time interleaving); relative saving of B.

    Returns delta, its interval, `saving_pct` ((A − B)/A · 100) with its interval, n, method,
    `distinguishable` (interval excludes 0; None when no interval) and a reason when null.
    """
    va, vb = np.asarray(a, np.float64), np.asarray(b, np.float64)
    ta, tb = np.asarray(t_a), np.asarray(t_b)
    nan = float("nan")
    row = EnergyDifference(delta=nan, delta_ci_lo=nan, delta_ci_hi=nan, saving_pct=nan,
                           saving_pct_ci_lo=nan, saving_pct_ci_hi=nan, n_a=len(va), n_b=len(vb),
                           n_pairs=0, method="", ci_coverage=nan, distinguishable=None,
                           reason="")
    if len(va) == 0 or len(vb) == 0 or np.isnan(va).any() or np.isnan(vb).any():
        row["reason"] = "needs valid repeats of both configurations"
        return row
    row["delta"] = float(np.mean(vb) - np.mean(va))
    row["saving_pct"] = float((np.mean(va) - np.mean(vb)) / np.mean(va) * 100.0)
    pairs = round_pairs(va, ta, vb, tb, block_a, block_b, round_a, round_b)
    if pairs is not None:
        oa, ob = pairs.a, pairs.b
        d = t_interval(ob - oa, level)
        s = t_interval((oa - ob) / oa * 100.0, level)
        row.update({"delta": float(np.mean(ob - oa)), "delta_ci_lo": d.lo, "delta_ci_hi": d.hi,
                   "saving_pct": float(np.mean((oa - ob) / oa * 100.0)), "saving_pct_ci_lo": s.lo,
                   "saving_pct_ci_hi": s.hi, "n_pairs": len(oa), "method": pairs.method,
                   "ci_coverage": level})
    elif len(va) >= 2 and len(vb) >= 2:
        dw, lo, hi = _welch(va, vb, level)
        ma = float(np.mean(va))
        row.update({"delta": dw, "delta_ci_lo": lo, "delta_ci_hi": hi, "method": UNPAIRED,
                   "saving_pct_ci_lo": -hi / ma * 100.0, "saving_pct_ci_hi": -lo / ma * 100.0,
                   "ci_coverage": level})
        row["reason"] = ("saving interval treats A's mean as known (unpaired)")
    else:
        row["reason"] = "needs ≥ 2 valid repeats of each configuration"
        return row
    if math.isfinite(row["delta_ci_lo"]):
        row["distinguishable"] = not (row["delta_ci_lo"] <= 0.0 <= row["delta_ci_hi"])
    return row


# --------------------------------------------------------------------------- accuracy
def _wilson(k: float, n: int) -> tuple[float, float]:
    p = k / n
    zz = Z95 * Z95 / n
    half = Z95 * math.sqrt(p * (1 - p) / n + zz / (4 * n))
    centre = p + zz / 2
    return (centre - half) / (1 + zz), (centre + half) / (1 + zz)


def mcnemar_exact_p(b: int, c: int) -> float:
    """Two-sided exact McNemar p-value (binomial test of b vs c at ½)."""
    m = b + c
    if m == 0:
        return 1.0
    k = min(b, c)
    tail = sum(math.comb(m, i) for i in range(k + 1)) / 2.0 ** m
    return min(1.0, 2.0 * tail)


def newcombe_paired_interval(a: int, b: int, c: int, d: int) -> tuple[float, float, float]:
    """(Δ, lo, hi) for Δ = p_B − p_A from the 2×2 table of paired outcomes.

    a: both right, b: A right / B wrong, c: A wrong / B right, d: both wrong. Newcombe (1998)
    method 10: Wilson limits of each proportion combined with the phi correlation.
    """
    n = a + b + c + d
    p1, p2 = (a + c) / n, (a + b) / n  # p1 = B's accuracy, p2 = A's accuracy
    l1, u1 = _wilson(a + c, n)
    l2, u2 = _wilson(a + b, n)
    den = (a + b) * (c + d) * (a + c) * (b + d)
    phi = 0.0 if den == 0 else (a * d - b * c) / math.sqrt(den)
    theta = p1 - p2
    delta = math.sqrt(max((p1 - l1) ** 2 - 2 * phi * (p1 - l1) * (u2 - p2) + (u2 - p2) ** 2,
                          0.0))
    eps = math.sqrt(max((u1 - p1) ** 2 - 2 * phi * (u1 - p1) * (p2 - l2) + (p2 - l2) ** 2,
                        0.0))
    return theta, max(theta - delta, -1.0), min(theta + eps, 1.0)


Z80 = 0.8416212335729143  # standard normal quantile at 0.80: the item count's power


def items_to_tell_apart(delta: float, n_items: int, discordant: int) -> int | None:
    """About how many paired items a 95 % comparison needs to tell two configurations'
    accuracies apart with 80 % power, if the difference and the discordant share stay as
    observed: Connor's (1987) closed form for paired proportions,
    n = (z₀.₉₇₅·√ψ + z₀.₈₀·√(ψ − Δ²))² / Δ², with ψ = discordant / n_items.

    None when nothing can be projected: no items, or no difference observed (Δ = 0: the two
    may be equally accurate, and no item count follows from the data).
    """
    if n_items <= 0 or not math.isfinite(delta) or delta == 0.0 or discordant <= 0:
        return None
    psi = discordant / n_items
    spread = max(psi - delta * delta, 0.0)
    n = (Z95 * math.sqrt(psi) + Z80 * math.sqrt(spread)) ** 2 / (delta * delta)
    return math.ceil(n)


def paired_table(correct_a: Sequence[int], correct_b: Sequence[int]) -> tuple[int, int, int, int]:
    ca = np.asarray(correct_a, dtype=bool)
    cb = np.asarray(correct_b, dtype=bool)
    return (int(np.sum(ca & cb)), int(np.sum(ca & ~cb)), int(np.sum(~ca & cb)),
            int(np.sum(~ca & ~cb)))


def accuracy_difference(items_a: Mapping[str, Mapping[str, int]],
                        items_b: Mapping[str, Mapping[str, int]],
                        weights: Mapping[str, float]) -> AccuracyDifference:
    """B − A in accuracy over the items both were scored on, per benchmark then weighted.

    `items_x[benchmark][item_id]` is 1 when the item was answered right. One benchmark: the
    Newcombe interval and McNemar p; several: Σ wᵢΔᵢ with a normal interval from the paired
    variances (b + c − (c − b)²/n)/n² of each benchmark.
    """
    nan = float("nan")
    row = AccuracyDifference(delta=nan, ci_lo=nan, ci_hi=nan, n_items=0, discordant=0,
                             mcnemar_p=nan, method="", distinguishable=None, reason="")
    wsum = float(sum(w for k, w in weights.items() if k in items_a and k in items_b))
    if wsum <= 0:
        row["reason"] = "no per-item outcomes shared by both configurations"
        return row
    tables = {}
    for bench, w in weights.items():
        if bench not in items_a or bench not in items_b or w <= 0:
            continue
        ids = sorted(set(items_a[bench]) & set(items_b[bench]))
        if not ids:
            row["reason"] = f"{bench}: no item scored for both"
            return row
        tables[bench] = (w / wsum, paired_table([items_a[bench][i] for i in ids],
                                               [items_b[bench][i] for i in ids]))
    n_tot = sum(sum(t) for _, t in tables.values())
    disc = sum(t[1] + t[2] for _, t in tables.values())
    row.update({"n_items": n_tot, "discordant": disc})
    if len(tables) == 1:
        (_, (a, b, c, d)), = tables.values()
        delta, lo, hi = newcombe_paired_interval(a, b, c, d)
        row.update({"delta": delta, "ci_lo": lo, "ci_hi": hi, "mcnemar_p": mcnemar_exact_p(b, c),
                   "method": "paired over items: Newcombe hybrid score 95 % interval; McNemar "
                          "exact p"})
    else:
        delta, var = 0.0, 0.0
        for w, (a, b, c, d) in tables.values():
            n = a + b + c + d
            delta += w * (c - b) / n
            var += w * w * (b + c - (c - b) ** 2 / n) / n ** 2
        half = Z95 * math.sqrt(var)
        row.update({"delta": delta, "ci_lo": delta - half, "ci_hi": delta + half,
                   "method": "paired over items: weighted per-benchmark differences, normal "
                          "95 % interval"})
    row["distinguishable"] = not (row["ci_lo"] <= 0.0 <= row["ci_hi"])
    return row
