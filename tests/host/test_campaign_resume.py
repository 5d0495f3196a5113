"""A small real campaign (tiny model, emulated meter daemon, real llama.cpp runs) killed with
SIGKILL once inside each step kind ends with the same report as an uninterrupted one: every
(configuration, round) counted exactly once, no duplicates, no half-finished run, nothing left
running, and the same measured figures: valid runs, tokens counted and accuracy exactly;
J/Token, EPI, tok/s and power physically bounded, consistent with each other, and within the
spread two identical uninterrupted campaigns show on a loaded machine (see SPREAD).

The kill points cover every step kind the study has (quantize, data, accuracy, run, analysis,
report): one campaign is killed six times, each time inside a step of the next kind in plan
order, so six sessions each resume what the one before was killed in (the seventh finishes).
The test waits until the journal shows such a step started and not finished, freezes the
campaign (SIGSTOP, so it cannot journal the step as done any more), checks the journal again,
then lets the step's own process run on for a seeded random delay and kills the campaign with
SIGKILL. So every kill lands inside its step by construction, not by timing luck; the delay
only decides how far the step got (sometimes to its end, unjournaled).

The uninterrupted reference campaign runs beside the killed one (separate directories, meter
daemons and ports; each daemon's modelled power follows only its own campaign's processes):
the killed one starts once the reference has finished its accuracy steps, so the two never
prepare the evaluation data or write the accuracy cache at the same time. Runs are kept short
(tests/host/campaign_fixtures.py: two of the shipped prompts, 128 tokens, short idle windows).
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from host.campaign.journal import Journal, Started
from host.campaign.procs import MARK_VAR
from host.report import data as report_data
from tests.host.campaign_fixtures import N_PROMPTS, TOKENS, run_tables, write_prompts

REPO = Path(__file__).resolve().parents[2]
MAPS = REPO / "quantmaps"
TIMEOUT_S = 900
KINDS = ("quantize", "data", "accuracy", "run", "analysis", "report")  # this study's, in order
KILLS = KINDS  # one kill inside a step of each kind, in plan order
CONFIGS = ("uniform_q8", "mix_high_early")


def _study(d: Path, model: Path, prompts: Path) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    p = d / "study.toml"
    p.write_text(f"""
[study]
name = "resume"
seed = 11
repeats = 2
out = "camp"
baseline = "uniform_q8"

[[models]]
name = "tiny"
path = "{model}"
maps = ["{MAPS}/uniform_q8.json", "{MAPS}/mix_high_early.json"]

[meter]
emulate = true
rate_hz = 40

[accuracy]
benchmarks = {{ arc_challenge = 10 }}
shots = {{}}  # zero-shot: resuming is under test

[analysis]
lag = "auto"
# repeat CV gate loosened: the modelled power follows the whole machine's CPU, so on a shared
# CI machine identical uninterrupted campaigns differ in J/token CV by other jobs' load
# (measured 9-34 %); the figures compared below still need every run valid under the other
# gates (tests/host/test_default_gates_e2e.py runs the default gates)
cv_threshold = 1.0
# counter-resolution gate loosened: the two prompts' prefill on the tiny model is ~0.6 J a
# repeat on an idle machine, where the emulated counter's 0.0036 J step is 0.6 % (the gate
# says 0.5 %; it refused uniform_q8 once, 2026-11-27); the gate is tested in
# tests/host/test_analyze*.py, the resume mechanics here
max_resolution_frac = 0.05
{run_tables(prompts)}""")
    return p


def _start(study: Path, log: Path) -> subprocess.Popen:
    fh = open(log, "ab")  # noqa: SIM115 - the child writes it; closed when the test ends
    return subprocess.Popen([sys.executable, "-m", "epi", "campaign", str(study)], cwd=REPO,
                            stdout=fh, stderr=subprocess.STDOUT)


def _wait_for(pred, proc: subprocess.Popen, what: str) -> None:
    deadline = time.monotonic() + TIMEOUT_S
    while not pred():
        assert proc.poll() is None, f"campaign ended before {what}"
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def _analysed(camp: Path) -> list[tuple[str, str, str]]:
    doc = json.loads((camp / "analysis" / "results.json").read_text())
    return sorted((r["config"], Path(r["path"]).name.split("-")[0], r["status"])
                  for r in doc["runs"])


def _leftovers(camp: Path) -> list[int]:
    """Processes still carrying a step marker of this campaign."""
    mark = f"{MARK_VAR}={camp.resolve()}".encode()
    daemon = f"{MARK_VAR}=daemon:{camp.resolve()}".encode()
    out = []
    for e in Path("/proc").iterdir():
        if e.name.isdigit():
            try:
                env = (e / "environ").read_bytes()
            except OSError:
                continue
            if mark in env or daemon in env:
                out.append(int(e.name))
    return out


def _open_step(journal: Journal, kind: str) -> Started | None:
    """The journal's `started` event of a step of `kind` that has no `done` line yet."""
    state = journal.read()
    return next((ev for sid, ev in state.interrupted.items() if sid.split(":")[0] == kind),
                None)


