"""How to shorten a study, and what each option saves: printed by `epi campaign --dry-run`
under the estimate, from the plan's own step estimates (so the savings carry the same basis,
measured or assumed, as the estimate above them)."""

from __future__ import annotations

import math

from epi.core.text import format_duration
from host.campaign.plan import Plan, StepKind, planned_rounds

#: Dask worker counts the accuracy option is shown for
WORKER_OPTIONS = (4, 8)


def shorten_lines(plan: Plan, done: set[str]) -> list[str]:
    left = [s for s in plan.steps if s.step_id not in done]
    acc_s = sum(s.estimate_s for s in left if s.kind == StepKind.ACCURACY)
    run_s = sum(s.estimate_s for s in left if s.kind == StepKind.RUN)
    total = sum(s.estimate_s for s in left)
    if total <= 0:
        return []
    st = plan.study
    options: list[tuple[float, str]] = []
    if acc_s > 0:
        if st.accuracy.cluster is None:
            for n in WORKER_OPTIONS:
                options.append((acc_s * (1 - 1 / n), f"[accuracy] cluster with {n} Dask "
                                f"workers (local:{n} or tcp://…)"))
        if st.accuracy.benchmarks:
            half = ", ".join(f"{b} = {max(10, n // 2)}"
                             for b, n in st.accuracy.benchmarks.items())
            options.append((acc_s / 2, f"half the items ({half}; wider accuracy intervals, "
                            "by about √2)"))
    rounds = planned_rounds(st)
    if run_s > 0 and rounds > 1:
        options.append((run_s / rounds, f"one round fewer ({rounds - 1} instead of {rounds}: "
                        "fewer paired rounds for every comparison)"))
    if not options:
        return []
    if not math.isfinite(total):
        return []  # an estimate without bound (an absurd [estimate] rate): nothing to shorten
    lines = [f"to shorten the study ({format_duration(total)} left):"]
    for saved, what in sorted(options, reverse=True):
        lines.append(f"  {what}: saves ~{format_duration(saved)} "
                     f"({saved / total:.0%})")
    return lines
