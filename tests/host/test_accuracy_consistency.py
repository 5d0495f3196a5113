"""An accuracy file that contradicts itself is refused in one line: a composite that
is not the weighted mean of its benchmarks (it turned an EPI of 0.612 into 0.185), two
different entries for one model (the second silently won), and per-item outcomes that
contradict the stated accuracy (they drove the paired comparisons)."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from epi.core.errors import UserError
from host.accuracy.results import read_results

BENCHES = ("hellaswag", "arc_challenge", "mmlu")


def _bench(outcomes: list[int]) -> dict[str, object]:
    n = len(outcomes)
    acc = sum(outcomes) / n
    return {"n": n, "accuracy": acc, "ci95": [0.0, 1.0], "accuracy_norm": acc,
            "ci95_norm": [0.0, 1.0],
            "items": {"ids": [f"i{k}" for k in range(n)], "accuracy": outcomes,
                      "accuracy_norm": outcomes}}


def _entry(sha: str, outcomes: dict[str, list[int]], weights: dict[str, float]
           ) -> dict[str, object]:
    benches = {b: _bench(o) for b, o in outcomes.items()}
    total = sum(weights.values())
    comp = sum(w * sum(outcomes[b]) / len(outcomes[b]) for b, w in weights.items()) / total
    return {"path": f"{sha[:2]}.gguf", "sha256": sha, "map_id": None, "perplexity": None,
            "benchmarks": benches,
            "composite": {"accuracy": comp, "ci95": [0.0, 1.0],
                          "weights": {b: w / total for b, w in weights.items()},
                          "metric": "accuracy_norm"}}


def _doc(*entries: dict[str, object]) -> dict[str, object]:
    return {"format": "epi-accuracy", "format_version": 1, "models": list(entries)}


def _read(tmp_path: Path, doc: object) -> dict[str, object]:
    p = tmp_path / "acc.json"
    p.write_text(json.dumps(doc))
    return read_results(p)


def _refused(tmp_path: Path, doc: object, problem: str) -> None:
    with pytest.raises(UserError) as exc:
        _read(tmp_path, doc)
    msg = str(exc.value)
    assert problem in msg and "acc.json" in msg and "\n" not in msg, msg


GOOD = _entry("a" * 64, {"hellaswag": [1, 1, 1, 0, 1], "mmlu": [0, 1, 0, 0, 1]},
              {"hellaswag": 1.0, "mmlu": 1.0})  # composite (0.8 + 0.4) / 2 = 0.6


def test_a_consistent_file_is_read(tmp_path: Path) -> None:
    assert GOOD["composite"]["accuracy"] == pytest.approx(0.6)  # type: ignore[index]  # test data
    _read(tmp_path, _doc(GOOD))
    _read(tmp_path, _doc(GOOD, copy.deepcopy(GOOD)))  # one entry twice: nothing to choose


def test_a_composite_that_is_not_the_mean_is_refused(tmp_path: Path) -> None:
    bad = copy.deepcopy(GOOD)
    bad["composite"]["accuracy"] = 0.185  # type: ignore[index]  # test data
    _refused(tmp_path, _doc(bad), "composite.accuracy: 0.1850 is not the weighted mean")


def test_a_composite_weighing_a_missing_benchmark_is_refused(tmp_path: Path) -> None:
    bad = copy.deepcopy(GOOD)
    del bad["benchmarks"]["mmlu"]  # type: ignore[attr-defined]  # test data
    _refused(tmp_path, _doc(bad), "weighs benchmark 'mmlu'")


def test_two_different_entries_for_one_model_are_refused(tmp_path: Path) -> None:
    other = _entry("a" * 64, {"hellaswag": [0, 0, 0, 0, 1], "mmlu": [0, 1, 0, 0, 1]},
                   {"hellaswag": 1.0, "mmlu": 1.0})
    _refused(tmp_path, _doc(GOOD, other), "models[0] and models[1] are two different entries")


def test_items_that_contradict_the_accuracy_are_refused(tmp_path: Path) -> None:
    bad = copy.deepcopy(GOOD)
    bad["benchmarks"]["hellaswag"]["items"]["accuracy_norm"] = [0, 0, 0, 0, 1]  # type: ignore[index]  # test data
    _refused(tmp_path, _doc(bad), "benchmarks.hellaswag.accuracy_norm: 0.8000 contradicts")
    bad = copy.deepcopy(GOOD)
    bad["benchmarks"]["mmlu"]["n"] = 50  # type: ignore[index]  # test data
    _refused(tmp_path, _doc(bad), "benchmarks.mmlu.n: 50 items stated, 5")


outcome_lists = st.lists(st.integers(0, 1), min_size=1, max_size=30)


@settings(max_examples=80, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(outcomes=st.fixed_dictionaries({b: outcome_lists for b in BENCHES}),
       weights=st.fixed_dictionaries({b: st.floats(0.1, 5.0) for b in BENCHES}),
       shift=st.floats(0.002, 0.5), bench=st.sampled_from(BENCHES), item=st.integers(0, 29))
def test_generated_contradictions_are_refused(tmp_path: Path, outcomes: dict[str, list[int]],
                                              weights: dict[str, float], shift: float,
                                              bench: str, item: int) -> None:
    good = _entry("b" * 64, outcomes, weights)
    _read(tmp_path, _doc(good))  # every consistent entry is read
    comp = good["composite"]
    assert isinstance(comp, dict)
    for sign in (1, -1):  # composite moved off the mean (where it stays inside [0, 1])
        moved = comp["accuracy"] + sign * shift
        if 0.0 <= moved <= 1.0:
            bad = copy.deepcopy(good)
            bad["composite"]["accuracy"] = moved  # type: ignore[index]  # test data
            bad["composite"]["ci95"] = [0.0, 1.0]  # type: ignore[index]  # test data
            _refused(tmp_path, _doc(bad), "is not the weighted mean")
    bad = copy.deepcopy(good)  # one item flipped: the stated accuracy no longer holds
    flips = bad["benchmarks"][bench]["items"]["accuracy"]  # type: ignore[index]  # test data
    k = item % len(flips)
    flips[k] = 1 - flips[k]
    _refused(tmp_path, _doc(bad), f"benchmarks.{bench}.accuracy:")
    twin = _entry("b" * 64, {b: [1 - v for v in o] for b, o in outcomes.items()}, weights)
    _refused(tmp_path, _doc(good, twin), "two different entries for one model")
