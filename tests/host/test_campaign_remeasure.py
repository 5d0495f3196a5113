"""A run refused for its repeat spread is measured again at once while its configuration has no
valid run (host/campaign/remeasure.py): the reason test, the directory names, the round values
of a round with two runs, the rule's every condition, and the campaign loop end to end with
the measuring faked (each "run" is refused or valid as the test scripts it), including a
resumed campaign that plans the same re-measures and measures nothing again."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from host.analysis.model import Options
from host.analysis.paired import campaign_round
from host.analysis.verdicts import repeat_cv_problem, worth_measuring_again
from host.campaign import adaptive as ad
from host.campaign.execute import Campaign
from host.campaign.journal import Done, Journal, JournalState, StepResult
from host.campaign.layout import Layout
from host.campaign.plan import Step, build_plan
from host.campaign.remeasure import Remeasurer, RunCheck, add_recorded_takes, take_step
from host.campaign.study import load_study
from tests.host.test_campaign_decide import write_study


def _cv_reason(values: list[float]) -> list[str]:
    """The reasons the analysis' own repeat-CV check gives for these repeat values."""
    rep = pd.DataFrame({"run_id": "r", "scope": "all", "phase": "decode", "unit": "generated",
                        "basis": "net", "j_per_token": values})
    reasons: list[str] = []
    repeat_cv_problem(rep, "r", "decode", Options(energy_basis="net"), reasons)
    return reasons


def test_only_a_refusal_for_the_repeat_spread_alone_is_worth_measuring_again() -> None:
    spread = _cv_reason([1.0, 1.1])  # CV 6.7 % > 3 %
    assert len(spread) == 1 and worth_measuring_again("; ".join(spread))
    assert _cv_reason([1.0, 1.001]) == []  # under the gate: no reason at all
    null = _cv_reason([float("nan"), float("nan")])
    assert null and not worth_measuring_again("; ".join(null))  # null repeats: not spread
    # a faults/gaps crossing cannot be told from a dead channel (tests/host/test_analyze.py
    # checks the analysis' real faults reason)
    faults = ("1 of 6 decode window(s) cross faults/gaps (request 4 (repeat 1); first: "
              "bus_error: no answer)")
    assert not worth_measuring_again(faults)
    assert not worth_measuring_again("; ".join([*spread, faults]))
    saturated = "meter saturated: 3 reading(s) at full scale"
    assert not worth_measuring_again("; ".join([*spread, saturated]))
    assert not worth_measuring_again(saturated)
    assert not worth_measuring_again("")


def test_a_re_measure_has_its_own_directory_in_the_same_round(tmp_path: Path) -> None:
    base = Step("run:a:2", "run", "a", 2)
    lay = Layout(tmp_path)
    first, again = lay.run_dir(base, 1), lay.run_dir(take_step(base, 3), 1)
    assert first.name == "round2-attempt1" and again.name == "round2-take3-attempt1"
    assert campaign_round(first) == campaign_round(again) == 2
    assert campaign_round(tmp_path / "runs" / "a" / "round2-take3-attempt1.interrupted") is None


def test_a_round_with_two_runs_counts_the_mean_of_its_valid_repeats() -> None:
    rep = pd.DataFrame({
        "run_id": ["a1", "a1", "a1b", "a1b", "a2", "a2", "a2b", "a2b", "a3", "a3"],
        "config": "A", "scope": "all", "phase": "request", "unit": "generated", "basis": "net",
        "j_per_token": [9.0, 9.0, 1.0, 3.0, 2.0, 4.0, 6.0, 8.0, 5.0, 5.0]})
    runs = pd.DataFrame({"run_id": ["a1", "a1b", "a2", "a2b", "a3"], "phase": "request",
                         "valid": [False, True, True, True, False]})
    rounds = {"a1": 1, "a1b": 1, "a2": 2, "a2b": 2, "a3": 3}
    v = ad.round_values(rep, runs, rounds, basis="net")["A"]
    assert v[1] == 2.0  # the refused run's 9s are not counted, the re-measure's mean is
    assert v[2] == np.mean([2.0, 4.0, 6.0, 8.0])  # two valid runs: all four repeats
    assert v[3] is None  # no valid run in round 3


