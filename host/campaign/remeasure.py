"""Measure a run refused for its repeat spread again, at once, in its own round.

A run whose repeats disagree by more than the repeat-CV gate is refused by the analysis
(host/analysis/verdicts.py), rightly: on a machine whose speed wanders from one ten-second
stretch to the next, whether a run's two repeats agree is a matter of when it ran. A refused
run costs more than itself: the comparisons are paired by round, so every comparison of its
configuration loses that round's pair (a refused baseline run loses it for all of them), and a
configuration all of whose runs were refused has no figure at all. One more run of that
configuration, in the same round, gives the pairs back for the price of one run, where a new
round costs a run of every configuration and loses its own pairs the same way (at a refusal
rate p, each comparison keeps a round with probability (1 − p)² without re-measures and
(1 − p²)² with one; the demo's VM refused p ≈ 0.24). With `[decide] remeasure = N` the
campaign therefore checks every finished run at once (the analysis of that one run on the
live trace, ~0.4 s) and, when

- the run is refused, and every refused phase only for its repeat spread (any other reason —
  too few samples, saturation, clock, lag, counter resolution, a failed run — would refuse the
  next run the same way, and a window crossing faults/gaps cannot be told from a dead channel
  or a daemon that keeps skipping sweeps: `host.analysis.verdicts.worth_measuring_again`),
- the time budget still holds one more run at the mean run duration so far, beside the runs
  the plan still holds (the minimum rounds run whatever the budget, so a re-measure must not
  take their time),

measures the same configuration again in the same round: step `run:<config>:<k>:take<t>`, run
directory `runs/<config>/round<k>-take<t>-attempt<j>`, up to N re-measures per round.

Nothing is hidden or chosen by its value: the refused run stays in the campaign and is
analysed and reported as refused ("invalid runs are reported, not averaged in"); the rule
looks at validity only, never at a figure, so the runs it keeps are drawn exactly as the gate
already draws them — more draws, the same selection. A round with several valid runs of one
configuration counts the mean of their repeats (host.campaign.adaptive.round_values, as the
analysis' paired intervals do). The final analysis judges validity itself (its `lag = "auto"`
estimate spans every run), so a run this check passed can still be refused there, or the other
way round; the check only decides whether to measure again.

A resumed campaign plans the re-measures its journal names (`add_recorded_takes`) and checks
the finished runs of its last round again before going on (the check is a function of the run
and the trace), so an interruption between a refused run and its re-measure loses nothing;
earlier rounds are not revisited.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from pathlib import Path

from epi.core.errors import UserError
from host.analysis.model import Options
from host.analysis.verdicts import worth_measuring_again
from host.campaign import adaptive_loop
from host.campaign.journal import JournalState
from host.campaign.plan import CLOSING_STEPS, Plan, Step, StepKind

TAKE_STEP = re.compile(r"run:(?P<config>.+):(?P<round>[0-9]{1,9}):take(?P<take>[0-9]{1,9})")


def take_step_id(config: str, round_k: int, take: int) -> str:
    """The step id of the `take`-th run of `config` in round `round_k` (take ≥ 2)."""
    return f"run:{config}:{round_k}:take{take}"


def take_step(base: Step, take: int, why: str = "") -> Step:
    """The step that re-measures `base`'s configuration in its round as take `take`."""
    assert base.config is not None and base.round is not None and take >= 2
    return replace(base, step_id=take_step_id(base.config, base.round, take), take=take,
                   detail=f"round {base.round}, re-measure {take - 1}"
                   + (f" ({why})" if why else ""))


def insert_after_slot(plan: Plan, step: Step) -> None:
    """Put take `step` right after the last run of its configuration's round in the plan."""
    at = max((i for i, s in enumerate(plan.steps) if s.kind == StepKind.RUN
              and s.config == step.config and s.round == step.round), default=None)
    if at is None:
        at = next((i for i, s in enumerate(plan.steps) if s.kind in CLOSING_STEPS),
                  len(plan.steps)) - 1
    plan.steps.insert(at + 1, step)


def add_recorded_takes(plan: Plan, step_ids: Iterable[str]) -> None:
    """Plan the re-measures a campaign's journal names (a resumed campaign), in take order.

    A take whose round and configuration the plan does not hold (a study file changed since)
    is left out, like any other step the plan no longer has."""
    known = {s.step_id for s in plan.steps}
    found = []
    for sid in set(step_ids) - known:
        m = TAKE_STEP.fullmatch(sid)
        if m is None:
            continue
        cfg, k, t = m["config"], int(m["round"]), int(m["take"])
        base = next((s for s in plan.run_steps if s.config == cfg and s.round == k
                     and s.take == 1), None)
        if base is not None and t >= 2:
            found.append((k, cfg, t, base))
    for _k, _cfg, t, base in sorted(found, key=lambda x: (x[0], x[1], x[2])):
        insert_after_slot(plan, take_step(base, t))


@dataclass(frozen=True)
class RunCheck:
    """One finished run's validity by the analysis of that run alone."""

    valid: bool  # every phase valid
    transient: bool  # refused, and only for its repeat spread (worth measuring again)
    why: str  # the refused phases and their reasons ("" when valid)


