"""Does each channel's chain resolve the load it is expected to carry?

A channel whose board-file table records `expected_load_w = [MIN, MAX]` (watts at the wall)
is run through `meter.plan` at that load; every problem the plan finds (below the start-up
threshold, below the 0.1 % current range, under one energy count per prefill window in
`max_count_frac`, ...) becomes one finding with the plan's first remedy. A channel without an
expected load is skipped: nothing says what it must resolve. `epi doctor` (with `EPI_BOARD`)
and the daemon's start-up message list these findings. Pure apart from reading the board.
"""

from __future__ import annotations

from meter.board.config import BoardConfig
from meter.driver.direction import DirectionFinding
from meter.plan import PlanError, PlanOptions, chain_of, plan_channel


def load_findings(board: BoardConfig) -> list[DirectionFinding]:
    """One finding per enabled channel with an expected load (none for a bridge board)."""
    if board.bridge is not None:
        return []
    out = []
    for ch in board.channels:
        load = ch.expected_load_w
        if not ch.enabled or load is None:
            continue
        item = f"load resolution {ch.name}"
        try:
            plan = plan_channel(chain_of(ch, board.sample_period_s), PlanOptions(load_w=load))
        except PlanError as exc:
            out.append(DirectionFinding("meter", item, False, str(exc)))
            continue
        span = f"{load[0]:g}..{load[1]:g} W"
        if plan.resolves:
            low = plan.loads[0]
            out.append(DirectionFinding(
                "meter", item, True,
                f"{span}: {low.counts_per_prefill:.3g} energy counts per prefill window at "
                f"{load[0]:g} W, instrument uncertainty {low.total_uncertainty_pct:.2g} %"))
            continue
        fix = plan.remedies[0] if plan.remedies else "see `epi meter plan`"
        out.append(DirectionFinding(
            "meter", item, False,
            f"{span} is below what the chain resolves: " + "; ".join(plan.problems),
            f"{fix} (all options: epi meter plan BOARD.toml --load-w {load[0]:g}..{load[1]:g})"))
    return out