def _kill_inside(kind: str, proc: subprocess.Popen, journal: Journal,
                 rng: random.Random) -> Started:
    """SIGKILL the campaign while a step of `kind` is running (see the module docstring);
    returns that step's `started` event."""
    deadline = time.monotonic() + TIMEOUT_S
    while True:
        assert proc.poll() is None, f"campaign ended before a {kind} step started"
        assert time.monotonic() < deadline, f"timed out waiting for a {kind} step"
        if _open_step(journal, kind) is not None:
            os.kill(proc.pid, signal.SIGSTOP)  # frozen: it can no longer journal `done`
            ev = _open_step(journal, kind)
            if ev is not None:
                break
            os.kill(proc.pid, signal.SIGCONT)  # it finished in between: wait for the next
        time.sleep(0.02)
    time.sleep(rng.uniform(0.0, 1.0))  # the step's process runs on meanwhile
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    return ev


# ActivityModel's bounds (meter/emulation/power_models.py): idle 2.7 W, all cores busy 9.5 W
POWER_RANGE_W = (2.7, 9.5)
# identical uninterrupted campaigns on a loaded 2-core machine differed by 1.95x in J/token
# (0.0230 vs 0.0118): the figures of two campaigns agree within this factor, no closer
SPREAD = 3.0
# the invalid-run reasons a loaded machine causes (host/analysis/verdicts.py's texts)
LOAD_REASONS = ("window(s) have fewer than", "cross faults/gaps")


def _num(cell: str) -> float:
    """The point value of a report cell ('0.02296 [0.021, 0.024] 87.5 % n=4' → 0.02296)."""
    return float(cell.split()[0])


def _measured(camp: Path) -> dict[str, dict[str, float | str]]:
    """Per configuration, the report's measured figures (J/Token, EPI, accuracy, tok/s,
    average power, valid runs) and the generated tokens the analysis counted."""
    import pandas as pd

    from host.report.tables import results_table

    t = results_table(report_data.load(camp / "analysis"))
    col = {h: t.headers.index(h) for h in t.headers}
    win = pd.read_csv(camp / "analysis" / "windows.csv")
    req = win[(win["scope"] == "all") & (win["kind"] == "request")]  # warm-ups not in it
    tokens = req.groupby("config")["n_generated_tokens"].sum()
    n_req = req.groupby("config").size()
    runs = pd.read_csv(camp / "analysis" / "runs.csv")
    return {row[col["Config"]]: {
        "j": _num(row[col["J/Token"]]), "epi": _num(row[col["EPI"]]),
        "accuracy": _num(row[col["Accuracy"]]), "tok_s": _num(row[col["tok/s"]]),
        "power_w": _num(row[col["Avg power W"]]), "valid": row[col["valid runs"]],
        "tokens": float(tokens[row[col["Config"]]]),
        "requests": float(n_req[row[col["Config"]]]),
        "invalid": "; ".join(runs.loc[(runs["config"] == row[col["Config"]]) & ~runs["valid"],
                                      "reasons"].fillna("").astype(str))} for row in t.rows}


def _check_figures(a: dict[str, dict[str, float | str]],
                   b: dict[str, dict[str, float | str]]) -> None:
    """The resumed campaign's measured figures: all runs valid, physically bounded, consistent
    with each other, and those of the uninterrupted campaign within the spread of two
    identical campaigns; the tokens counted and the accuracy exactly equal."""
    assert sorted(a) == sorted(b)
    for cfg in a:
        fa, fb = a[cfg], b[cfg]
        for f in (fa, fb):
            # at least one run valid in each; a run may be invalid only for what a loaded
            # machine causes (a stalled sampler, too few sweeps in a window), never for
            # anything a resume could cause (an unfinished or duplicated run, missing data)
            n_valid, n_runs = (int(x) for x in str(f["valid"]).split("/"))
            assert n_runs == 2 and n_valid >= 1, (cfg, f)
            for reason in filter(None, str(f["invalid"]).split("; ")):
                assert any(k in reason for k in LOAD_REASONS), (cfg, reason)
            j, epi, acc, tps, p_w = (float(f[k]) for k in ("j", "epi", "accuracy", "tok_s",
                                                            "power_w"))
            assert POWER_RANGE_W[0] <= p_w <= POWER_RANGE_W[1], (cfg, f)
            assert epi == pytest.approx(j / acc, rel=2e-3), (cfg, f)  # EPI = J/token / acc
            assert j == pytest.approx(p_w / tps, rel=0.15), (cfg, f)  # J/tok = W / (tok/s)
        # each of the same requests counted once: 2 rounds x 2 repeats x the prompts, each
        # request TOKENS tokens
        assert fb["requests"] == fa["requests"] == 2 * 2 * N_PROMPTS, (cfg, fa, fb)
        assert fb["tokens"] == fa["tokens"] == TOKENS * fa["requests"], (cfg, fa, fb)
        assert fb["accuracy"] == fa["accuracy"], cfg  # scored on the same items, same model
        for k in ("j", "epi", "tok_s", "power_w"):
            ratio = float(fb[k]) / float(fa[k])
            assert 1 / SPREAD < ratio < SPREAD, (cfg, k, fa[k], fb[k])