def check_run(run_dir: Path, trace: Path | list[Path], opts: Options) -> RunCheck:
    """Analyse one run against the (live) trace and say whether it is valid; a run the
    analysis cannot take at all (a failed run, no trace under it) is refused, and not as a
    matter of chance."""
    from host.analysis import pipeline

    try:
        a = pipeline.analyze([run_dir], trace, replace(opts, baseline=None), None)
    except UserError as exc:
        return RunCheck(False, False, str(exc))
    v = a.verdicts
    bad = v[~v["valid"].astype(bool)]
    if v.empty:
        return RunCheck(False, False, "no verdict")
    if bad.empty:
        return RunCheck(True, False, "")
    reasons = [str(r) for r in bad["reasons"]]
    why = "; ".join(f"{p}: {r}" for p, r in zip(bad["phase"], reasons, strict=True))
    return RunCheck(False, all(worth_measuring_again(r) for r in reasons), why)


class Remeasurer:
    """Decides, after each finished run, whether its configuration is measured again at once.

    `check(run_dir)` is the validity check (`check_run` on the campaign's trace by default);
    its answers are kept per run directory, so each run is analysed once per session.
    """

    def __init__(self, root: Path, plan: Plan, remeasure: int, time_budget_s: float | None,
                 check: Callable[[Path], RunCheck]) -> None:
        self.root, self.plan = root, plan
        self.remeasure, self.time_budget_s = remeasure, time_budget_s
        self._check = check
        self._checked: dict[Path, RunCheck] = {}

    def check(self, run_dir: Path) -> RunCheck:
        if run_dir not in self._checked:
            self._checked[run_dir] = self._check(run_dir)
        return self._checked[run_dir]

    def _run_dir(self, step: Step, state: JournalState) -> Path | None:
        ev = state.done.get(step.step_id)
        if ev is None or "run_dir" not in ev.result:
            return None
        return self.root / ev.result["run_dir"]

    def next_take(self, step: Step, state: JournalState) -> tuple[Step, str] | None:
        """The re-measure of finished run `step` and the line that says why, or None."""
        if (self.remeasure <= 0 or step.kind != StepKind.RUN or step.config is None
                or step.round is None or step.take > self.remeasure):
            return None
        if take_step_id(step.config, step.round, step.take + 1) in {
                s.step_id for s in self.plan.steps}:
            return None  # planned already (a resumed campaign)
        run_dir = self._run_dir(step, state)
        if run_dir is None:
            return None
        found = self.check(run_dir)
        if found.valid or not found.transient:
            return None
        if self.time_budget_s is not None:
            # the runs the plan still holds (the minimum rounds run whatever the budget) keep
            # their share: a re-measure only takes time the budget has beyond them
            _, spent_s, n = adaptive_loop.runs_so_far(self.root, self.plan, state)
            left = sum(1 for s in self.plan.run_steps if s.step_id not in state.done)
            if n and spent_s + spent_s / n * (1 + left) > self.time_budget_s:
                return None
        take = take_step(step, step.take + 1, "the run before was refused for its repeat spread")
        line = (f"re-measuring {step.config} in round {step.round} (take {take.take}): its run "
                f"was refused for its repeat spread only ({found.why}); "
                + (f"{step.config} has no valid run yet" if not self._has_valid_run(step, state)
                   else f"without a valid run its comparisons lose round {step.round}'s pairs"))
        return take, line

    def _has_valid_run(self, step: Step, state: JournalState) -> bool:
        """Whether `step`'s configuration has a valid finished run (any round)."""
        for other in self.plan.run_steps:
            d = self._run_dir(other, state) if other.config == step.config else None
            if d is not None and self.check(d).valid:
                return True
        return False

    def run_takes(self, step: Step, state: JournalState, run: Callable[[Step], None],
                  say: Callable[[str], None]) -> None:
        """After finished run `step`: plan and `run` its re-measures while the rule asks."""
        cur: Step | None = step
        while cur is not None:
            nxt = self.next_take(cur, state)
            if nxt is None:
                return
            cur, line = nxt
            say(line)
            insert_after_slot(self.plan, cur)
            run(cur)

    def catch_up(self, state: JournalState, run: Callable[[Step], None],
                 say: Callable[[str], None]) -> None:
        """A resumed campaign: the re-measures its last round measured so far still asks for
        (an interruption between a refused run and its re-measure), before anything else is
        measured. Earlier rounds are not revisited: their runs were measured, and decided on,
        long ago (a re-measure now would pair with them in name only)."""
        if self.remeasure <= 0:
            return
        done = [s for s in self.plan.run_steps if s.step_id in state.done and s.round]
        if not done:
            return
        last_round = max(s.round or 0 for s in done)
        for s in list(self.plan.run_steps):
            last = not any(o.config == s.config and o.round == s.round and o.take > s.take
                           for o in self.plan.run_steps)
            if last and s.round == last_round and s.step_id in state.done:
                self.run_takes(s, state, run, say)
