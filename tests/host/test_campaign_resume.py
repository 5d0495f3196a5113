"""A small real campaign (tiny model, emulated meter daemon, real llama.cpp runs) killed twice
with SIGKILL ends with the same report as an uninterrupted one: every (configuration, round)
counted exactly once, no duplicates, no half-finished run, nothing left running.

The kill points cover every step kind the study has (quantize, data, accuracy, run, analysis,
report): each case kills the campaign twice, each time inside a step of a given kind. The test
waits until the journal shows such a step started and not finished, freezes the campaign
(SIGSTOP, so it cannot journal the step as done any more), checks the journal again, then lets
the step's own process run on for a seeded random delay and kills the campaign with SIGKILL.
So every kill lands inside its step by construction, not by timing luck; the delay only decides
how far the step got (sometimes to its end, unjournaled).
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
from host.quant.tiny_model import write_test_model
from host.report import data as report_data

REPO = Path(__file__).resolve().parents[2]
MAPS = REPO / "quantmaps"
TIMEOUT_S = 900
KINDS = ("quantize", "data", "accuracy", "run", "analysis", "report")  # this study's, in order
# two kills per campaign, in plan order; together the cases cover every kind
CASES = [("quantize", "run"), ("data", "analysis"), ("accuracy", "report")]


def _study(d: Path, model: Path) -> Path:
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

[run]
tokens = 4
repeats_per_run = 2
warmups = 0
threads = 1
idle_s = 0.5
cooldown_s = 0

[meter]
emulate = true
rate_hz = 20

[accuracy]
benchmarks = {{ arc_challenge = 10 }}

[thermal]
rule = "fixed"
wait_s = 0.2
""")
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


def _table(camp: Path) -> list[list[str]]:
    """The report's results table, without the measured columns that vary run to run
    (J/Token, EPI, tok/s, power) and with the valid count replaced by the run count."""
    from host.report.tables import results_table

    t = results_table(report_data.load(camp / "analysis"))
    keep = [t.headers.index(h) for h in ("Config", "Early", "Middle", "Late", "Size",
                                          "Perplexity", "Accuracy")]
    runs = t.headers.index("valid runs")
    return sorted([row[i] for i in keep] + [row[runs].split("/")[1]] for row in t.rows)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The tiny model and one campaign run without interruption (the reference)."""
    base = tmp_path_factory.mktemp("resume")
    model = write_test_model(base / "tiny.gguf")
    a = _study(base / "a", model)
    pa = _start(a, base / "a.log")
    assert pa.wait(timeout=TIMEOUT_S) == 0, (base / "a.log").read_text()[-3000:]
    return model, base / "a" / "camp"


def test_cases_cover_every_step_kind_of_the_study(tmp_path: Path) -> None:
    from host.campaign.plan import build_plan
    from host.campaign.study import load_study

    plan = build_plan(load_study(_study(tmp_path, tmp_path / "tiny.gguf")))
    kinds = list(dict.fromkeys(s.kind for s in plan.steps))
    assert tuple(kinds) == KINDS
    assert {k for case in CASES for k in case} == set(KINDS)
    for first, second in CASES:  # the second kill's kind comes after the first's
        assert KINDS.index(first) < KINDS.index(second)


@pytest.mark.slow
@pytest.mark.parametrize("kill_in", CASES, ids=["-".join(c) for c in CASES])
def test_killed_twice_gives_the_same_report_as_uninterrupted(
        uninterrupted, kill_in: tuple[str, str], tmp_path: Path) -> None:
    model, camp_a = uninterrupted
    rng = random.Random(f"{os.environ.get('EPI_TEST_SEED', '15')}:{'-'.join(kill_in)}")
    b = _study(tmp_path / "b", model)
    camp_b = tmp_path / "b" / "camp"
    journal = Journal(camp_b)
    log_b = tmp_path / "b.log"
    killed = []
    for kind in kill_in:
        pb = _start(b, log_b)
        killed.append(_kill_inside(kind, pb, journal, rng))
    pb = _start(b, log_b)
    assert pb.wait(timeout=TIMEOUT_S) == 0, log_b.read_text()[-3000:]
    out = log_b.read_text()
    assert out.count("resuming the campaign") == 2
    for ev in killed:  # each resumed session said what it took up again
        assert f"{ev.step} was interrupted (attempt {ev.attempt})" in out
        if ev.run_dir and (camp_b / (ev.run_dir + ".interrupted")).exists():
            assert f"its partial run {ev.run_dir} is not counted" in out

    # no finished step was repeated: one `done` line per step, every step done
    lines = [json.loads(x) for x in journal.path.read_text().splitlines()]
    done = [e["step"] for e in lines if e["event"] == "done"]
    assert len(done) == len(set(done)) == len(Journal(camp_a).read().done)
    # the same runs counted, each exactly once, all complete
    expected = sorted((c, f"round{k}", "completed") for c in ("uniform_q8", "mix_high_early")
                      for k in (1, 2))
    assert _analysed(camp_a) == expected
    assert _analysed(camp_b) == expected
    state = journal.read()
    assert sorted(s for s in state.done if s.startswith("run:")) == sorted(
        f"run:{c}:{k}" for c in ("uniform_q8", "mix_high_early") for k in (1, 2))
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
    assert _table(camp_b) == _table(camp_a)
    assert (camp_b / "report" / "report.html").is_file()
    assert len(rb.settles) == 4 and all(x["settled"] for x in rb.settles)
    assert _leftovers(camp_b) == [] and _leftovers(camp_a) == []