class _Fake:
    """Finished runs (journaled in a JournalState) and their scripted checks."""

    def __init__(self, tmp_path: Path, budget_s: float | None = None, remeasure: int = 2,
                 run_s: float = 40.0) -> None:
        tmp_path.mkdir(parents=True, exist_ok=True)
        study = load_study(write_study(tmp_path, "[decide]\nmin_rounds = 3"))
        self.root = study.out
        self.plan = build_plan(study)
        self.state = JournalState()
        self.checks: dict[str, RunCheck] = {}
        self.run_s = run_s
        self.r = Remeasurer(self.root, self.plan, remeasure, budget_s,
                            lambda d: self.checks[d.name])

    def finish(self, step: Step, check: RunCheck) -> Path:
        d = Layout(self.root).run_dir(step, 1)
        d.mkdir(parents=True)
        (d / "run.json").write_text(json.dumps({"started_mono_ns": 0,
                                                "ended_mono_ns": int(self.run_s * 1e9)}))
        self.state.done[step.step_id] = Done(step.step_id, 1,
                                             {"run_dir": str(d.relative_to(self.root))})
        self.checks[d.name] = check
        return d

    def step(self, config: str, round_k: int) -> Step:
        return next(s for s in self.plan.run_steps if s.config == config and s.round == round_k)


SPREAD = RunCheck(False, True, "decode: repeat CV 4.0% of net J/token above 3.0%")
OTHER = RunCheck(False, False, "decode: meter saturated")
VALID = RunCheck(True, False, "")


def test_the_rule_re_measures_a_spread_refusal_only_and_says_what_the_round_would_lose(
        tmp_path: Path) -> None:
    f = _Fake(tmp_path)
    s = f.step("uniform_q8", 1)
    f.finish(s, SPREAD)
    got = f.r.next_take(s, f.state)
    assert got is not None
    take, line = got
    assert take.step_id == "run:uniform_q8:1:take2" and take.round == 1 and take.take == 2
    assert "refused for its repeat spread only" in line and "no valid run yet" in line
    # another reason: measuring again would be refused the same way
    o = f.step("mix_high_early", 1)
    f.finish(o, OTHER)
    assert f.r.next_take(o, f.state) is None
    # a configuration with a valid run (another round) is measured again too: its round's
    # pairs are lost without it, and the line says so
    v = f.step("mix_high_late", 1)
    f.finish(v, VALID)
    w = f.step("mix_high_late", 2)
    f.finish(w, SPREAD)
    got = f.r.next_take(w, f.state)
    assert got is not None and got[0].step_id == "run:mix_high_late:2:take2"
    assert "lose round 2's pairs" in got[1] and "no valid run yet" not in got[1]
    # a valid run is not measured again
    assert f.r.next_take(v, f.state) is None


def test_the_rule_stops_at_its_limit_and_at_the_time_budget(tmp_path: Path) -> None:
    f = _Fake(tmp_path / "limit", remeasure=2)
    s = f.step("uniform_q8", 1)
    f.finish(s, SPREAD)
    t2 = take_step(s, 2)
    f.finish(t2, SPREAD)
    t3 = take_step(s, 3)
    f.finish(t3, SPREAD)
    assert f.r.next_take(t2, f.state) is not None  # take 3 is within remeasure = 2
    assert f.r.next_take(t3, f.state) is None  # a fourth run would be a third re-measure
    # budget: 3 runs of 40 s measured and 9 planned runs left (rounds 1-3 of 4 maps), which
    # run whatever the budget: a re-measure fits in (3 + 9 + 1) × 40 = 520 s, not in 519 s
    g = _Fake(tmp_path / "budget", budget_s=520.0)
    for cfg in ("uniform_q8", "mix_high_early", "mix_high_late"):
        g.finish(g.step(cfg, 1), SPREAD)
    assert len([s for s in g.plan.run_steps if s.step_id not in g.state.done]) == 9
    assert g.r.next_take(g.step("mix_high_late", 1), g.state) is not None
    h = _Fake(tmp_path / "budget2", budget_s=519.0)
    for cfg in ("uniform_q8", "mix_high_early", "mix_high_late"):
        h.finish(h.step(cfg, 1), SPREAD)
    assert h.r.next_take(h.step("mix_high_late", 1), h.state) is None


def test_a_resume_catches_up_only_its_last_round(tmp_path: Path) -> None:
    """An earlier round's refused run is not re-measured on resume (it was decided on long
    ago); the last round's is."""
    f = _Fake(tmp_path)
    f.finish(f.step("uniform_q8", 1), SPREAD)
    f.finish(f.step("mix_high_early", 2), SPREAD)
    ran: list[str] = []

    def run(s: Step) -> None:
        ran.append(s.step_id)
        f.finish(s, VALID)

    f.r.catch_up(f.state, run, lambda line: None)
    assert ran == ["run:mix_high_early:2:take2"]


