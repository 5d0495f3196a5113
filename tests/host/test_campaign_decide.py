"""A study's [decide] table and [meter] activity: read, planned, dry-run, and the adaptive loop.

The loop runs against the real plan and journal of a campaign directory with a stand-in for
the measuring (each "run" writes a run.json and its J/token from known true values with
seeded noise; the analysis writes the tables the decision reads): after the minimum rounds
only the configurations of undecided comparisons are measured, every decision is recorded,
the last one lands in the analysis directory, and a resumed campaign's plan holds the rounds
decided before.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from click.testing import CliRunner

from epi.cli import cli
from epi.core.errors import UserError
from host.campaign import adaptive_loop
from host.campaign.adaptive_round import DECISIONS_JSON, assess_dir, decided_rounds
from host.campaign.journal import Done, JournalState
from host.campaign.layout import Layout
from host.campaign.plan import Plan, Step, build_plan
from host.campaign.study import Study, load_study

REPO = Path(__file__).resolve().parents[2]
MAPS = REPO / "quantmaps"
IDS = ["uniform_q8", "mix_high_early", "mix_high_late", "uniform_q4km"]


def write_study(tmp_path: Path, decide: str, meter: str = "emulate = true",
                study_extra: str = "") -> Path:
    (tmp_path / "base.gguf").write_bytes(b"GGUF")
    maps = ", ".join(f'"{MAPS}/{m}.json"' for m in IDS)
    p = tmp_path / "study.toml"
    p.write_text(f"""
[study]
name = "t"
seed = 7
baseline = "uniform_q8"
out = "camp"
{study_extra}

[[models]]
name = "tiny"
path = "base.gguf"
maps = [{maps}]

[run]
tokens = 8

[meter]
{meter}

{decide}
""")
    return p


def test_decide_and_activity_are_read(tmp_path: Path) -> None:
    s = load_study(write_study(tmp_path, """[decide]
compare = ["baseline", "frontier", "baseline"]
min_rounds = 4
max_rounds = 9
time_budget_min = 20
margin_pct = 1.5
alpha = 0.1
assumed_spread_pct = 2
""", meter='emulate = true\nactivity = "machine"'))
    assert s.decide is not None and s.meter.activity == "machine"
    r = s.decide.rules
    assert r.targets == ("baseline", "frontier") and (r.min_rounds, r.max_rounds) == (4, 9)
    assert r.time_budget_s == 1200.0 and r.margin_pct == 1.5 and r.alpha == 0.1
    assert s.decide.assumed_spread_pct == 2.0
    plain = load_study(write_study(tmp_path, ""))
    assert plain.decide is None and plain.meter.activity == "process_tree"


@pytest.mark.parametrize(("decide", "meter", "extra", "field", "problem"), [
    ('[decide]\ncompare = ["everything"]', "emulate = true", "", "decide.compare[0]",
     "is not one of frontier, baseline, ppl_matched, all_pairs"),
    ("[decide]\ncompare = []", "emulate = true", "", "decide.compare", "name at least one"),
    ("[decide]\nmin_rounds = 2", "emulate = true", "", "decide.min_rounds", "at least 3"),
    ("[decide]\nmin_rounds = 5\nmax_rounds = 4", "emulate = true", "", "decide.max_rounds",
     "at least 5"),
    ("[decide]\nmargin_pct = -1", "emulate = true", "", "decide.margin_pct", "at least 0"),
    ("[decide]\nalpha = 0", "emulate = true", "", "decide.alpha", "above 0"),
    ("[decide]\nsurprise = 1", "emulate = true", "", "decide.surprise", "unknown field"),
    ("[decide]", "emulate = true", "repeats = 4", "study.repeats", "with [decide]"),
    ("", 'emulate = true\nactivity = "gpu"', "", "meter.activity", "is not one of"),
    ("", 'url = "http://m:1"\ntrace = "t"\nactivity = "machine"', "", "meter.activity",
     "only for emulate"),
])
def test_bad_decide_or_activity_is_one_line(tmp_path: Path, decide: str, meter: str,
                                             extra: str, field: str, problem: str) -> None:
    with pytest.raises(UserError) as e:
        load_study(write_study(tmp_path, decide, meter, extra))
    msg = str(e.value)
    assert f"field '{field}'" in msg and problem in msg and "\n" not in msg


def test_plan_has_the_minimum_rounds_and_the_dry_run_prints_the_power_analysis(
        tmp_path: Path) -> None:
    p = write_study(tmp_path, "[decide]\nmin_rounds = 3\nmax_rounds = 6\nmargin_pct = 2")
    plan = build_plan(load_study(p))
    assert sorted({s.round or 0 for s in plan.run_steps}) == [1, 2, 3]
    r = CliRunner().invoke(cli, ["campaign", str(p), "--dry-run"])
    assert r.exit_code == 0, r.output
    assert "4 configurations × 3–6 (adaptive) rounds" in r.output
    assert "decide: savings vs baseline; rounds 3–6" in r.output
    assert "spread assumed (decide.assumed_spread_pct; nothing measured yet)" in r.output
    assert "a 2 % difference needs 49 rounds" in r.output  # 3 % spread, 95 %, 80 % power
    assert "the budget of 6 rounds resolves differences of" in r.output


# ---------------------------------------------------------------- the loop, measuring faked
TRUE_J = {"uniform_q8": 0.100, "mix_high_early": 0.090, "mix_high_late": 0.0995,
          "uniform_q4km": 0.080}  # vs q8: −10 %, −0.5 % (close), −20 %


class FakeCampaign:
    """The parts of execute.Campaign the loop uses; runs and analyses are stand-ins."""

    def __init__(self, study: Study) -> None:
        self.study = study
        self.plan: Plan = build_plan(study)
        self.layout = Layout(study.out)
        self.rng = random.Random(5)
        self.ran: list[str] = []

    def run_dirs(self, state: JournalState) -> list[Path]:
        return [self.layout.root / state.done[s.step_id].result["run_dir"]
                for s in self.plan.run_steps if s.step_id in state.done]

    def trace_dir(self) -> Path:
        return self.layout.trace

    def merge_accuracy(self, state: JournalState) -> None:
        pass

    def run(self, step: Step, state: JournalState) -> None:
        """A 'run': its run.json (id, 60 s long) and J/token in a side file."""
        assert step.config is not None
        d = self.layout.root / "runs" / step.config / f"round{step.round}"
        d.mkdir(parents=True)
        (d / "run.json").write_text(json.dumps({
            "run_id": f"{step.config}-{step.round}", "started_mono_ns": 0,
            "ended_mono_ns": 60 * 10**9}))
        drift = 1 + random.Random(f"drift{step.round}").gauss(0, 0.03)  # shared by a round
        (d / "j.txt").write_text(str(TRUE_J[step.config] * drift
                                     * (1 + self.rng.gauss(0, 0.004))))
        state.done[step.step_id] = Done(step.step_id, 1, {"run_dir": str(d.relative_to(
            self.layout.root))})
        self.ran.append(step.step_id)


def fake_analyze_to(out_dir: Path, run_dirs: list[Path], *args: object, **kwargs: object
                    ) -> None:
    """The tables decide_after_round reads, from the fake runs."""
    out_dir.mkdir(parents=True, exist_ok=True)
    rep, runs = [], []
    per: dict[str, list[float]] = {}
    for d in run_dirs:
        doc = json.loads((d / "run.json").read_text())
        cfg = d.parent.name
        j = float((d / "j.txt").read_text())
        rep.append((doc["run_id"], cfg, "all", "request", "generated", "gross", j, 0))
        runs.append((doc["run_id"], cfg, "request", True))
        per.setdefault(cfg, []).append(j)
    pd.DataFrame(rep, columns=["run_id", "config", "scope", "phase", "unit", "basis",
                               "j_per_token", "t_start_meter_ns"]).to_csv(
        out_dir / "repeats.csv", index=False)
    pd.DataFrame(runs, columns=["run_id", "config", "phase", "valid"]).to_csv(
        out_dir / "runs.csv", index=False)
    pd.DataFrame([(c, "all", "request", "generated", "gross", sum(v) / len(v), None, None)
                  for c, v in per.items()],
                 columns=["config", "scope", "phase", "unit", "basis", "j_per_token_median",
                          "accuracy", "perplexity"]).to_csv(out_dir / "results.csv",
                                                            index=False)


def test_loop_adds_rounds_only_for_undecided_configurations_and_resumes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import host.analysis.output

    monkeypatch.setattr(host.analysis.output, "analyze_to", fake_analyze_to)
    study = load_study(write_study(tmp_path, """[decide]
