"""`epi analyze --json`: the summary validates against its schema and carries the figures of
the results table the same analysis wrote."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pandas as pd
import pytest

from tests.test_json_outputs import validate

REPO = Path(__file__).resolve().parents[2]


def test_analyze_json_validates_and_carries_the_results_files_figures(
        synth_run: Callable[..., tuple[Path, Path, object, object]], tmp_path: Path) -> None:
    trace, run, _, _ = synth_run()
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-m", "epi", "analyze", str(run), "--trace",
                           str(trace), "--out", str(out), "--energy-basis", "net", "--json"],
                          capture_output=True, text=True, cwd=REPO, timeout=120)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    validate(doc, "epi-analysis-summary")
    res = pd.read_csv(out / "results.csv")  # the same analysis's table, read on its own
    head = res[(res["scope"] == "all") & (res["phase"] == "request")
               & (res["unit"] == "generated") & (res["basis"] == "net")]
    assert [c["config"] for c in doc["configurations"]] == list(head["config"])
    for c, (_, r) in zip(doc["configurations"], head.iterrows(), strict=True):
        assert c["j_per_generated_token"]["basis"] == "net"
        assert c["j_per_generated_token"]["median"] == pytest.approx(r["j_per_token_median"])
