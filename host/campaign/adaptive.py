"""Adaptive rounds: measure until each comparison the study names is settled, or the budget ends.

A study states what it must decide — the Pareto frontier's neighbours, the savings against the
baseline, the perplexity-matched pairs, or all pairs — a minimum and a maximum number of
rounds (or a time budget), and the smallest difference worth resolving (% of J/token). After
the minimum, each round is assessed: every named comparison gets the sequential verdict of
`host.analysis.sequential` (Lai's anytime-valid confidence sequence over the per-round paired
saving (A_r − B_r)/A_r × 100, so looking after every round does not inflate the error
rates); the next round measures **only the configurations of comparisons still undecided**,
in a seeded interleaved order (`round_order`, the same `random.Random(f"{seed}:{k}")` draw as
the fixed plan's rounds), until every comparison is decided or equivalent, or the budget is
spent — then it is "undecided after the budget", with the rounds it would need.

Pure functions: the caller (the campaign) supplies each configuration's per-round value (the
mean of its run's valid repeats, J per generated token; None or absent for an invalid run)
and runs the rounds. Rounds pair by their index: a comparison uses the rounds in which both
of its configurations have a value (`host.analysis.paired.common_rounds`, the rule the
analysis' paired intervals use too).
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import combinations, pairwise
from pathlib import Path

import numpy as np
import pandas as pd

from epi.core.vocabulary import Word
from host.analysis import sequential
from host.analysis.headline import headline_rows
from host.analysis.paired import common_rounds, round_pairs
from host.analysis.sequential import SequentialVerdict
from host.analysis.statistics import pareto_front
from host.analysis.vocabulary import EnergyBasis, Phase, VerdictState


class Target(Word):
    """What `[decide] compare` asks to compare: which pairs of configurations a round decides."""

    FRONTIER = "frontier"
    BASELINE = "baseline"
    PPL_MATCHED = "ppl_matched"
    ALL_PAIRS = "all_pairs"


TARGETS = Target.values()
TARGET_NAMES: dict[str, str] = {Target.FRONTIER: "frontier neighbours",
                                Target.BASELINE: "savings vs baseline",
                                Target.PPL_MATCHED: "perplexity-matched pair",
                                Target.ALL_PAIRS: "pair"}

RoundValues = Mapping[str, Mapping[int, float | None]]  # config → round (1-based) → J/token
MAX_REMEASURE = 20  # re-measures of one refused run, at most


@dataclass(frozen=True)
class DecisionRules:
    """What a study must decide and how long it may measure."""

    targets: tuple[str, ...] = ("baseline",)
    min_rounds: int = 3
    max_rounds: int = 10
    time_budget_s: float | None = None  # measuring time after which no round starts
    margin_pct: float = 2.0  # the smallest difference worth resolving, % of J/token
    alpha: float = sequential.DEFAULT_ALPHA
    remeasure: int = 0  # re-measures of a run refused for its repeat spread (remeasure.py)

    def __post_init__(self) -> None:
        bad = [t for t in self.targets if t not in TARGETS]
        if not self.targets or bad:
            raise ValueError(f"decide: each target must be one of {', '.join(TARGETS)}"
                             + (f", got {', '.join(map(repr, bad))}" if bad else ", got none"))
        if self.min_rounds < 3:
            raise ValueError(f"min_rounds must be >= 3 (the confidence sequence has no finite "
                             f"interval before round 3), got {self.min_rounds}")
        if self.max_rounds < self.min_rounds:
            raise ValueError(f"max_rounds ({self.max_rounds}) must be >= min_rounds "
                             f"({self.min_rounds})")
        if not (math.isfinite(self.margin_pct) and self.margin_pct >= 0):
            raise ValueError(f"margin_pct must be a finite number >= 0, got {self.margin_pct}")
        if self.time_budget_s is not None and not self.time_budget_s > 0:
            raise ValueError(f"time_budget_s must be > 0, got {self.time_budget_s}")
        if not 0 < self.alpha < 1:
            raise ValueError(f"alpha must be in (0, 1), got {self.alpha}")
        if not 0 <= self.remeasure <= MAX_REMEASURE:
            raise ValueError(f"remeasure must be in [0, {MAX_REMEASURE}], got {self.remeasure}")


@dataclass(frozen=True)
class Comparison:
    """A named comparison; the saving is the reference's J/token minus the candidate's, as %
    of the reference's."""

    kind: str  # a TARGETS entry
    # A: the baseline, the dearer of a perplexity-matched pair, else the pair's first config
    reference: str
    candidate: str  # B: the configuration whose saving is stated


