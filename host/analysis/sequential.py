"""Sequential paired comparisons: look after every round, stop when the verdict is settled.

A campaign that adds rounds until a comparison is decided looks at its data repeatedly; a
fixed-n interval checked after every round no longer covers at its level (peeking: with a
95 % t interval looked at after each of 20 rounds, a zero difference is "decided" far more
often than 5 % of the time — `tests/host/test_sequential.py` shows it). This module uses an
**anytime-valid confidence sequence** instead: a sequence of intervals CS_n, one per number
of rounds n, with

    P(there is some n at which CS_n misses the true mean difference) ≤ α,

so the interval at *any* round — including one chosen by looking at the data — covers with
probability ≥ 1 − α.

Method: **Lai's t-mixture confidence sequence** for the mean μ of independent normal values
with unknown variance (T. L. Lai, "On confidence sequences", Annals of Statistics 4(2),
265–280, 1976; restated and proved anytime-valid as the scale-invariant likelihood-ratio
t-test martingale in H. Wang & A. Ramdas, "Anytime-valid t-tests and confidence sequences for
Gaussian means with unknown variance", Sequential Analysis, 2024, arXiv:2310.03722, §4; the
framework of time-uniform boundaries is S. R. Howard, A. Ramdas, J. McAuliffe & J. Sekhon,
"Time-uniform, nonparametric, nonasymptotic confidence sequences", Annals of Statistics
49(2), 1055–1080, 2021). For a candidate μ, with S = Σ(xᵢ − μ) and T = Σ(xᵢ − μ)² over the
n values, the likelihood ratio of the scale-invariant statistics (σ integrated out with the
right-Haar measure dσ/σ) mixed over the standardised effect θ = μ/σ ~ N(0, 1/c) is

    M_n(μ) = √(c / (n + c)) · (1 − S² / ((n + c)·T))^(−n/2),

a nonnegative martingale with M_1 = 1 when μ is the true mean, whatever σ. Ville's
inequality gives P(∃n: M_n(μ) ≥ 1/α) ≤ α, so CS_n = {μ : M_n(μ) < 1/α} is a (1 − α)
confidence sequence. It solves in closed form: with x̄, V = Σ(xᵢ − x̄)²,
B = (√((n + c)/c) / α)^(2/n) and K = (n + c)(1 − 1/B),

    CS_n = x̄ ± √(K·V / (n·(n − K)))      (the whole line while K ≥ n).

Assumption: the per-round differences are independent and normal with a common variance
(the same assumption as the fixed-n Student-t interval of `host.analysis.paired`); the
guarantee is per comparison (split α yourself for a family-wise one). The price of
anytime validity is width: about twice the fixed-n t interval's at 5–10 rounds. `c` sets
where the sequence is tightest; the default 0.05 gives a finite interval from 3 rounds on
(none exists from 2: no sequence that is valid at every n can decide then).

Verdicts (`decide`): with the smallest difference worth resolving m ≥ 0,
*decided* — CS_n excludes 0 (which way, with the interval; flagged when it also lies inside
(−m, m)); *equivalent* — CS_n lies inside (−m, m); otherwise *undecided* (more rounds, or,
with the budget spent, "undecided after the budget" with the rounds it would need). A wrong
verdict (a direction opposite to the truth, a "decided" when the truth is 0, or an
"equivalent" when |μ| ≥ m) needs CS_n to miss μ, so wrong verdicts occur with probability
≤ α at any stopping rule; the simulation test checks both this and the coverage.

Power analysis (`rounds_for`, `resolvable`): at a per-round standard deviation s measured so
far (V ≈ (n − 1)s²), the CS half-width w(n) is known in advance; a true difference d is
decided with probability ≈ `power` once w(n) + z_power · s/√n ≤ |d| (the mean then clears the
half-width that often). Plug-in estimates: s itself is uncertain at a few rounds.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, replace
from statistics import NormalDist

import numpy as np

from host.analysis.vocabulary import VerdictState

METHOD = ("Lai (1976) t-mixture confidence sequence, anytime-valid (normal per-round "
          "differences, unknown variance; Wang & Ramdas 2024)")
DEFAULT_ALPHA = 0.05
DEFAULT_C = 0.05
DEFAULT_POWER = 0.8
MAX_ROUNDS_SEARCHED = 100_000

State = VerdictState


def _check(alpha: float, c: float) -> None:
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha must be in (0, 1), got {alpha}")
    if not c > 0.0:
        raise ValueError(f"c (prior precision of the standardised effect) must be > 0, got {c}")


def width_factor(n: np.ndarray | int, alpha: float = DEFAULT_ALPHA, c: float = DEFAULT_C
                 ) -> np.ndarray:
    """g(n) with half-width = g(n) · √V (inf where the sequence is still the whole line).

    g(n) = √(K / (n·(n − K))), K = (n + c)(1 − 1/B), B = (√((n + c)/c)/α)^(2/n).
    """
    _check(alpha, c)
    nn = np.asarray(n, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        log_b = (2.0 / nn) * (math.log(1.0 / alpha) + 0.5 * np.log((nn + c) / c))
        k = (nn + c) * -np.expm1(-log_b)
        g = np.sqrt(k / (nn * (nn - k)))
    return np.where((nn >= 2) & (k < nn), g, np.inf)


def sequence_bounds(x: np.ndarray, alpha: float = DEFAULT_ALPHA, c: float = DEFAULT_C
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(mean, lo, hi) of the confidence sequence after each of the first 1..N values.

    `x` has shape (..., N): the last axis is the rounds in order (vectorised over studies).
    """
    x = np.asarray(x, dtype=np.float64)
    n = np.arange(1, x.shape[-1] + 1, dtype=np.float64)
    s1 = np.cumsum(x, axis=-1)
    mean = s1 / n
    # V = Σ(x − x̄)² from running sums of the values shifted by the first one (stable unless
    # the spread is ~1e8 times smaller than the values themselves).
    shifted = x - x[..., :1]
    v = np.cumsum(shifted ** 2, axis=-1) - np.cumsum(shifted, axis=-1) ** 2 / n
    g = (_g_table(alpha, c)[: len(n)] if len(n) <= MAX_ROUNDS_SEARCHED
         else width_factor(n, alpha, c))
    # inf · 0 (an unbounded round with identical values) stays unbounded, not NaN
    half = np.where(np.isinf(g), np.inf, np.nan_to_num(g, posinf=0.0) * np.sqrt(np.maximum(v, 0)))
    return mean, mean - half, mean + half


