"""Every study file the repository ships loads, and its `--dry-run` prints the plan
(configurations × rounds, one run step per configuration and round) and a time estimate; a
quantize step whose base file is not on this host has an unknown time, said so, not 1 s."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

from epi.cli import cli
from host.campaign.plan import build_plan, planned_rounds, rounds_text
from host.campaign.study import load_study

REPO = Path(__file__).resolve().parents[2]


def shipped_studies() -> list[str]:
    """Tracked TOML files with a [study] table (the campaign's study files)."""
    files = subprocess.run(["git", "ls-files", "*.toml"], cwd=REPO, capture_output=True,
                           text=True, check=True).stdout.split()
    return sorted(f for f in files
                  if re.search(r"^\[study\]", (REPO / f).read_text(), re.M))


def test_the_known_study_files_are_found() -> None:
    assert {"examples/study-demo.toml", "hardware/study-paper-llama-3.1-8b.toml"} <= set(
        shipped_studies())


@pytest.mark.parametrize("rel", shipped_studies())
def test_shipped_study_dry_run_prints_plan_and_estimate(rel: str, tmp_path: Path) -> None:
    study = load_study(REPO / rel)
    plan = build_plan(study)
    n_cfg, rounds = len(plan.configs), planned_rounds(study)  # [decide]: its minimum
    r = CliRunner().invoke(cli, ["campaign", str(REPO / rel), "--dry-run", "--out",
                                 str(tmp_path / "camp")])
    assert r.exit_code == 0, r.output
    out = r.output
    assert f"{n_cfg} configurations × {rounds_text(study)} rounds, seed {study.seed}" in out
    runs = re.findall(r"^ [ *]\s*\d+\. run:(\S+):(\d+) ", out, re.M)
    assert len(runs) == n_cfg * rounds
    assert sorted(set(runs)) == sorted((c.config_id, str(k)) for c in plan.configs
                                       for k in range(1, rounds + 1))
    est = re.search(r"^estimate: (\S+) left \((.*?)\)", out, re.M)
    assert est and est.group(1) != "0s" and "run " in est.group(2)
    assert re.search(r"^accuracy scoring: ~\S+ per configuration, (ASSUMED|MEASURED)", out,
                     re.M)
    assert "thermal settle before every run:" in out
    assert not (tmp_path / "camp").exists()


def test_paper_study_has_24_maps_and_3_rounds() -> None:
    study = load_study(REPO / "hardware/study-paper-llama-3.1-8b.toml")
    assert len(build_plan(study).configs) == 24 and study.repeats == 3


def test_quantize_time_unknown_when_the_base_file_is_absent(tmp_path: Path) -> None:
    maps = REPO / "quantmaps"
    p = tmp_path / "study.toml"
    p.write_text(f"""
[study]
name = "absent"

[[models]]
name = "big"
path = "/nonexistent/base-F16.gguf"
maps = ["{maps}/uniform_q8.json", "{maps}/uniform_q4km.json"]

[run]
tokens = 8

[meter]
emulate = true
""")
    r = CliRunner().invoke(cli, ["campaign", str(p), "--dry-run"])
    assert r.exit_code == 0, r.output
    q = [x for x in r.output.splitlines() if ". quantize:" in x]
    assert len(q) == 2
    assert all("~       ?" in x and "time unknown: base /nonexistent/base-F16.gguf not on "
               "this host" in x for x in q)
    assert "quantize ?" in r.output and "NOT included: 2 quantize step(s)" in r.output
    assert "~      1s" not in r.output  # the old made-up figure
    # with the file present, the size scales the time again
    base = tmp_path / "base.gguf"
    base.write_bytes(b"\0" * 4_000_000)
    p.write_text(p.read_text().replace("/nonexistent/base-F16.gguf", str(base)))
    r = CliRunner().invoke(cli, ["campaign", str(p), "--dry-run"])
    assert "time unknown" not in r.output and "NOT included" not in r.output
