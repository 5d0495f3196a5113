"""A resumed campaign trusts a `done` line only when the step's output is on disk.

A step journaled done whose output is missing (deleted, moved, or outside this campaign's
directory) is taken back to not done, with one line saying so, and runs again; the analysis
and the report after it run again too, since they described the old outputs. Nothing is
deleted or renamed here.
"""

from __future__ import annotations

from pathlib import Path

from host.campaign.journal import Done, JournalState
from host.campaign.layout import Layout
from host.campaign.plan import CLOSING_STEPS, Plan, Step, StepKind

# step kinds whose done line stands for the analysis and report made from them
FEEDS_ANALYSIS = (StepKind.QUANTIZE, StepKind.ACCURACY, StepKind.RUN)


def expected_output(step: Step, ev: Done, layout: Layout) -> tuple[Path | None, str]:
    """(the path a finished step must have left, its result field); None: the result names
    none (or one outside the campaign)."""
    r = ev.result
    if step.kind == StepKind.ANALYSIS:
        return layout.analysis / "results.json", "analysis"
    if step.kind == StepKind.REPORT:
        return layout.report_html, "report"
    if step.kind == StepKind.PREPARE:
        path = r.get("path")
        return (Path(path) if path else None), "result.path"
    if step.kind == StepKind.DATA:
        return (Path(r["root"]) if "root" in r else None), "result.root"
    key = {"quantize": "output", "accuracy": "out", "run": "run_dir"}[step.kind]
    text = r.get(key)
    return (layout.root / text if isinstance(text, str) else None), f"result.{key}"


def verify_done(plan: Plan, state: JournalState, layout: Layout) -> list[str]:
    """Take back every done step of `plan` whose output is missing (and the analysis and
    report after one that fed them); the lines say which and why."""
    lines: list[str] = []
    redo_analysis = False
    for step in plan.steps:
        ev = state.done.get(step.step_id)
        if ev is None:
            continue
        path, field = expected_output(step, ev, layout)
        if path is None:
            why = f"its journal line names no {field} inside {layout.root}"
        elif not path.exists():
            why = f"its output {path} is missing"
        elif step.kind in CLOSING_STEPS and redo_analysis:
            why = "a step it was made from runs again"
        else:
            continue
        del state.done[step.step_id]
        redo_analysis = (redo_analysis or step.kind in FEEDS_ANALYSIS
                         or step.kind == StepKind.ANALYSIS)
        lines.append(f"  {step.step_id} was journaled done but {why}: it runs again")
    return lines
