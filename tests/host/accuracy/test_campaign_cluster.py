"""A campaign's accuracy stage on Dask workers, from the study file alone: `[accuracy]
cluster = "local:2"` and `store = DIR` make the campaign's accuracy step score on two local
worker processes into the shared store; the result equals the single-process step's item by
item, and the dry-run's estimate divides the stage by the workers."""

from __future__ import annotations

import io
import json
import os
from pathlib import Path

import pytest

from host.accuracy import store
from host.campaign.execute import Campaign
from host.campaign.journal import JournalState
from host.campaign.plan import Step
from host.campaign.step import do_accuracy
from host.campaign.study import load_study
from tests.host.accuracy.test_distributed import _records

N_ITEMS = 10  # the smallest count a study file takes
REPO = Path(__file__).resolve().parents[3]


def _study(tmp_path: Path, model: Path, accuracy: str) -> Path:
    tmp_path.mkdir(parents=True, exist_ok=True)
    p = tmp_path / "study.toml"
    p.write_text(f"""
[study]
name = "cl"
out = "camp"

[[models]]
name = "tiny"
path = "{model}"
include_base = true

[run]
prompts = "{REPO / 'examples' / 'prompts-demo-long.json'}"

[meter]
emulate = true

[accuracy]
benchmarks = {{ arc_challenge = {N_ITEMS}, hellaswag = {N_ITEMS} }}
shots = {{ hellaswag = 2 }}  # few-shot on the cluster too (the fake data: 12 HellaSwag items)
seed = 3
threads = 1
{accuracy}

[estimate]
accuracy_s_per_item = 1.0
""")
    return p


def _accuracy_args(study_file: Path) -> dict[str, object]:
    c = Campaign(load_study(study_file), stream=io.StringIO())
    (step,) = [s for s in c.plan.steps if s.kind == "accuracy"]
    args, _ = c._args(step, JournalState())
    return dict(args)


@pytest.mark.long
def test_a_study_with_a_local_cluster_scores_on_it_item_by_item_as_one_process(
        tiny_model: Path, prepared: Path, tmp_path: Path) -> None:
    clustered = _accuracy_args(_study(tmp_path / "a", tiny_model,
                                      'cluster = "local:2"\nstore = "shared-store"'))
    assert clustered["cluster"] == "local:2"
    assert clustered["store"] == str((tmp_path / "a" / "shared-store").resolve())
    single = _accuracy_args(_study(tmp_path / "b", tiny_model, 'store = "own-store"'))
    assert single["cluster"] is None

    before = os.environ.get(store.ENV)
    r_cluster = do_accuracy(clustered)  # type: ignore[arg-type]  # the campaign's spec
    r_single = do_accuracy(single)  # type: ignore[arg-type]
    # each step named its study's store for its scorers and put the variable back: a later
    # test of this process scores into its own store, not this one's
    assert os.environ.get(store.ENV) == before
    assert r_cluster["cached"] is False and r_single["cached"] is False
    one = _records(tmp_path / "b" / "own-store")
    two = _records(tmp_path / "a" / "shared-store")  # the campaign's store, not the default
    assert set(one) == set(two) == {"arc_challenge", "hellaswag"}
    for bench in one:
        assert len(one[bench]) == N_ITEMS
        assert two[bench] == one[bench], bench  # ids, gold and every score, exactly
    docs = [json.loads(Path(str(r["out"])).read_text())["models"][0]
            for r in (r_cluster, r_single)]
    for bench, res in docs[1]["benchmarks"].items():
        assert docs[0]["benchmarks"][bench]["scored_by"]["workers"] == 2
        assert docs[0]["benchmarks"][bench]["items"] == res["items"], bench
    assert docs[0]["composite"] == docs[1]["composite"]


def test_the_estimate_divides_the_accuracy_stage_by_the_workers(
        tiny_model: Path, tmp_path: Path) -> None:
    def stage_s(study_file: Path) -> tuple[float, str]:
        plan = Campaign(load_study(study_file), stream=io.StringIO()).plan
        acc: list[Step] = [s for s in plan.steps if s.kind == "accuracy"]
        return sum(s.estimate_s for s in acc), acc[0].detail

    alone, _ = stage_s(_study(tmp_path / "a", tiny_model, ""))
    four, detail = stage_s(_study(tmp_path / "b", tiny_model, 'cluster = "local:4"'))
    assert four == pytest.approx(alone / 4) and "on 4 Dask worker(s)" in detail
    remote, detail = stage_s(_study(tmp_path / "c", tiny_model,
                                    'cluster = "tcp://10.0.0.5:8786"\ncluster_workers = 8'))
    assert remote == pytest.approx(alone / 8)
    unknown, detail = stage_s(_study(tmp_path / "d", tiny_model,
                                     'cluster = "tcp://10.0.0.5:8786"'))
    assert unknown == pytest.approx(alone) and "set [accuracy] cluster_workers" in detail


@pytest.mark.parametrize(("table", "message"), [
    ('cluster = "udp://x"', "cluster"),
    ('cluster = "local:0"', "cluster"),
    ('cluster = "local:2"\ncluster_workers = 3', "cluster_workers"),
    ('store = ""', "store"),
])
def test_a_bad_cluster_or_store_is_one_line_naming_the_field(
        tiny_model: Path, tmp_path: Path, table: str, message: str) -> None:
    from epi.core.errors import UserError

    with pytest.raises(UserError, match=rf"\[accuracy\] {message}|accuracy\.{message}|"
                                        rf"{message}"):
        load_study(_study(tmp_path, tiny_model, table))