def test_recorded_re_measures_are_planned_after_their_round(tmp_path: Path) -> None:
    study = load_study(write_study(tmp_path, "[decide]\nmin_rounds = 3"))
    plan = build_plan(study)
    add_recorded_takes(plan, ["run:uniform_q8:2:take3", "run:uniform_q8:2:take2",
                              "run:nobody:1:take2", "run:uniform_q8:9:take2", "quantize:x"])
    ids = [s.step_id for s in plan.steps]
    base = ids.index("run:uniform_q8:2")
    assert ids[base + 1:base + 3] == ["run:uniform_q8:2:take2", "run:uniform_q8:2:take3"]
    assert not any("nobody" in i or ":9:" in i for i in ids)  # no such round or configuration


# ---------------------------------------------------------------- the campaign, measuring faked
SCRIPT = {  # step id → what the check of its run finds (unnamed: valid)
    "run:uniform_q8:1": SPREAD,                 # → take 2, valid
    "run:mix_high_early:1": SPREAD,             # → takes 2 and 3 refused, no fourth (limit 2)
    "run:mix_high_early:1:take2": SPREAD,
    "run:mix_high_early:1:take3": SPREAD,
    "run:mix_high_early:2": SPREAD,             # still no valid run → take 2, valid
    "run:mix_high_late:1": OTHER,               # not for its spread: not measured again
    "run:mix_high_late:2": SPREAD,              # → take 2, valid
    "run:uniform_q4km:2": SPREAD,               # valid in round 1: its round 2 pairs → take 2
}
EXPECTED = ["run:uniform_q8:1:take2", "run:mix_high_early:1:take2",
            "run:mix_high_early:1:take3", "run:mix_high_early:2:take2",
            "run:mix_high_late:2:take2", "run:uniform_q4km:2:take2"]


def _fake_campaign(monkeypatch: pytest.MonkeyPatch, ran: list[str]) -> None:
    import host.analysis.output
    from host.campaign import execute

    def fake_run_step(self: Campaign, step: Step, state: JournalState, progress: object
                      ) -> tuple[StepResult, None]:
        lay = self.layout
        result: StepResult = {}
        if step.kind == "quantize":
            out = lay.root / "models" / f"{step.config}.gguf"
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_bytes(b"GGUF")
            result = {"output": str(out.relative_to(lay.root))}
        elif step.kind == "run":
            ran.append(step.step_id)
            d = lay.run_dir(step, 1)
            d.mkdir(parents=True)
            (d / "run.json").write_text(json.dumps({
                "run_id": step.step_id, "started_mono_ns": 0, "ended_mono_ns": 10**10}))
            (d / "check.json").write_text(json.dumps(SCRIPT.get(step.step_id, VALID).__dict__))
            result = {"run_dir": str(d.relative_to(lay.root))}
        elif step.kind == "analysis":
            lay.analysis.mkdir(parents=True, exist_ok=True)
            (lay.analysis / "results.json").write_text("{}")
            result = {"out": str(lay.analysis)}
        elif step.kind == "report":
            lay.report.mkdir(parents=True, exist_ok=True)
            lay.report_html.write_text("<html></html>")
            result = {"out": str(lay.report)}
        ev = Done(step.step_id, 1, result)
        self.journal.append(ev)
        state.done[step.step_id] = ev
        return result, None

    def fake_check(run_dir: Path, trace: object, opts: object) -> RunCheck:
        return RunCheck(**json.loads((run_dir / "check.json").read_text()))

    def fake_analyze_to(out_dir: Path, run_dirs: list[Path], *a: object, **k: object) -> None:
        out_dir.mkdir(parents=True, exist_ok=True)
        rep, runs = [], []
        for d in run_dirs:
            rid = json.loads((d / "run.json").read_text())["run_id"]
            ok = json.loads((d / "check.json").read_text())["valid"]
            rep.append((rid, d.parent.name, "all", "request", "generated", "net", 1.0, 0))
            runs.append((rid, d.parent.name, "request", ok))
        pd.DataFrame(rep, columns=["run_id", "config", "scope", "phase", "unit", "basis",
                                   "j_per_token", "t_start_meter_ns"]).to_csv(
            out_dir / "repeats.csv", index=False)
        pd.DataFrame(runs, columns=["run_id", "config", "phase", "valid"]).to_csv(
            out_dir / "runs.csv", index=False)
        pd.DataFrame([], columns=["config", "scope", "phase", "unit", "basis",
                                  "j_per_token_median", "accuracy", "perplexity"]).to_csv(
            out_dir / "results.csv", index=False)

    monkeypatch.setattr(Campaign, "run_step", fake_run_step)
    monkeypatch.setattr(execute, "check_run", fake_check)
    # the study's meter URL is a stand-in nothing listens on (the steps are faked): the
    # preflight that would refuse it has tests of its own (test_campaign_preflight.py)
    monkeypatch.setattr(execute, "preflight", lambda study: [])
    monkeypatch.setattr(host.analysis.output, "analyze_to", fake_analyze_to)