def comparisons(rules: DecisionRules, configs: Sequence[str], *, baseline: str | None = None,
                accuracy: Mapping[str, float] | None = None,
                j_per_token: Mapping[str, float] | None = None,
                ppl: Mapping[str, float] | None = None, ppl_tolerance: float = 0.01
                ) -> tuple[list[Comparison], list[str]]:
    """The comparisons the rules name, and a note for each target that names none.

    frontier: neighbours (by J/token) on the Pareto frontier of accuracy against the current
    J/token means; baseline: the baseline (A) against every other configuration;
    ppl_matched: pairs whose perplexities differ by ≤ `ppl_tolerance` (relative), the dearer
    as A; all_pairs: every pair. A pair named twice is compared once (its first kind).
    """
    out: list[Comparison] = []
    notes: list[str] = []
    seen: set[frozenset[str]] = set()

    kind_of: dict[frozenset[str], str] = {}
    named_again: list[str] = []  # this target's pairs that another target compares already

    def add(kind: str, a: str, b: str) -> None:
        if a == b:
            return
        if frozenset((a, b)) not in seen:
            seen.add(frozenset((a, b)))
            kind_of[frozenset((a, b))] = kind
            out.append(Comparison(kind, a, b))
        elif kind_of[frozenset((a, b))] != kind:
            named_again.append(f"{a} → {b} (compared as "
                               f"{TARGET_NAMES[kind_of[frozenset((a, b))]]})")

    j = dict(j_per_token or {})
    for word in rules.targets:
        target = Target(word)
        before = len(out)
        named_again.clear()
        if target is Target.BASELINE:
            if baseline is None or baseline not in configs:
                notes.append("savings vs baseline: the study names no baseline among its "
                             "configurations")
                continue
            for c in configs:
                add(target, baseline, c)
        elif target is Target.ALL_PAIRS:
            for a, b in combinations(configs, 2):
                add(target, a, b)
        elif target is Target.PPL_MATCHED:
            p = {c: v for c, v in (ppl or {}).items() if c in configs and math.isfinite(v)}
            for a, b in combinations([c for c in configs if c in p], 2):
                if abs(p[a] - p[b]) <= ppl_tolerance * min(p[a], p[b]):
                    dear, cheap = (a, b) if j.get(a, 0.0) >= j.get(b, 0.0) else (b, a)
                    add(target, dear, cheap)
        elif target is Target.FRONTIER:
            have = [c for c in configs if c in (accuracy or {}) and c in j]
            if len(have) < 2:
                notes.append("frontier neighbours: needs accuracy and J/token of ≥ 2 "
                             "configurations")
                continue
            acc = np.array([(accuracy or {})[c] for c in have], dtype=np.float64)
            jj = np.array([j[c] for c in have], dtype=np.float64)
            front = sorted((c for c, on in zip(have, pareto_front(acc, jj), strict=True) if on),
                           key=lambda c: j[c])
            for a, b in pairwise(front):
                add(target, a, b)
        if named_again:
            notes.append(f"{TARGET_NAMES[target]}: {'; '.join(named_again)}")
        elif len(out) == before and not any(n.startswith(TARGET_NAMES[target])
                                            for n in notes):
            notes.append(f"{TARGET_NAMES[target]}: no pair to compare")
    return out, notes


def round_values(repeats: pd.DataFrame, runs: pd.DataFrame, round_of_run: Mapping[str, int],
                 *, basis: str = EnergyBasis.GROSS) -> dict[str, dict[int, float | None]]:
    """Per configuration and round: the mean J per generated token of the round's valid repeats.

    `repeats`/`runs` are the analysis' repeats.csv and runs.csv (formats.md §5); a run counts
    when its `request` phase is valid. `round_of_run[run_id]` is the campaign's round of each
    run: rounds come from the campaign, not from the runs' order, because adaptive rounds
    measure only some configurations. A round with a re-measured run (host/campaign/
    remeasure.py) holds several runs of one configuration: its value is the mean over the
    repeats of its valid runs — the rule the analysis' paired intervals use
    (host.analysis.paired: a round's value is the mean of its valid repeats). A round with no
    valid run gives None; a run with no round is left out.
    """
    ok = set(runs[(runs["phase"] == Phase.REQUEST) & runs["valid"].astype(bool)]["run_id"])
    rows = headline_rows(repeats, basis)
    valid: dict[tuple[str, int], list[float]] = {}
    for (cfg, run_id), g in rows.groupby(["config", "run_id"], sort=False):
        k = round_of_run.get(str(run_id))
        if k is None:
            continue
        v = pd.to_numeric(g["j_per_token"], errors="coerce").to_numpy(np.float64)
        key = (str(cfg), int(k))
        got = valid.setdefault(key, [])
        if run_id in ok and len(v) > 0 and bool(np.isfinite(v).all()):
            got.extend(v.tolist())
    out: dict[str, dict[int, float | None]] = {}
    for (cfg, k), v in valid.items():
        out.setdefault(cfg, {})[k] = float(np.mean(v)) if v else None
    return out


