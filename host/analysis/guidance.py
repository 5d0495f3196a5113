"""Practical guidance by use: which configuration to pick when latency, energy or quality
matters most, each with whether the pick is decided.

The study promises recommendations by use. Three rules, thresholds from the study file
(`[analysis] guidance_accuracy_loss`, `guidance_j_budget`) with defaults:

- **latency-sensitive**: the fastest configuration (least decode time per generated token)
  among those whose accuracy is within `accuracy_loss` (absolute, e.g. 0.02 = two points) of the
  most accurate configuration;
- **energy-sensitive**: the lowest J per generated token among the same set;
- **quality-sensitive**: the most accurate configuration whose J/token is within `j_budget`
  times the lowest J/token (e.g. 1.10: at most 10 % more energy per token than the thriftiest).

Eligibility uses the point estimates (a configuration is in or out); the pick is **decided**
when every other eligible configuration is told apart from it, otherwise undecided with the set
it cannot yet be told from. "Told apart" is the study's own paired verdict where it has one
(`told_apart`: the campaign's sequential test or the paired energy comparison for J/token, the
paired per-item comparison for accuracy), so the guidance never contradicts a comparison the
report states elsewhere; without one, two configurations are told apart when their intervals
do not overlap. Without
accuracy the latency and energy rows rank every configuration and say so.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Literal

Use = Literal["latency-sensitive", "energy-sensitive", "quality-sensitive"]
Quantity = Literal["time", "energy", "accuracy"]
# (pick, rival, quantity) → True/False from a paired verdict, None: no paired verdict
ToldApart = Callable[[str, str, Quantity], "bool | None"]

ACCURACY_LOSS = 0.02
J_BUDGET = 1.10


@dataclass(frozen=True)
class Figure:
    """A point estimate with its interval (lo ≤ value ≤ hi; NaN bounds: no interval)."""

    value: float
    lo: float
    hi: float

    @property
    def has_interval(self) -> bool:
        return math.isfinite(self.lo) and math.isfinite(self.hi)


@dataclass(frozen=True)
class ConfigFigures:
    accuracy: Figure | None
    j_per_token: Figure | None
    s_per_token: Figure | None  # decode seconds per generated token


@dataclass(frozen=True)
class Recommendation:
    use: Use
    criterion: str  # the rule in words, with its threshold
    config: str | None  # None: no configuration qualifies
    figure: Figure | None
    rivals: tuple[str, ...]  # eligible configurations the pick cannot yet be told from
    eligible: int

    @property
    def status(self) -> Literal["decided", "undecided"]:
        return "decided" if self.config is not None and not self.rivals and \
            self.figure is not None and self.figure.has_interval else "undecided"


def _pick(figs: Mapping[str, Figure], lowest: bool, quantity: Quantity,
          told_apart: ToldApart | None) -> tuple[str | None, tuple[str, ...]]:
    ok = {c: f for c, f in figs.items() if math.isfinite(f.value)}
    if not ok:
        return None, ()
    best = (min if lowest else max)(ok, key=lambda c: ok[c].value)
    b = ok[best]

    def rival(c: str, f: Figure) -> bool:
        paired = told_apart(best, c, quantity) if told_apart is not None else None
        if paired is not None:
            return not paired
        if not (f.has_interval and b.has_interval):
            return True  # without intervals nothing can be told apart
        return f.lo <= b.hi if lowest else f.hi >= b.lo

    rivals = tuple(sorted(c for c, f in ok.items() if c != best and rival(c, f)))
    return best, rivals


def guidance(configs: Mapping[str, ConfigFigures], *, accuracy_loss: float = ACCURACY_LOSS,
             j_budget: float = J_BUDGET, told_apart: ToldApart | None = None
             ) -> list[Recommendation]:
    """The three recommendations, in the order latency, energy, quality."""
    acc = {c: f.accuracy for c, f in configs.items()
           if f.accuracy is not None and math.isfinite(f.accuracy.value)}
    if acc:
        top = max(a.value for a in acc.values())
        within = {c for c, a in acc.items() if a.value >= top - accuracy_loss - 1e-12}
        rule = f"accuracy within {accuracy_loss:.3g} of the most accurate ({top:.3f})"
    else:
        within = set(configs)
        rule = "no accuracy measured: every configuration"
    out: list[Recommendation] = []
    rows: tuple[tuple[Use, str, Quantity, str], ...] = (
        ("latency-sensitive", "s_per_token", "time", "least decode time per token"),
        ("energy-sensitive", "j_per_token", "energy", "lowest J per generated token"))
    for use, attr, quantity, what in rows:
        figs = {c: getattr(configs[c], attr) for c in within
                if getattr(configs[c], attr) is not None}
        best, rivals = _pick(figs, True, quantity, told_apart)
        out.append(Recommendation(use, f"{what}, {rule}", best,
                                  figs.get(best) if best else None, rivals, len(figs)))
    js = {c: f.j_per_token.value for c, f in configs.items()
          if f.j_per_token is not None and math.isfinite(f.j_per_token.value)}
    if js and acc:
        floor = min(js.values())
        afford = {c: acc[c] for c in acc if c in js and js[c] <= j_budget * floor + 1e-15}
        best, rivals = _pick(afford, False, "accuracy", told_apart)
        out.append(Recommendation("quality-sensitive",
                                  f"most accurate within {j_budget:.3g}× the lowest J/token "
                                  f"({floor:.4g} J)", best, afford.get(best) if best else None,
                                  rivals, len(afford)))
    else:
        out.append(Recommendation("quality-sensitive", "needs accuracy and J/token", None, None,
                                  (), 0))
    return out
