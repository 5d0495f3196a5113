"""A split configuration in a study file (docs/campaign.md, "Split configurations"): prefill on
one of a model's maps, decode on another, measured by the campaign as one configuration beside
its parents (tiny model, emulated meter daemon, real llama.cpp runs)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from epi.core.errors import UserError
from host.campaign.plan import build_plan, configurations
from host.campaign.study import load_study
from tests.host.campaign_fixtures import run_tables, write_prompts

REPO = Path(__file__).resolve().parents[2]
MAPS = REPO / "quantmaps"


def _study(tmp_path: Path, model: Path, splits: str, *, rounds: int = 2) -> Path:
    prompts = write_prompts(tmp_path / "prompts.json")
    p = tmp_path / "study.toml"
    p.write_text(f"""
[study]
name = "split"
seed = 5
out = "camp"
repeats = {rounds}

[[models]]
name = "tiny"
path = "{model}"
maps = ["{MAPS}/uniform_q8.json", "{MAPS}/uniform_q4km.json"]
splits = {splits}

[meter]
emulate = true
rate_hz = 40

[analysis]
cv_threshold = 0.5           # the mechanics are under test, not a quiet machine
max_resolution_frac = 0.05
lag = "auto"
{run_tables(prompts)}""")
    return p


SPLIT = '[{ id = "q8_prefill_q4_decode", prefill = "uniform_q8", decode = "uniform_q4km" }]'


def test_a_split_is_a_configuration_of_its_parents_files(tmp_path: Path,
                                                        tiny_model: Path) -> None:
    study = load_study(_study(tmp_path, tiny_model, SPLIT))
    configs = {c.config_id: c for c in configurations(study)}
    split = configs["q8_prefill_q4_decode"]
    assert split.is_split and split.parents == ("uniform_q8", "uniform_q4km")
    assert split.gguf == configs["uniform_q8"].gguf
    assert split.decode_gguf == configs["uniform_q4km"].gguf
    plan = build_plan(study)
    ids = [s.step_id for s in plan.steps]
    assert "quantize:q8_prefill_q4_decode" not in ids  # nothing of its own to quantize
    assert sum(1 for s in plan.run_steps if s.config == "q8_prefill_q4_decode") == 2


@pytest.mark.parametrize(("splits", "problem"), [
    ('[{ id = "s", prefill = "uniform_q8", decode = "nope" }]',
     "'models.splits[0].decode': 'nope' is not a configuration of model 'tiny'"),
    ('[{ id = "s", prefill = "uniform_q8", decode = "uniform_q8" }]',
     "the same configuration as prefill"),
    ('[{ id = "s", prefill = "uniform_q8" }]', "models[0].splits[0].decode': missing"),
    ('["s"]', "expected a table"),
    ('[{ id = "s\\n", prefill = "uniform_q8", decode = "uniform_q4km" }]', "splits[0].id"),
    ('[{ id = "uniform_q8", prefill = "uniform_q8", decode = "uniform_q4km" }]',
     "configuration id 'uniform_q8' is used twice"),
])
def test_a_bad_split_is_one_line_naming_the_field(tmp_path: Path, tiny_model: Path,
                                                  splits: str, problem: str) -> None:
    with pytest.raises(UserError) as exc:
        configurations(load_study(_study(tmp_path, tiny_model, splits)))
    assert problem in str(exc.value) and "\n" not in str(exc.value)


@pytest.mark.slow
@pytest.mark.shares_cpu  # one thread of llama.cpp beside the meter daemon, its gates set for a
                         # loaded machine: it runs beside another test (tests/conftest.py)
def test_a_campaign_measures_a_split_beside_its_parents(tmp_path: Path,
                                                       tiny_model: Path) -> None:
    study = _study(tmp_path, tiny_model, SPLIT)
    r = subprocess.run([sys.executable, "-m", "epi", "campaign", str(study)], cwd=REPO,
                       capture_output=True, text=True, timeout=880, check=False)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-4000:]
    camp = tmp_path / "camp"
    runs = sorted((camp / "runs" / "q8_prefill_q4_decode").glob("round*-attempt1"))
    assert len(runs) == 2
    header = json.loads((runs[0] / "run.json").read_text())
    assert header["split"]["decode"]["map_id"] == "uniform_q4km"
    assert header["model"]["map_id"] == "q8_prefill_q4_decode"
    # the handover is stamped in every measured request of the split's runs
    events = pd.read_csv(runs[0] / "events.csv")
    measured = events[events["warmup"] == 0]
    assert (measured["event"] == "handover_end").sum() == measured["request_id"].nunique()
    res = pd.read_csv(camp / "analysis" / "results.csv")
    rows = res[(res["scope"] == "all")]
    for cfg in ("q8_prefill_q4_decode", "uniform_q8", "uniform_q4km"):
        got = set(zip(rows[rows["config"] == cfg]["phase"], rows[rows["config"] == cfg]["unit"],
                      strict=True))
        assert {("prefill", "prompt"), ("decode", "generated"), ("request", "generated")} <= got
    # the split beside its parents, per phase, with the paired differences and the answer
    splits = json.loads((camp / "analysis" / "splits.json").read_text())
    assert splits["splits"][0]["prefill"] == "uniform_q8"
    assert len(splits["differences"]) == 6  # 2 parents x 3 phases
    report = (camp / "report" / "report.md").read_text()
    assert "## Split configurations beside their parents" in report
    assert "Does any split configuration" in report
    assert splits["splits"][0]["verdict"] in report  # the same verdict as the analysis
    # figures mark the split as such (the per-phase energy figure's text alternative)
    assert "q8_prefill_q4_decode (split: prefill on uniform_q8, decode on uniform_q4km)" \
        in report
