"""Adaptive rounds in a running campaign: assess, add the next round, run it, repeat.

A study with a [decide] table plans `min_rounds` rounds of every configuration
(host/campaign/plan.py). When they are done, `run_adaptive_rounds` analyses the runs so far
(the live trace, or every meter's; into `assess/round-K/` of the campaign directory), takes
the round's decision (host/campaign/adaptive_round.py: every named comparison's sequential
verdict, the configurations of the undecided ones) and, while some remain and the budget
allows, runs one more interleaved, seeded round of only those configurations, then assesses
again.

Every decision is kept in `assess/round-K/decisions.json`; `decided_rounds` reads them back,
so the plan of a resumed campaign already holds the rounds decided before (its steps are
finished or run again like any other) and the loop continues after the last decision — the
plan stays a pure function of the study file and of what the campaign recorded.

Budget: `max_rounds`, and `time_budget_s` of measuring — the sum of the finished runs'
durations (their run.json), so a resumed campaign counts its earlier sessions — a round is
only started when the mean run duration times its runs (the configurations it measures)
still fits.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from epi.core.files import write_json_atomic
from host.campaign.adaptive import round_order
from host.campaign.adaptive_round import (
    DECISIONS_JSON,
    RoundDecision,
    assess_dir,
    decide_after_round,
)
from host.campaign.budget import settle_line
from host.campaign.journal import JournalState
from host.campaign.layout import Layout
from host.campaign.plan import CLOSING_STEPS, Plan, Step, StepKind
from host.campaign.study import Study


def round_steps(round_k: int, configs: tuple[str, ...], seed: int, estimate_s: float,
                n_comparisons_left: int | None = None) -> list[Step]:
    """The run steps of one adaptive round, in its seeded order."""
    why = ("adaptive" if n_comparisons_left is None
           else f"adaptive: {n_comparisons_left} comparison(s) undecided")
    return [Step(f"run:{cid}:{round_k}", StepKind.RUN, cid, round_k, estimate_s=estimate_s,
                 detail=f"round {round_k} ({why})")
            for cid in round_order(configs, seed, round_k)]


class CampaignLike(Protocol):
    """What the loop needs of host.campaign.execute.Campaign."""

    study: Study
    plan: Plan
    layout: Layout

    def run_dirs(self, state: JournalState) -> list[Path]: ...
    def trace_dir(self) -> Path | list[Path]: ...  # one trace, or every meter's
    def merge_accuracy(self, state: JournalState) -> None: ...


def runs_so_far(root: Path, plan: Plan, state: JournalState
                ) -> tuple[dict[str, int], float, int]:
    """(run_id → round, measuring seconds so far, runs) of the finished runs of `plan` (their
    run.json under the campaign directory `root`): what the time budget counts, here and in
    host/campaign/remeasure.py."""
    rounds: dict[str, int] = {}
    total_s, n = 0.0, 0
    for s in plan.run_steps:
        ev = state.done.get(s.step_id)
        if ev is None or "run_dir" not in ev.result or s.round is None:
            continue
        try:
            doc = json.loads((root / ev.result["run_dir"] / "run.json").read_text())
        except (OSError, ValueError):
            continue
        rounds[str(doc.get("run_id"))] = s.round
        t0, t1 = doc.get("started_mono_ns"), doc.get("ended_mono_ns")
        if isinstance(t0, int) and isinstance(t1, int) and t1 > t0:
            total_s += (t1 - t0) / 1e9
            n += 1
    return rounds, total_s, n


def assess(c: CampaignLike, state: JournalState, round_k: int) -> RoundDecision:
    """The decision after `round_k` rounds (kept: a second call reads it back)."""
    from host.analysis.output import analyze_to

    assert c.study.decide is not None
    rules = c.study.decide.rules
    adir = assess_dir(c.layout.root, round_k)
    rounds, measured_s, n_runs = runs_so_far(c.layout.root, c.plan, state)
    if not (adir / DECISIONS_JSON).is_file():
        c.merge_accuracy(state)
        acc = c.layout.accuracy if c.layout.accuracy.is_file() else None
        opts = c.study.analysis.options(c.study.baseline)
        analyze_to(adir, c.run_dirs(state), c.trace_dir(), opts, acc, option=str(adir))
    opts = c.study.analysis.options(c.study.baseline)
    return decide_after_round(adir, rules, [x.config_id for x in c.plan.configs], rounds,
                              round_k, baseline=c.study.baseline, basis=opts.energy_basis,
                              ppl_tolerance=opts.ppl_tolerance, measured_s=measured_s,
                              per_run_s=measured_s / n_runs if n_runs else None)


def settle_command(analysis_dir: Path) -> str | None:
    """The final decision's command that would settle what the budget left undecided."""
    try:
        value = json.loads((analysis_dir / DECISIONS_JSON).read_text()).get("settle_command")
    except (OSError, ValueError, AttributeError):
        return None
    return value if isinstance(value, str) and value else None


def run_adaptive_rounds(c: CampaignLike, state: JournalState,
                        run: Callable[[Step], None], say: Callable[[str], None]) -> None:
    """Assess after the last planned round; add and `run` rounds until the decision stops.

    `run(step)` runs one step as the campaign runs any other (journal, progress, settle);
    new steps are inserted into the plan before its analysis, so the analysis reads them.
    """
    if c.study.decide is None:
        return
    k = max((s.round or 0) for s in c.plan.run_steps)
    while True:
        d = assess(c, state, k)
        say(f"after round {k}: " + ", ".join(f"{n} {s}" for s, n in sorted(d.states.items()))
            + ("; budget spent" if d.budget_spent else "")
            + (f"; round {k + 1} measures {', '.join(d.next_configs)}" if d.next_configs
               else "; no more rounds")
            + (f" (none for {'; '.join(d.out_of_reach)} alone: beyond decide.max_rounds "
               f"{c.study.decide.rules.max_rounds} at the spread so far)"
               if d.next_configs and d.out_of_reach else ""))
        for line in d.lines:
            say("  " + line)
        if not d.next_configs:
            layout_analysis = c.layout.analysis
            layout_analysis.mkdir(parents=True, exist_ok=True)
            doc = json.loads((assess_dir(c.layout.root, k) / DECISIONS_JSON).read_text())
            _, measured_s, n_runs = runs_so_far(c.layout.root, c.plan, state)
            settle = settle_line(doc, c.study.path, c.layout.root,
                                 measured_s / n_runs if n_runs else None,
                                 c.study.decide.rules.max_rounds)
            # the report and the console give the same command (settle_command)
            write_json_atomic(layout_analysis / DECISIONS_JSON,
                              {**doc, "settle_command": settle})
            return
        k += 1
        per_run = next((s.estimate_s for s in c.plan.run_steps), 0.0)
        steps = round_steps(k, d.next_configs, c.study.seed, per_run,
                            d.states.get("undecided", 0))
        at = next((i for i, s in enumerate(c.plan.steps) if s.kind in CLOSING_STEPS),
                  len(c.plan.steps))
        known = {s.step_id for s in c.plan.steps}
        c.plan.steps[at:at] = [s for s in steps if s.step_id not in known]
        for s in steps:
            if s.step_id not in state.done:
                run(s)
