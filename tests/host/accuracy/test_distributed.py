"""Accuracy on a Dask cluster: item by item the single-process result, merged in order."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from epi.core.errors import UserError
from host.accuracy import distributed, store
from host.accuracy.distributed import (
    ClusterSpec,
    chunks,
    evaluate_on_cluster,
    merge,
    parse_cluster,
)
from host.accuracy.evaluate import Settings, evaluate
from host.accuracy.items import Item, shared_item


def test_parse_cluster() -> None:
    assert parse_cluster("local:2") == ClusterSpec(local_workers=2)
    assert parse_cluster("tcp://127.0.0.1:8786") == ClusterSpec(address="tcp://127.0.0.1:8786")
    for bad in ("local:0", "local:x", "127.0.0.1:8786", "tcp://host", "http://h:1", ""):
        with pytest.raises(UserError, match="--cluster"):
            parse_cluster(bad)


def test_chunks_cover_every_item_once_in_order() -> None:
    for n_items in (1, 2, 7, 200, 3041):
        for workers in (1, 2, 5):
            got = chunks(n_items, workers)
            assert [i for a, b in got for i in range(a, b)] == list(range(n_items))
            assert len(got) <= workers * 4


def _items(n: int) -> list[Item]:
    return [shared_item(f"q{i}", "Q?", ["a", "b"], i % 2) for i in range(n)]


def test_merge_refuses_records_of_other_items() -> None:
    items = _items(3)
    recs = [{"id": it.id, "gold": it.gold, "scores": [[0.0, 1, 1]] * 2} for it in items]
    assert merge(items, [recs[:2], recs[2:]]) == recs
    with pytest.raises(UserError, match="record 0 is for item 'q1'"):
        merge(items, [recs[1:2], recs[:1], recs[2:]])
    with pytest.raises(UserError, match="2 records for 3 items"):
        merge(items, [recs[:2]])


N_ITEMS = 4


def _records(root: Path) -> dict[str, list[object]]:
    """Benchmark name → stored per-item records, from a store directory."""
    out = {}
    for path in sorted(root.rglob("*.json")):
        doc = json.loads(path.read_text())
        if doc["key"]["kind"] == "benchmark":
            out[doc["key"]["benchmark"]] = doc["result"]["records"]
    return out


@pytest.mark.long
def test_two_local_workers_give_the_single_process_result_item_by_item(
        tiny_model: Path, prepared: Path, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A LocalCluster of 2 worker processes (127.0.0.1, 1 thread each) against one process
    with 2 threads, each into its own store: every item's scores are equal, float for float,
    and so is every figure of the results document."""
    # N_ITEMS a benchmark: 12 one-item chunks for the 2 workers (the count is not the point:
    # 7 cost more scoring, for nothing more proven); ctx 512: the campaign's accuracy step's
    settings = Settings(benches=["arc_challenge", "winogrande", "hellaswag"], n=N_ITEMS,
                        seed=3, ctx=512, threads=2)
    monkeypatch.setenv(store.ENV, str(tmp_path / "single"))
    single = evaluate([tiny_model], settings)
    monkeypatch.setenv(store.ENV, str(tmp_path / "cluster"))
    clustered = evaluate_on_cluster([tiny_model], settings, ClusterSpec(local_workers=2))

    one, two = _records(tmp_path / "single"), _records(tmp_path / "cluster")
    assert set(one) == set(two) == {"arc_challenge", "winogrande", "hellaswag"}
    for bench in one:
        assert len(one[bench]) == N_ITEMS
        assert two[bench] == one[bench], bench  # ids, gold and every score, exactly
    (a,), (b,) = single["models"], clustered["models"]
    for bench, res in a["benchmarks"].items():
        other = b["benchmarks"][bench]
        assert other["scored_by"]["workers"] == 2 and other["cached"] is False
        for field in ("items", "accuracy", "accuracy_norm", "accuracy_token_norm", "ci95", "n"):
            assert other[field] == res[field], (bench, field)
    assert b["composite"] == a["composite"]

    # the cluster's results are in the store: a single-process run now scores nothing,
    # and neither does a campaign's accuracy step for the same model, items and seed
    again = evaluate([tiny_model], settings)
    assert all(r["cached"] for r in again["models"][0]["benchmarks"].values())
    from host.campaign.step import do_accuracy

    step = do_accuracy({"model": str(tiny_model), "benchmarks": dict.fromkeys(one, N_ITEMS),
                        "ppl": None, "ppl_windows": None, "threads": 1, "seed": 3,
                        "out": str(tmp_path / "campaign-acc.json")})
    assert step["cached"] is True
    doc = json.loads((tmp_path / "campaign-acc.json").read_text())
    for bench, res in doc["models"][0]["benchmarks"].items():
        assert res["items"] == b["benchmarks"][bench]["items"], bench


def test_an_unreachable_scheduler_is_one_line(tiny_model: Path, prepared: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(distributed, "CONNECT_TIMEOUT_S", 0.5)  # refused at once: no wait
    settings = Settings(benches=["arc_challenge"], n=2, ctx=64, threads=1)
    with pytest.raises(UserError, match=r"no Dask scheduler at tcp://127\.0\.0\.1:9"):
        evaluate_on_cluster([tiny_model], settings, parse_cluster("tcp://127.0.0.1:9"))
