"""Does a map's rank transfer across models? Rank correlation and a map × model interaction.

The study runs a second model (a mixture of experts) to see "whether mixed quantization
interacts with expert gating", and asks whether "a mix strategy transfers across model
families". Given, for two models, the same maps' per-round figures (J/token or EPI, one value a
campaign round), this module answers with:

- **Spearman's rank correlation** of the maps' medians between the two models, with a
  bootstrap percentile interval: the campaign rounds are resampled with replacement (one index
  set for both models and every map, so a round's shared conditions stay together; Efron and
  Tibshirani, *An Introduction to the Bootstrap*, 1993, ch. 13). Its coverage is approximate.
- **A map × model interaction test** on the paired rounds. Each round's values are taken as logs
  and centred over the maps within that model and round (that removes each model's scale and a
  round's drift), and the two models' centred values are differenced: I[m, r]. With no
  interaction every map's I has mean 0. The statistic is Σ_m (mean_r I[m, r])², and its null
  distribution comes from flipping the sign of whole rounds (exact over all 2^n flips up to
  n = 12 rounds, else 20,000 seeded flips). This assumes each round's I is symmetric about 0
  under the null (Good, *Permutation, Parametric and Bootstrap Tests of Hypotheses*, 3rd ed.,
  2005, §3.6 on one-sample sign flips).

Answer: "the ranking transfers" (decided) when ρ's interval lies above `min_rho` and the
interaction test, with enough rounds to reject at all, does not reject; "it does not"
(decided) when the interaction test rejects at `alpha`, naming the maps that move (their
rank changes, most moved first); otherwise undecided, with what would decide it.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

TransferAnswer = Literal["the ranking transfers", "it does not", "undecided"]

#: rank correlation the interval's lower end must exceed for "transfers"
MIN_RHO = 0.5
ALPHA = 0.05
EXACT_FLIPS_UP_TO = 12
RANDOM_FLIPS = 20_000
BOOTSTRAP = 2_000


@dataclass(frozen=True)
class Transfer:
    models: tuple[str, str]
    maps: tuple[str, ...]  # the maps both models measured, in the first model's rank order
    n_rounds: int  # rounds in which every map of both models has a value
    rho: float
    rho_ci: tuple[float, float]
    level: float
    interaction_p: float
    moved: tuple[str, ...]  # maps whose rank differs between the models, most moved first
    answer: TransferAnswer

    @property
    def status(self) -> Literal["decided", "undecided"]:
        return "undecided" if self.answer == "undecided" else "decided"


def spearman(x: np.ndarray, y: np.ndarray) -> float:
    """Spearman's ρ (average ranks for ties); NaN when either side is constant."""
    rx, ry = _ranks(x), _ranks(y)
    if np.ptp(rx) == 0 or np.ptp(ry) == 0:
        return float("nan")
    return float(np.corrcoef(rx, ry)[0, 1])