def test_the_campaign_re_measures_as_the_rule_says_and_a_resume_plans_the_same(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ran: list[str] = []
    _fake_campaign(monkeypatch, ran)
    (tmp_path / "tr").mkdir()
    path = write_study(tmp_path, "[decide]\nmin_rounds = 3\nmax_rounds = 3\nremeasure = 2",
                       meter='url = "http://127.0.0.1:9"\ntrace = "tr"')
    out = io.StringIO()
    Campaign(load_study(path), stream=out).run()
    takes = [s for s in ran if ":take" in s]
    assert sorted(takes) == sorted(EXPECTED), out.getvalue()
    for t in takes:  # each right after the run it re-measures (or its previous take)
        i = ran.index(t)
        assert ran[i - 1].split(":take")[0] == t.split(":take")[0]
    assert len(ran) == 12 + len(EXPECTED)
    said = out.getvalue()
    assert said.count("re-measuring ") == len(EXPECTED)
    assert "re-measuring mix_high_early in round 1 (take 3)" in said
    # the refused runs stay in the campaign: every run directory is still there
    runs_dir = load_study(path).out / "runs"
    assert len(list(runs_dir.glob("*/round*"))) == len(ran)
    # a resumed campaign plans the same re-measures (from its journal) and measures nothing
    again = io.StringIO()
    Campaign(load_study(path), stream=again).run()
    assert len(ran) == 12 + len(EXPECTED) and "nothing to do" in again.getvalue()
    plan = build_plan(load_study(path))
    add_recorded_takes(plan, Journal(load_study(path).out).read().done)
    assert [s.step_id for s in plan.run_steps if s.take > 1] == takes


def test_an_interrupted_re_measure_is_caught_up_on_resume(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The session ended after a refused run and before its re-measure: the resumed campaign
    measures it first."""
    ran: list[str] = []
    _fake_campaign(monkeypatch, ran)
    (tmp_path / "tr").mkdir()
    path = write_study(tmp_path, "[decide]\nmin_rounds = 3\nmax_rounds = 3\nremeasure = 2",
                       meter='url = "http://127.0.0.1:9"\ntrace = "tr"')
    study = load_study(path)
    c = Campaign(study, stream=io.StringIO())
    first = c.plan.run_steps[0]  # journal the first run (refused) as a finished session would
    monkeypatch.setitem(SCRIPT, first.step_id, SPREAD)
    monkeypatch.setitem(SCRIPT, first.step_id + ":take2", VALID)
    state = JournalState()
    for s in c.plan.steps[:c.plan.steps.index(first) + 1]:
        c.run_step(s, state, None)  # type: ignore[arg-type]
    ran.clear()
    out = io.StringIO()
    Campaign(study, stream=out).run()
    assert ran[0] == first.step_id + ":take2", out.getvalue()
    assert first.step_id not in ran


@pytest.mark.parametrize(("value", "problem"), [("-1", "at least 0"), ("21", "at most 20"),
                                                ('"two"', "")])
def test_a_bad_remeasure_is_one_line(tmp_path: Path, value: str, problem: str) -> None:
    from epi.core.errors import UserError

    with pytest.raises(UserError) as e:
        load_study(write_study(tmp_path, f"[decide]\nremeasure = {value}"))
    msg = str(e.value)
    assert "field 'decide.remeasure'" in msg and problem in msg and "\n" not in msg


def test_the_dry_run_states_the_re_measure_rule(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from epi.cli import cli

    p = write_study(tmp_path, "[decide]\nremeasure = 3")
    r = CliRunner().invoke(cli, ["campaign", str(p), "--dry-run"])
    assert r.exit_code == 0, r.output
    assert "re-measure: a run refused only for its repeat spread is measured again at once, " \
           "up to 3 time(s)" in r.output
    (tmp_path / "p").mkdir()
    plain = CliRunner().invoke(cli, ["campaign", str(write_study(tmp_path / "p", "[decide]")),
                                     "--dry-run"])
    assert plain.exit_code == 0 and "re-measure:" not in plain.output