def paired_savings_pct(values: RoundValues, a: str, b: str) -> np.ndarray:
    """(A_r − B_r)/A_r × 100 for each round r (in order) in which both have a value — the
    rounds `host.analysis.paired.common_rounds` pairs (the analysis' tables pair the same)."""
    _, xa, xb = common_rounds(values.get(a, {}), values.get(b, {}))
    keep = xa > 0
    return (xa[keep] - xb[keep]) / xa[keep] * 100.0


@dataclass(frozen=True)
class Assessment:
    """One comparison's sequential verdict after the rounds so far."""

    comparison: Comparison
    verdict: SequentialVerdict

    def text(self) -> str:
        """e.g. 'savings vs baseline q8 → q4: decided: q4 uses less energy than q8, saving
        10.2 % [4.71, 15.6] 95 % anytime-valid, n=3'."""
        c, v = self.comparison, self.verdict
        head = f"{TARGET_NAMES[c.kind]} {c.reference} → {c.candidate}: "
        if v.state != VerdictState.DECIDED:
            return head + v.text(c.reference, c.candidate, what=f"saving of {c.candidate}",
                                 unit=" %")
        way = "less" if v.direction > 0 else "more"  # a positive saving: B draws less
        small = (f"; smaller than the {v.margin:g} % worth resolving" if v.within_margin
                 else "")
        return (head + f"decided: {c.candidate} uses {way} energy than {c.reference}, saving "
                + v.interval_text(" %") + small)


def assess(rules: DecisionRules, comps: Sequence[Comparison], values: RoundValues,
           rounds_done: int, *, out_of_time: bool = False) -> list[Assessment]:
    """Each comparison's verdict; the budget counts as spent at max_rounds or `out_of_time`.

    A comparison with a single valid paired round has no spread of its own, so the rounds it
    would need come from the study's pooled per-round spread (`spread_pct`, over the
    comparisons with ≥ 2 paired rounds), said so in its line; its interval stays its own. One
    with no valid paired round gets the valid paired rounds that resolve a true difference of
    the margin or more at that spread."""
    out = []
    pooled = spread_pct(values, comps)
    for c in comps:
        x = paired_savings_pct(values, c.reference, c.candidate)
        spent = out_of_time or rounds_done >= rules.max_rounds
        # decide() knows only this pair's rounds: the budget is the study's, so pass "spent"
        v = sequential.decide(x, margin=rules.margin_pct, alpha=rules.alpha,
                              max_rounds=len(x) if spent else None)
        v = sequential.with_borrowed_spread(
            v, pooled, f"the study's pooled per-round spread ({pooled:.3g} %)", unit=" %")
        out.append(Assessment(c, v))
    return out


def out_of_reach(assessments: Sequence[Assessment], max_rounds: int | None
                 ) -> list[Assessment]:
    """Unsettled comparisons that `max_rounds` cannot settle at the spread measured so far:
    the rounds they would need exceed the limit, or no round count resolves them (a measured
    difference of about 0 and no margin to show equivalence within)."""
    if max_rounds is None:
        return []
    return [s for s in assessments if not s.verdict.settled and s.verdict.n >= 2
            and (s.verdict.rounds_needed is None or s.verdict.rounds_needed > max_rounds)]


def configs_to_measure(assessments: Sequence[Assessment], max_rounds: int | None = None
                       ) -> list[str]:
    """Configurations of comparisons not yet settled (first-named order), for the next round.

    With `max_rounds`, comparisons out of its reach (`out_of_reach`) add no configuration of
    their own while any other comparison is still open: their rounds go to the comparisons
    the limit can settle (a configuration they share with those is measured all the same,
    so they keep gaining pairs). The anytime-valid sequence stays valid whichever rounds are
    measured, so this choice of where to spend rounds cannot bias a verdict. When every open
    comparison is out of reach, all of them are measured, as without the limit."""
    far = {id(s) for s in out_of_reach(assessments, max_rounds)}
    open_ = [s for s in assessments if not s.verdict.settled]
    aim = [s for s in open_ if id(s) not in far] or open_
    want: dict[str, None] = {}
    for s in aim:
        want.setdefault(s.comparison.reference)
        want.setdefault(s.comparison.candidate)
    return list(want)


def round_order(configs: Sequence[str], seed: int, round_k: int) -> list[str]:
    """The seeded, interleaved order of one round (the fixed plan's draw for round k)."""
    order = list(configs)
    random.Random(f"{seed}:{round_k}").shuffle(order)
    return order