def half_width(n: int, sd: float, alpha: float = DEFAULT_ALPHA, c: float = DEFAULT_C) -> float:
    """Half-width after n rounds when the per-round standard deviation is `sd`."""
    return float(width_factor(n, alpha, c)) * math.sqrt(max(n - 1, 0)) * sd


def rounds_for(sd: float, diff: float, *, alpha: float = DEFAULT_ALPHA, c: float = DEFAULT_C,
               power: float = DEFAULT_POWER) -> int | None:
    """Rounds after which a true difference `diff` is decided with probability ≈ `power`.

    Smallest n with w(n) + z_power·sd/√n ≤ |diff| (plug-in sd); None when |diff| = 0 or no n
    up to MAX_ROUNDS_SEARCHED suffices. sd = 0 needs the sequence's first finite n.
    """
    if not (math.isfinite(sd) and math.isfinite(diff)) or sd < 0:
        return None
    d = abs(diff)
    if d == 0:
        return None
    # sd = 0 (identical rounds): any finite need qualifies; Python's float division by 0
    # raises, so the ratio is spelled out
    ok = np.nonzero(_need_per_sd(alpha, c, power) <= (d / sd if sd > 0 else math.inf))[0]
    return int(ok[0]) + 2 if len(ok) else None


@functools.lru_cache(maxsize=16)
def _g_table(alpha: float, c: float) -> np.ndarray:
    """width_factor(n) for n = 1 … MAX_ROUNDS_SEARCHED, computed once per (alpha, c)."""
    out = width_factor(np.arange(1, MAX_ROUNDS_SEARCHED + 1), alpha, c)
    out.setflags(write=False)
    return out


@functools.lru_cache(maxsize=16)
def _need_per_sd(alpha: float, c: float, power: float) -> np.ndarray:
    """(w(n) + z_power·s/√n) / s for n = 2 … MAX_ROUNDS_SEARCHED (it scales with s)."""
    n = np.arange(2, MAX_ROUNDS_SEARCHED + 1, dtype=np.float64)
    out = width_factor(n, alpha, c) * np.sqrt(n - 1.0) + NormalDist().inv_cdf(power) / np.sqrt(n)
    out.setflags(write=False)
    return out


def resolvable(sd: float, rounds: int, *, alpha: float = DEFAULT_ALPHA, c: float = DEFAULT_C,
               power: float = DEFAULT_POWER) -> float:
    """The smallest |difference| that `rounds` rounds decide with probability ≈ `power`."""
    if rounds < 2 or not math.isfinite(sd):
        return math.inf
    z = NormalDist().inv_cdf(power)
    return half_width(rounds, sd, alpha, c) + z * sd / math.sqrt(rounds)