compare = ["baseline"]
min_rounds = 3
max_rounds = 7
margin_pct = 0.1
"""))
    c = FakeCampaign(study)
    state = JournalState()
    for s in c.plan.run_steps:  # the planned minimum rounds
        c.run(s, state)
    said: list[str] = []
    adaptive_loop.run_adaptive_rounds(c, state, lambda s: c.run(s, state), said.append)
    extra = [s for s in c.ran if int(s.rsplit(":", 1)[1]) > 3]
    rounds = decided_rounds(study.out, 3)
    # the clearly different maps are decided early; the close one (−0.5 %, margin 0.1 %)
    # keeps itself and the baseline measured until the budget (round 7)
    assert extra and all(s.split(":")[1] in ("uniform_q8", "mix_high_late") for s in extra)
    assert rounds[-1][0] == 7 and set(rounds[-1][1]) == {"uniform_q8", "mix_high_late"}
    assert any("after round 7" in line and "budget spent" in line for line in said)
    final = json.loads((study.out / "analysis" / DECISIONS_JSON).read_text())
    assert final["budget_spent"] and final["next_configs"] == []
    assert any("uniform_q4km: decided: uniform_q4km uses less energy than uniform_q8, saving 2"
               in line for line in final["lines"])
    assert (assess_dir(study.out, 7) / DECISIONS_JSON).is_file()
    # the new steps sit before the analysis; a resumed campaign plans the same rounds
    kinds = [s.kind for s in c.plan.steps]
    assert kinds.index("analysis") > max(i for i, k in enumerate(kinds) if k == "run")
    again = build_plan(study)
    assert [s.step_id for s in again.run_steps] == [s.step_id for s in c.plan.run_steps]
    # and its loop decides nothing new: every decision is read back
    n_ran = len(c.ran)
    adaptive_loop.run_adaptive_rounds(c, state, lambda s: c.run(s, state), said.append)
    assert len(c.ran) == n_ran


@pytest.mark.long
def test_study_module_imports_without_a_cycle() -> None:
    """study → adaptive/meter and plan → adaptive_round: importable first, in a fresh process."""
    for mod in ("host.campaign.study", "host.campaign.plan", "host.campaign.adaptive_loop",
                "host.campaign.execute"):
        r = subprocess.run([sys.executable, "-c", f"import {mod}"], capture_output=True,
                           text=True, cwd=REPO, check=False)
        assert r.returncode == 0, r.stderr