def rounds_affordable(time_left_s: float, per_run_s: float, n_configs: int) -> int:
    """Whole rounds of `n_configs` runs that fit in `time_left_s`."""
    if n_configs <= 0 or per_run_s <= 0:
        return 0
    return max(int(time_left_s // (per_run_s * n_configs)), 0)


def spread_pct(values: RoundValues, comps: Sequence[Comparison]) -> float:
    """Pooled per-round standard deviation of the paired savings (%), over the comparisons."""
    ss, df = 0.0, 0
    for c in comps:
        x = paired_savings_pct(values, c.reference, c.candidate)
        if len(x) >= 2:
            ss += float(np.sum((x - x.mean()) ** 2))
            df += len(x) - 1
    return math.sqrt(ss / df) if df else math.nan


def power_lines(rules: DecisionRules, sd_pct: float, basis: str,
                diffs_pct: Sequence[float] = (1.0, 2.0, 5.0, 10.0)) -> list[str]:
    """The plan's power analysis: rounds per difference and what max_rounds resolves."""
    lines = sequential.power_lines(sd_pct, rules.max_rounds,
                                   sorted({*diffs_pct, rules.margin_pct} - {0.0}),
                                   alpha=rules.alpha)
    return [lines[0].rstrip(":") + f"; spread {basis}:", *lines[1:]]


def spread_from_analysis(analysis_dir: Path, *,
                         basis: str = EnergyBasis.GROSS) -> tuple[float, int]:
    """(pooled per-round spread of paired savings %, most paired rounds) from an earlier
    analysis.

    Reads repeats.csv and runs.csv of `analysis_dir` (a finished campaign's, or one before
    it); pairs every two configurations' valid runs by round as the analysis does
    (`round_pairs`: by campaign round over the rounds both have — repeats.csv
    `campaign_round` — else interleaved in time); (nan, 0) when nothing pairs or the files
    are absent.
    """
    try:
        rep = pd.read_csv(analysis_dir / "repeats.csv")
        runs = pd.read_csv(analysis_dir / "runs.csv")
    except (OSError, ValueError, pd.errors.ParserError):
        return math.nan, 0
    need = {"config", "run_id", "scope", "phase", "unit", "basis", "j_per_token",
            "t_start_meter_ns"}
    if not need <= set(rep.columns) or not {"run_id", "phase", "valid"} <= set(runs.columns):
        return math.nan, 0
    ok = set(runs[(runs["phase"] == Phase.REQUEST) & runs["valid"].astype(bool)]["run_id"])
    rows = headline_rows(rep, basis)
    rows = rows[rows["run_id"].isin(ok)]
    per: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = {}
    for cfg, g in rows.groupby("config", sort=True):
        v = pd.to_numeric(g["j_per_token"], errors="coerce").to_numpy(np.float64)
        t = pd.to_numeric(g["t_start_meter_ns"], errors="coerce").to_numpy(np.float64)
        k = (pd.to_numeric(g["campaign_round"], errors="coerce").to_numpy(np.float64)
             if "campaign_round" in g.columns else np.full(len(g), np.nan))
        keep = np.isfinite(v) & np.isfinite(t)
        per[str(cfg)] = (v[keep], t[keep], g["run_id"].to_numpy(object)[keep], k[keep])
    ss, df, n_max = 0.0, 0, 0
    for a, b in combinations(sorted(per), 2):
        (va, ta, ra, ka), (vb, tb, rb, kb) = per[a], per[b]
        pairs = round_pairs(va, ta, vb, tb, ra, rb, ka, kb)
        if pairs is None:
            continue
        x = (pairs.a - pairs.b) / pairs.a * 100.0
        ss += float(np.sum((x - x.mean()) ** 2))
        df += len(x) - 1
        n_max = max(n_max, len(x))
    return (math.sqrt(ss / df), n_max) if df else (math.nan, 0)


def plan_lines(rules: DecisionRules, spread_pct: float, spread_basis: str) -> list[str]:
    """What the study decides, how long it may measure, and the power analysis."""
    budget = (f"; stops starting rounds after {rules.time_budget_s / 60:g} min of measuring"
              if rules.time_budget_s else "")
    lines = [f"decide: {', '.join(TARGET_NAMES[t] for t in rules.targets)}; rounds "
             f"{rules.min_rounds}–{rules.max_rounds}{budget}; after round {rules.min_rounds} "
             f"only configurations of undecided comparisons are measured; smallest difference "
             f"worth resolving {rules.margin_pct:g} % of J/token; "
             f"{100 * (1 - rules.alpha):g} % anytime-valid confidence sequence per comparison "
             "(Lai 1976; docs/analysis.md)"]
    if rules.remeasure:
        lines.append(f"re-measure: a run refused only for its repeat spread is measured again "
                     f"at once, up to {rules.remeasure} time(s) in its round, so its "
                     "comparisons keep the round's pairs; each re-measure counts against the "
                     "budget (docs/campaign.md)")
    return lines + power_lines(rules, spread_pct, spread_basis)