@dataclass(frozen=True)
class SequentialVerdict:
    """One comparison's state after n rounds (differences B − A in the caller's unit)."""

    state: State
    n: int
    mean: float
    lo: float
    hi: float
    alpha: float
    margin: float
    budget_spent: bool
    within_margin: bool = False  # decided, and the whole interval lies inside (−m, m)
    sd: float = math.nan
    rounds_needed: int | None = None  # total rounds a still-undecided comparison would need
    method: str = METHOD
    need_basis: str = "the noise measured"  # whose spread `rounds_needed` comes from

    @property
    def direction(self) -> int:
        """+1: B larger than A; −1: B smaller; 0: not decided."""
        if self.state != VerdictState.DECIDED:
            return 0
        return 1 if self.lo > 0 else -1

    @property
    def settled(self) -> bool:
        """No more rounds needed: decided, equivalent, or the budget is spent."""
        return self.state != VerdictState.UNDECIDED or self.budget_spent

    def interval_text(self, unit: str = "", digits: int = 3) -> str:
        cov = f"{100 * (1 - self.alpha):g} % anytime-valid"
        if self.n == 0:
            return f"no valid paired round yet ({cov})"
        if not math.isfinite(self.lo):
            return f"{self.mean:.{digits}g}{unit} [no finite interval yet] {cov}, n={self.n}"
        return (f"{self.mean:.{digits}g}{unit} [{self.lo:.{digits}g}, {self.hi:.{digits}g}]"
                f" {cov}, n={self.n}")

    def text(self, a: str = "A", b: str = "B", what: str = "B − A", unit: str = "") -> str:
        """One line: what is settled, with the interval; or what more it would need."""
        iv = self.interval_text(unit)
        if self.state == VerdictState.DECIDED:
            way = "larger" if self.direction > 0 else "smaller"
            extra = (f"; smaller than the {self.margin:g}{unit} worth resolving"
                     if self.within_margin else "")
            return f"decided: {what} is {way} ({b} vs {a}) {iv}{extra}"
        if self.state == VerdictState.EQUIVALENT:
            return f"equivalent: |{what}| < {self.margin:g}{unit} {iv}"
        if not self.budget_spent:
            return f"undecided so far {iv}"
        need = (f"about {self.rounds_needed} rounds would resolve it at {self.need_basis}"
                if self.rounds_needed else "the noise measured gives no round count")
        return f"undecided after the budget {iv}; {need}"


def decide(diffs: np.ndarray | list[float], *, margin: float = 0.0, max_rounds: int | None = None,
           alpha: float = DEFAULT_ALPHA, c: float = DEFAULT_C,
           power: float = DEFAULT_POWER) -> SequentialVerdict:
    """The verdict on per-round differences (B − A, in round order) after len(diffs) rounds.

    `margin`: the smallest difference worth resolving (same unit); `max_rounds`: the budget
    (None: unlimited, so never "after the budget").
    """
    if margin < 0 or not math.isfinite(margin):
        raise ValueError(f"margin must be a finite number >= 0, got {margin}")
    x = np.asarray(diffs, dtype=np.float64)
    if x.ndim != 1 or not np.isfinite(x).all():
        raise ValueError("per-round differences must be a list of finite numbers")
    n = len(x)
    spent = max_rounds is not None and n >= max_rounds
    if n == 0:
        return SequentialVerdict(VerdictState.UNDECIDED, 0, math.nan, -math.inf, math.inf,
                                 alpha, margin, spent)
    mean_a, lo_a, hi_a = sequence_bounds(x, alpha, c)
    mean, lo, hi = float(mean_a[-1]), float(lo_a[-1]), float(hi_a[-1])
    sd = float(np.std(x, ddof=1)) if n >= 2 else math.nan
    inside = margin > 0 and -margin < lo and hi < margin
    if lo > 0 or hi < 0:
        return SequentialVerdict(VerdictState.DECIDED, n, mean, lo, hi, alpha, margin, spent,
                                 within_margin=inside, sd=sd)
    if inside:
        return SequentialVerdict(VerdictState.EQUIVALENT, n, mean, lo, hi, alpha, margin, spent,
                                 sd=sd)
    # Undecided: the rounds to decide the direction at the measured difference, or to show
    # equivalence when the measured difference sits inside the margin — whichever is fewer.
    targets = [abs(mean)] + ([margin - abs(mean)] if abs(mean) < margin else [])
    options = [r for t in targets if t > 0
               for r in [rounds_for(sd, t, alpha=alpha, c=c, power=power)] if r is not None]
    need = max(min(options), n + 1) if options else None
    return SequentialVerdict(VerdictState.UNDECIDED, n, mean, lo, hi, alpha, margin, spent, sd=sd,
                             rounds_needed=need)


