"""A small real campaign (tiny model, emulated meter daemon, real llama.cpp runs) killed twice
with SIGKILL at random moments ends with the same runs counted as an uninterrupted one: every
(configuration, round) exactly once, no duplicates, no half-finished run, nothing left running.
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

from host.campaign.journal import Journal
from host.campaign.procs import MARK_VAR
from host.quant.tiny_model import write_test_model
from host.report import data as report_data

REPO = Path(__file__).resolve().parents[2]
MAPS = REPO / "quantmaps"
TIMEOUT_S = 900


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


def _run_starts(journal: Journal) -> int:
    try:
        lines = journal.path.read_text().splitlines()
    except FileNotFoundError:
        return 0
    n = 0
    for line in lines:
        try:
            ev = json.loads(line)
        except ValueError:
            continue
        n += ev.get("event") == "started" and str(ev.get("step", "")).startswith("run:")
    return n


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


@pytest.mark.slow
def test_killed_twice_counts_the_same_runs_as_uninterrupted(tmp_path):
    model = write_test_model(tmp_path / "tiny.gguf")
    rng = random.Random(int(os.environ.get("EPI_TEST_SEED", "15")))

    # uninterrupted
    a = _study(tmp_path / "a", model)
    pa = _start(a, tmp_path / "a.log")
    assert pa.wait(timeout=TIMEOUT_S) == 0, (tmp_path / "a.log").read_text()[-3000:]

    # killed twice with SIGKILL at random moments inside measured runs, then resumed
    b = _study(tmp_path / "b", model)
    camp_b = tmp_path / "b" / "camp"
    journal = Journal(camp_b)
    log_b = tmp_path / "b.log"
    pb = _start(b, log_b)
    _wait_for(lambda: _run_starts(journal) >= 1, pb, "the first run")
    time.sleep(rng.uniform(0.0, 1.5))
    pb.send_signal(signal.SIGKILL)
    pb.wait()
    first = _run_starts(journal)
    pb = _start(b, log_b)
    _wait_for(lambda: _run_starts(journal) >= first + 2, pb, "two more runs")
    time.sleep(rng.uniform(0.0, 1.5))
    pb.send_signal(signal.SIGKILL)
    pb.wait()
    pb = _start(b, log_b)
    assert pb.wait(timeout=TIMEOUT_S) == 0, log_b.read_text()[-3000:]
    out = log_b.read_text()
    assert out.count("resuming the campaign") == 2
    assert "was interrupted" in out

    camp_a = tmp_path / "a" / "camp"
    runs_a, runs_b = _analysed(camp_a), _analysed(camp_b)
    expected = sorted((c, f"round{k}", "completed") for c in ("uniform_q8", "mix_high_early")
                      for k in (1, 2))
    assert runs_a == expected
    assert runs_b == expected  # same runs counted, each exactly once, all complete
    state = journal.read()
    run_done = [s for s in state.done if s.startswith("run:")]
    assert sorted(run_done) == sorted(f"run:{c}:{k}" for c, k, _ in
                                      ((c, r[-1], s) for c, r, s in expected))
    doc_b = json.loads((camp_b / "analysis" / "results.json").read_text())
    ids = [r["run_id"] for r in doc_b["runs"]]
    assert len(ids) == len(set(ids)) == 4
    # an interrupted run, if the kill hit one mid-way, was set aside and never analysed
    for p in (camp_b / "runs").glob("*/*.interrupted*"):
        assert str(p) not in {r["path"] for r in doc_b["runs"]}
    # the final report data agree: same configurations, same runs, same verdict rows
    ra, rb = report_data.load(camp_a / "analysis"), report_data.load(camp_b / "analysis")
    assert sorted(ra.configs) == sorted(rb.configs)
    assert len(ra.per_run) == len(rb.per_run) == 4 * 3
    assert (camp_b / "report" / "report.html").is_file()
    assert len(rb.settles) == 4 and all(x["settled"] for x in rb.settles)  # one per counted run
    assert _leftovers(camp_b) == [] and _leftovers(camp_a) == []
