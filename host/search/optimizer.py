"""Gradient-free search over per-layer types: greedy descent by sensitivity per byte saved,
with a two-notch look-ahead, then a budgeted pick of candidates to measure.

Descent: start with every layer at the best allowed type. At each step, consider for every
layer lowering it by one or by two notches in the type order, and take the move that costs the
least proxy KL per byte it saves (a two-notch move is taken when its average cost per byte
beats every one-notch move, which lets the search cross a type whose own step is a poor
trade). Each state along the way is a candidate: the path runs from the largest, most faithful
model to the smallest. Because the proxy is additive over layers, a move's cost is exact under
the proxy; what the path cannot see (interactions between layers) the measurements judge.

Pick: among path states inside the budget (bits per weight, file size, predicted accuracy),
rank by predicted EPI (or spread over the interior of the bits-per-weight range for the Pareto
objective and while a model is unfitted) and take the best
K that have not been measured yet and differ from each other by at least `min_gap_bpw`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from host.search.models import Predictor
from host.search.sensitivity import candidate_kl
from host.search.space import SearchSpace


@dataclass(frozen=True)
class Candidate:
    """One state of the descent, with its proxy figures."""

    assignment: tuple[str, ...]
    bytes: int
    bpw: float
    kl: float
    step: int

    @property
    def gb(self) -> float:
        return self.bytes / 1e9


@dataclass(frozen=True)
class Budget:
    """What a candidate must satisfy to be measured."""

    max_bpw: float | None = None
    max_size_mb: float | None = None
    min_accuracy: float | None = None

    def admits(self, c: Candidate, predictor: Predictor | None) -> bool:
        if self.max_bpw is not None and c.bpw > self.max_bpw:
            return False
        if self.max_size_mb is not None and c.bytes / 1e6 > self.max_size_mb:
            return False
        if self.min_accuracy is not None and predictor is not None:
            acc = predictor.accuracy_of(c.kl)
            if math.isfinite(acc) and acc < self.min_accuracy:
                return False
        return True


def descent_path(space: SearchSpace, kl: dict[tuple[int, str], float]) -> list[Candidate]:
    """Every state of the greedy descent, from all-best to all-worst type."""
    order = list(space.types)
    state = [0] * space.n_layers  # index into `order` per layer
    layer_bytes = {(i, t): space.layer_bytes(i, t) for i in range(space.n_layers) for t in order}

    def snapshot(step: int) -> Candidate:
        a = tuple(order[k] for k in state)
        return Candidate(a, space.bytes_of(a), space.bpw_of(a), candidate_kl(a, kl), step)

    path = [snapshot(0)]
    step = 0
    while True:
        best: tuple[float, int, int] | None = None  # (cost per byte, layer, new index)
        for i, k in enumerate(state):
            for jump in (1, 2):
                j = k + jump
                if j >= len(order):
                    break
                saved = layer_bytes[(i, order[k])] - layer_bytes[(i, order[j])]
                if saved <= 0:
                    continue
                cost = (kl[(i, order[j])] - kl[(i, order[k])]) / saved
                if best is None or cost < best[0] - 1e-18:
                    best = (cost, i, j)
        if best is None:
            return path
        step += 1
        state[best[1]] = best[2]
        path.append(snapshot(step))


def pick_candidates(
    path: Sequence[Candidate],
    predictor: Predictor | None,
    budget: Budget,
    k: int,
    exclude: set[tuple[str, ...]],
    objective: str = "epi",
    min_gap_bpw: float = 0.05,
) -> list[Candidate]:
    """Up to `k` unmeasured candidates inside the budget.

    objective "epi": lowest predicted EPI first. objective "pareto" — and "epi" while either
    model is still unfitted — spread over the admitted bits-per-weight range at its interior
    quantiles.
    """
    pool = [c for c in path if c.assignment not in exclude and budget.admits(c, predictor)]
    if not pool or k <= 0:
        return []
    unfitted = predictor is None or not (predictor.energy.fitted and predictor.accuracy.fitted)
    if objective == "pareto" or unfitted:
        pool.sort(key=lambda c: c.bpw)
        if len(pool) <= k:
            return pool
        # interior quantiles 1/(k+1) … k/(k+1): never the pool's ends, which sit one notch from
        # the all-best and all-worst maps (usually hand-made ones) and would teach little
        picks = [pool[round((i + 1) * (len(pool) + 1) / (k + 1)) - 1] for i in range(k)]
        return list({c.assignment: c for c in picks}.values())

    assert predictor is not None

    def score(c: Candidate) -> tuple[float, float]:
        e = predictor.epi(c.gb, c.kl)
        return (e if math.isfinite(e) else math.inf, c.bytes)

    chosen: list[Candidate] = []
    for c in sorted(pool, key=score):
        if all(abs(c.bpw - d.bpw) >= min_gap_bpw for d in chosen):
            chosen.append(c)
        if len(chosen) == k:
            break
    return chosen