def test_kills_cover_every_step_kind_of_the_study_in_plan_order(tmp_path: Path) -> None:
    from host.campaign.plan import build_plan
    from host.campaign.study import load_study

    prompts = write_prompts(tmp_path / "prompts.json")
    plan = build_plan(load_study(_study(tmp_path, tmp_path / "tiny.gguf", prompts)))
    kinds = list(dict.fromkeys(s.kind for s in plan.steps))
    assert tuple(kinds) == KINDS
    # each kill's kind comes after the one before in the plan: every kill is reachable
    assert list(KILLS) == sorted(set(KILLS), key=KINDS.index) and set(KILLS) == set(KINDS)
    assert {s.config for s in plan.run_steps} == set(CONFIGS)


@pytest.mark.slow
@pytest.mark.shares_cpu  # one thread of llama.cpp beside the meter daemon, its gates set for a
                         # loaded machine: it runs beside another test (tests/conftest.py)
def test_killed_inside_every_step_kind_gives_the_same_report_as_uninterrupted(
        tiny_model: Path, tmp_path: Path) -> None:
    model = tiny_model  # the session's test model: the campaigns only read it
    prompts = write_prompts(tmp_path / "prompts.json")
    rng = random.Random(f"{os.environ.get('EPI_TEST_SEED', '15')}:{'-'.join(KILLS)}")
    a, b = _study(tmp_path / "a", model, prompts), _study(tmp_path / "b", model, prompts)
    camp_a, camp_b = tmp_path / "a" / "camp", tmp_path / "b" / "camp"
    log_a, log_b = tmp_path / "a.log", tmp_path / "b.log"
    # the reference, uninterrupted; the killed campaign starts beside it once the reference
    # has prepared the evaluation data and scored (or read) the accuracy of every model
    pa = _start(a, log_a)
    journal, journal_a = Journal(camp_b), Journal(camp_a)
    killed = []
    try:
        _wait_for(lambda: all(f"accuracy:{c}" in journal_a.read().done for c in CONFIGS), pa,
                  "the reference campaign's accuracy steps")
        for kind in KILLS:
            pb = _start(b, log_b)
            killed.append(_kill_inside(kind, pb, journal, rng))
        pb = _start(b, log_b)
        assert pb.wait(timeout=TIMEOUT_S) == 0, log_b.read_text()[-3000:]
        assert pa.wait(timeout=TIMEOUT_S) == 0, log_a.read_text()[-3000:]
    finally:
        if pa.poll() is None:  # a failure above: stop the reference too
            pa.kill()
            pa.wait()
    out = log_b.read_text()
    assert "resuming the campaign" not in log_a.read_text()
    assert out.count("resuming the campaign") == len(KILLS)
    assert [ev.step.split(":")[0] for ev in killed] == list(KILLS)
    for ev in killed:  # each resumed session said what it took up again
        assert f"{ev.step} was interrupted (attempt {ev.attempt})" in out
        if ev.run_dir and (camp_b / (ev.run_dir + ".interrupted")).exists():
            assert f"its partial run {ev.run_dir} is not counted" in out

    # no finished step was repeated: one `done` line per step, every step done
    lines = [json.loads(x) for x in journal.path.read_text().splitlines()]
    done = [e["step"] for e in lines if e["event"] == "done"]
    assert len(done) == len(set(done)) == len(Journal(camp_a).read().done)
    # the same runs counted, each exactly once, all complete
    expected = sorted((c, f"round{k}", "completed") for c in CONFIGS for k in (1, 2))
    assert _analysed(camp_a) == expected
    assert _analysed(camp_b) == expected
    state = journal.read()
    assert sorted(s for s in state.done if s.startswith("run:")) == sorted(
        f"run:{c}:{k}" for c in CONFIGS for k in (1, 2))
    doc_b = json.loads((camp_b / "analysis" / "results.json").read_text())
    ids = [r["run_id"] for r in doc_b["runs"]]
    assert len(ids) == len(set(ids)) == 4
    # a run the kill cut short was set aside and never analysed
    analysed = {r["path"] for r in doc_b["runs"]}
    for p in (camp_b / "runs").glob("*/*.interrupted*"):
        assert str(p) not in analysed
    # the final report agrees: same configurations, runs, table rows, one settle per run
    ra, rb = report_data.load(camp_a / "analysis"), report_data.load(camp_b / "analysis")
    assert sorted(ra.configs) == sorted(rb.configs)
    assert len(ra.per_run) == len(rb.per_run) == 4 * 3
    _check_figures(_measured(camp_a), _measured(camp_b))
    assert (camp_b / "report" / "report.html").is_file()
    assert len(rb.settles) == 4 and all(x["settled"] for x in rb.settles)
    assert _leftovers(camp_b) == [] and _leftovers(camp_a) == []