def _spearman_columns(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Spearman's ρ of each column pair of (maps, draws) arrays (ordinal ranks: the bootstrap's
    medians of continuous values tie with probability ~0); NaN where a side is constant."""
    rx = np.argsort(np.argsort(x, axis=0, kind="stable"), axis=0).astype(float)
    ry = np.argsort(np.argsort(y, axis=0, kind="stable"), axis=0).astype(float)
    rx -= rx.mean(axis=0)
    ry -= ry.mean(axis=0)
    den = np.sqrt((rx ** 2).sum(axis=0) * (ry ** 2).sum(axis=0))
    flat = (np.ptp(x, axis=0) == 0) | (np.ptp(y, axis=0) == 0)
    with np.errstate(invalid="ignore", divide="ignore"):
        rho = (rx * ry).sum(axis=0) / den
    return np.where(flat, np.nan, rho)


def _ranks(v: np.ndarray) -> np.ndarray:
    order = np.argsort(v, kind="stable")
    ranks = np.empty(len(v), dtype=float)
    ranks[order] = np.arange(1, len(v) + 1, dtype=float)
    for value in np.unique(v):  # ties share their average rank
        tied = v == value
        ranks[tied] = ranks[tied].mean()
    return ranks


def interaction_p(a: np.ndarray, b: np.ndarray, seed: int = 0) -> float:
    """p-value of the map × model interaction; `a`, `b`: (maps, rounds) positive values."""
    la, lb = np.log(a), np.log(b)
    inter = (la - la.mean(axis=0)) - (lb - lb.mean(axis=0))  # (maps, rounds)
    n = inter.shape[1]

    def stat(signs: np.ndarray) -> np.ndarray:
        return np.sum((inter @ signs.T / n) ** 2, axis=0)

    observed = float(np.sum(inter.mean(axis=1) ** 2))
    if n <= EXACT_FLIPS_UP_TO:
        signs = np.array(list(itertools.product((1.0, -1.0), repeat=n)))
    else:
        rng = np.random.default_rng(seed)
        signs = rng.choice((1.0, -1.0), size=(RANDOM_FLIPS, n))
        signs[0] = 1.0  # the observed arrangement is one of the draws
    null = stat(signs)
    return float(np.mean(null >= observed - 1e-12 * max(observed, 1e-300)))


def transfer(values: Mapping[str, Mapping[str, Mapping[int, float]]], *,
             level: float = 0.95, min_rho: float = MIN_RHO, alpha: float = ALPHA,
             seed: int = 0) -> Transfer | None:
    """{model: {map: {round: value}}} for exactly two models → the verdict; None when fewer
    than 3 common maps or 2 common rounds leave nothing to rank or test."""
    if len(values) != 2:
        return None
    (ma, va), (mb, vb) = values.items()
    maps = sorted(set(va) & set(vb))
    if len(maps) < 3:
        return None
    rounds = sorted(set.intersection(*(set(va[m]) & set(vb[m]) for m in maps)))
    rounds = [r for r in rounds if all(np.isfinite(va[m][r]) and va[m][r] > 0 and
                                       np.isfinite(vb[m][r]) and vb[m][r] > 0 for m in maps)]
    if len(rounds) < 2:
        return None
    a = np.array([[va[m][r] for r in rounds] for m in maps], dtype=float)
    b = np.array([[vb[m][r] for r in rounds] for m in maps], dtype=float)
    med_a, med_b = np.median(a, axis=1), np.median(b, axis=1)
    rho = spearman(med_a, med_b)
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(rounds), (BOOTSTRAP, len(rounds)))
    boot = _spearman_columns(np.median(a[:, idx], axis=2), np.median(b[:, idx], axis=2))
    boot = boot[np.isfinite(boot)]
    tail = (1 - level) / 2
    ci = (float(np.quantile(boot, tail)), float(np.quantile(boot, 1 - tail))) if len(boot) \
        else (float("nan"), float("nan"))
    p = interaction_p(a, b, seed)
    rank_a, rank_b = _ranks(med_a), _ranks(med_b)
    shift = np.abs(rank_a - rank_b)
    moved = tuple(maps[i] for i in np.argsort(-shift, kind="stable") if shift[i] > 0)
    answer: TransferAnswer
    if p < alpha and moved:
        answer = "it does not"
    elif p >= alpha and np.isfinite(ci[0]) and ci[0] > min_rho and \
            len(rounds) >= sign_flip_rounds_needed(1, alpha):  # a test that could have rejected
        answer = "the ranking transfers"
    else:
        answer = "undecided"
    order = tuple(maps[i] for i in np.argsort(med_a, kind="stable"))
    return Transfer((ma, mb), order, len(rounds), rho, ci, level, p, moved, answer)


def sign_flip_rounds_needed(n_rounds: int, alpha: float = ALPHA) -> int:
    """The fewest rounds whose exact sign-flip test can reach `alpha` at all: the statistic is
    the same under a flip of every round, so its smallest p-value is 2 / 2^n."""
    n = max(1, n_rounds)
    while 2.0 ** (1 - n) > alpha:
        n += 1
    return n


def rows_by_round(values: Sequence[tuple[str, str, int, float]]
                  ) -> dict[str, dict[str, dict[int, float]]]:
    """(model, map, round, value) rows → {model: {map: {round: value}}} (means of repeats)."""
    acc: dict[str, dict[str, dict[int, list[float]]]] = {}
    for model, map_id, rnd, value in values:
        acc.setdefault(model, {}).setdefault(map_id, {}).setdefault(rnd, []).append(value)
    return {m: {k: {r: float(np.mean(v)) for r, v in rs.items()} for k, rs in maps.items()}
            for m, maps in acc.items()}
