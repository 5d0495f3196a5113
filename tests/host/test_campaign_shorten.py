"""The dry-run's ways to shorten a study: each saving is the plan's own step estimates
worked out by hand (accuracy stage × (1 − 1/N) on N workers, half of it for half the items,
one round's run steps for one round fewer)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from epi.core.text import format_duration
from host.campaign.plan import build_plan
from host.campaign.shorten import shorten_lines
from host.campaign.study import load_study

REPO = Path(__file__).resolve().parents[2]


def test_each_saving_is_the_plans_own_estimate_worked_out() -> None:
    study = load_study(REPO / "hardware" / "study-paper-llama-3.1-8b.toml")
    plan = build_plan(study)
    acc = sum(s.estimate_s for s in plan.steps if s.kind == "accuracy")
    runs = [s for s in plan.steps if s.kind == "run"]
    rounds = {s.round for s in runs}
    one_round = sum(s.estimate_s for s in runs) / len(rounds)
    lines = shorten_lines(plan, set())
    saved = {re.sub(r":.*", "", line.strip()): line for line in lines[1:]}
    want = {"[accuracy] cluster with 8 Dask workers (local": acc * 7 / 8,
            "[accuracy] cluster with 4 Dask workers (local": acc * 3 / 4,
            "half the items (" + ", ".join(f"{b} = {n // 2}" for b, n in
                                           study.accuracy.benchmarks.items())
            + "; wider accuracy intervals, by about √2)": acc / 2,
            "one round fewer (2 instead of 3": one_round}
    for head, seconds in want.items():
        assert f"saves ~{format_duration(seconds)}" in saved[head], saved[head]
    assert acc > 0 and one_round > 0


def test_nothing_to_shorten_when_every_step_is_done() -> None:
    study = load_study(REPO / "examples" / "study-demo.toml")
    plan = build_plan(study)
    assert shorten_lines(plan, {s.step_id for s in plan.steps}) == []


@pytest.mark.parametrize("n", [4, 8])
def test_a_study_already_on_a_cluster_is_not_told_to_use_one(tmp_path: Path, n: int) -> None:
    src = (REPO / "examples" / "study-demo.toml").read_text().replace(
        "threads = 2                  # scoring is not measured: use both cores",
        f'threads = 2\ncluster = "local:{n}"')
    (tmp_path / "s.toml").write_text(src.replace('"../', f'"{REPO}/').replace(
        'prompts = "prompts-demo-two.json"', f'prompts = "{REPO}/examples/prompts-demo-two.json"'
    ).replace('"maps/demo_q8_q4_q4.json"', f'"{REPO}/examples/maps/demo_q8_q4_q4.json"'))
    lines = shorten_lines(build_plan(load_study(tmp_path / "s.toml")), set())
    assert not any("Dask workers" in line for line in lines)