def with_borrowed_spread(v: SequentialVerdict, sd: float, basis: str, *,
                         c: float = DEFAULT_C, power: float = DEFAULT_POWER, unit: str = ""
                         ) -> SequentialVerdict:
    """An undecided verdict whose own rounds cannot estimate their spread (one paired round)
    given the rounds it would need at another spread `sd` (e.g. pooled over the study's other
    comparisons), named by `basis`; any other verdict unchanged. Only the round count borrows
    the spread: the interval and the state stay this comparison's own.

    With no valid paired round at all there is no difference to aim at: the count is then the
    valid paired rounds that resolve any true difference of at least the margin worth resolving
    (`rounds_for` at the margin), and the line says so; with no margin, none is given."""
    if (v.state != VerdictState.UNDECIDED or v.rounds_needed is not None
            or not (math.isfinite(sd) and sd > 0)):
        return v
    if v.n == 0:
        r = rounds_for(sd, v.margin, alpha=v.alpha, c=c, power=power) if v.margin > 0 else None
        if r is None:
            return v
        return replace(v, rounds_needed=r,
                       need_basis=f"{basis} if its runs are valid, for a true difference of "
                                  f"{v.margin:g}{unit} or more")
    if not math.isfinite(v.mean):
        return v
    targets = [abs(v.mean)] + ([v.margin - abs(v.mean)] if abs(v.mean) < v.margin else [])
    options = [r for t in targets if t > 0
               for r in [rounds_for(sd, t, alpha=v.alpha, c=c, power=power)] if r is not None]
    if not options:
        return v
    return replace(v, rounds_needed=max(min(options), v.n + 1), need_basis=basis)


def power_lines(sd: float, rounds_budget: int, diffs: list[float], *, unit: str = " %",
                alpha: float = DEFAULT_ALPHA, c: float = DEFAULT_C,
                power: float = DEFAULT_POWER) -> list[str]:
    """Plain-text power analysis: rounds per difference, and what the budget resolves."""
    if not (math.isfinite(sd) and sd >= 0):
        return ["power analysis: no per-round spread measured yet"]
    cov = f"{100 * (1 - alpha):g} % anytime-valid confidence sequence"
    out = [f"power analysis at a per-round spread of {sd:.3g}{unit} ({cov}, "
           f"{100 * power:g} % chance to decide):"]
    for d in diffs:
        r = rounds_for(sd, d, alpha=alpha, c=c, power=power)
        out.append(f"  a {d:g}{unit} difference needs "
                   + (f"{r} rounds" if r is not None else "more rounds than searched"))
    res = resolvable(sd, rounds_budget, alpha=alpha, c=c, power=power)
    out.append(f"  the budget of {rounds_budget} rounds resolves differences of "
               + (f"{res:.3g}{unit} and more" if math.isfinite(res) else "none (needs ≥ 3)"))
    return out


def energy_verdict(a: np.ndarray, t_a: np.ndarray, b: np.ndarray, t_b: np.ndarray, *,
                   block_a: np.ndarray | None = None, block_b: np.ndarray | None = None,
                   round_a: np.ndarray | None = None, round_b: np.ndarray | None = None,
                   margin_pct: float = 0.0, max_rounds: int | None = None,
                   alpha: float = DEFAULT_ALPHA) -> SequentialVerdict | None:
    """The sequential verdict on B's saving over A, % of A's J/token, from the same repeats
    `host.analysis.paired.energy_difference` takes (values, start times, run and campaign
    round of each).

    Rounds pair as there (`round_pairs`: by campaign round over the rounds both have, else
    each run's repeats averaged and interleaved in time); None when nothing pairs.
    """
    from host.analysis.paired import round_pairs

    pairs = round_pairs(np.asarray(a, np.float64), np.asarray(t_a), np.asarray(b, np.float64),
                        np.asarray(t_b), block_a, block_b, round_a, round_b)
    if pairs is None:
        return None
    return decide((pairs.a - pairs.b) / pairs.a * 100.0, margin=margin_pct,
                  max_rounds=max_rounds, alpha=alpha)
