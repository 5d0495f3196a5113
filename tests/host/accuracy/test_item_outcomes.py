"""Per-item accuracy outcomes in the results file (host.accuracy.results.item_outcomes).

Paired accuracy comparisons (docs/analysis.md) need, per model, which items it got right. The
expected correctness is recomputed here from the raw scores with the rankings' definitions
(raw sum, per byte, per token; ties to the first choice), independently of multiple_choice.
"""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from epi.commands.accuracy import accuracy
from host.accuracy import multiple_choice as mc
from host.accuracy.results import item_outcomes, outcomes_by_item, read_results

score = st.tuples(st.floats(-50, 0, allow_nan=False), st.integers(1, 8), st.integers(1, 40))
record = st.builds(lambda scores, gold: {"scores": scores, "gold": gold % len(scores)},
                   st.lists(score, min_size=2, max_size=4), st.integers(0, 3))


def _first_best(values: list[float]) -> int:
    best = max(values)
    return values.index(best)


@given(st.lists(record, min_size=1, max_size=30))
@settings(max_examples=100, deadline=None)
def test_outcomes_follow_each_ranking_and_add_up_to_the_counts(recs):
    for i, r in enumerate(recs):
        r["id"] = f"item{i}"
    out = item_outcomes(recs)
    assert out["ids"] == [r["id"] for r in recs]
    for key, rank in (("accuracy", lambda s: s[0]), ("accuracy_norm", lambda s: s[0] / s[2]),
                      ("accuracy_token_norm", lambda s: s[0] / s[1])):
        expect = [int(_first_best([rank(s) for s in r["scores"]]) == r["gold"]) for r in recs]
        assert out[key] == expect, key
    summary = mc.summarize(recs)
    assert sum(out["accuracy"]) == summary["n_correct"]
    assert sum(out["accuracy_norm"]) == summary["n_correct_norm"]
    block = {"items": out}
    assert outcomes_by_item(block, "accuracy") == dict(zip(out["ids"], out["accuracy"],
                                                           strict=True))
    assert outcomes_by_item({}, "accuracy") is None


def test_epi_accuracy_writes_per_item_outcomes(tiny_model: Path, prepared: Path,
                                               tmp_path: Path) -> None:
    out = tmp_path / "acc.json"
    res = CliRunner().invoke(accuracy, [str(tiny_model), "--n", "5", "--bench", "hellaswag",
                                        "--ctx", "128", "--threads", "2", "--out", str(out)])
    assert res.exit_code == 0, res.output
    b = read_results(out)["models"][0]["benchmarks"]["hellaswag"]
    items = b["items"]
    assert len(items["ids"]) == b["n"] == 5
    assert sum(items["accuracy"]) == b["n_correct"]
    assert sum(items["accuracy_norm"]) == b["n_correct_norm"]
    assert sum(items["accuracy_token_norm"]) == b["n_correct_token_norm"]
