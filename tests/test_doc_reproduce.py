"""docs/reproduce.md, the paper's study end to end, runs as written on the tiny model: the
same commands in the same order, with the study file swapped for a two-map study of the tiny
model (emulated meter, 2-shot ARC on one local Dask worker) and free ports."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from epi.core.net import free_port
from tests.doc_commands import REPO, commands, run_page

PAGE = REPO / "docs" / "reproduce.md"
MAPS = ("uniform_q8.json", "uniform_q4km.json")


def test_the_page_walks_every_stage() -> None:
    lines = [c.line for c in commands(PAGE)]
    for needed in ("epi quantize", "dask scheduler", "dask worker",
                   "epi campaign hardware/study-paper-llama-3.1-8b.toml --dry-run",
                   "epi report", "epi bundle", "epi compare"):
        assert any(line.startswith(needed) for line in lines), needed
    assert sum(line == "epi campaign hardware/study-paper-llama-3.1-8b.toml"
               for line in lines) == 2  # the campaign, then its resume


@pytest.mark.slow
@pytest.mark.shares_cpu  # no timing of it is checked: it may run beside another test
def test_every_command_of_the_paper_walk_runs_on_the_tiny_model(tiny_model: Path,
                                                                tmp_path: Path) -> None:
    maps = tmp_path / "maps"
    maps.mkdir()
    for name in MAPS:
        shutil.copy(REPO / "quantmaps" / name, maps / name)
    port = free_port()
    (tmp_path / "paper-tiny.toml").write_text(f"""
[study]
name = "paper-tiny"
seed = 2025
repeats = 2
out = "out/campaign-paper-llama-3.1-8b"
baseline = "uniform_q8"

[[models]]
name = "llama-3.1-8b"
path = "{tiny_model}"
maps = [{", ".join(f'"maps/{m}"' for m in MAPS)}]

[run]
tokens = 16
repeats_per_run = 2
warmups = 0
idle_s = 0.5
cooldown_s = 0

[meter]
emulate = true

[accuracy]
benchmarks = {{ arc_challenge = 10 }}
shots = {{ arc_challenge = 2 }}
cluster = "tcp://127.0.0.1:{port}"
cluster_workers = 1

[analysis]
cv_threshold = 1.0  # the walk is under test here, not a quiet machine (default gates: e2e tests)
""")
    subs = {"hardware/study-paper-llama-3.1-8b.toml": "paper-tiny.toml",
            "Llama-3.1-8B-Instruct-F16.gguf": str(tiny_model), "quantmaps/": "maps/",
            "8786": str(port)}
    run_page(PAGE, tmp_path, subs)
    camp = tmp_path / "out" / "campaign-paper-llama-3.1-8b"
    assert (camp / "report" / "report.html").is_file()
    assert (tmp_path / "report-again" / "report.md").is_file()
    assert (tmp_path / "lab-a.epi-bundle.tar.gz").is_file()
    acc = sorted((camp / "accuracy").glob("*.json"))
    assert len(acc) == len(MAPS)
