"""`epi campaign --dry-run --accuracy-workers N`: the plan's time with the accuracy stage on
N Dask workers beside the metered runs, from the measured (or assumed, said so) per-item time."""

from __future__ import annotations

import re
from pathlib import Path

from click.testing import CliRunner

from epi.cli import cli
from host.campaign.accuracy_projection import AccuracyProjection, offload_lines
from tests.host.accuracy.test_campaign_accuracy_projection import _study

MEASURED = AccuracyProjection(500.0, True, "MEASURED on this machine: …")


def test_offload_splits_the_stage_and_runs_it_beside_the_metered_runs() -> None:
    # 1000 s of accuracy, 300 s of metered runs, 200 s of everything else: 1500 s in all
    stage, runs = offload_lines(MEASURED, 1000.0, 300.0, 1500.0, 4)
    assert "stage 16m40s → 4m10s" in stage and "MEASURED on this machine" in stage
    assert "1500" not in runs and "25m00s → 8m20s" in runs  # 200 + max(250, 300)
    assert "critical path: the metered runs" in runs
    _, runs = offload_lines(MEASURED, 1000.0, 300.0, 1500.0, 2)
    assert "25m00s → 11m40s" in runs and "critical path: accuracy" in runs  # 200 + 500
    assumed = AccuracyProjection(500.0, False, "ASSUMED …")
    assert "ASSUMED (the study file's rate)" in offload_lines(assumed, 10, 1, 12, 3)[0]


def _seconds(text: str) -> int:
    h, m, s = re.fullmatch(r"(?:(\d+)h)?(?:(\d+)m)?(\d+)s", text).groups()  # type: ignore[union-attr]
    return int(h or 0) * 3600 + int(m or 0) * 60 + int(s)


def test_dry_run_with_workers_uses_the_measured_probe(tiny_model: Path, prepared: Path,
                                                      tmp_path: Path) -> None:
    r = CliRunner().invoke(cli, ["campaign", str(_study(tmp_path, tiny_model)), "--dry-run",
                                 "--probe-accuracy", "--accuracy-workers", "2"])
    assert r.exit_code == 0, r.output
    line = next(x for x in r.output.splitlines() if x.startswith("accuracy on 2 Dask"))
    assert "MEASURED on this machine" in line
    before, after = re.search(r"stage (\S+) → (\S+) ", line).groups()  # type: ignore[union-attr]
    assert abs(_seconds(after) - _seconds(before) / 2) <= 1
    assert "study with accuracy offloaded beside the metered runs" in r.output
    assert not (tmp_path / "camp").exists()


def test_accuracy_workers_needs_dry_run(tmp_path: Path) -> None:
    r = CliRunner().invoke(cli, ["campaign", str(_study(tmp_path, tmp_path / "x.gguf")),
                                 "--accuracy-workers", "2"])
    assert r.exit_code == 2 and "--accuracy-workers goes with --dry-run" in r.output
