"""Items, subsets, statistics, scoring and the `epi accuracy` command (tiny model, small data)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from epi.commands.accuracy import accuracy, parse_benches, parse_weights
from epi.core.errors import UserError
from host.accuracy import cache
from host.accuracy import multiple_choice as mc
from host.accuracy.evaluate import Settings, composite_block, evaluate, read_map_id
from host.accuracy.items import (
    arc_item,
    hellaswag_item,
    items_sha256,
    mmlu_item,
    shared_item,
    winogrande_item,
)
from host.accuracy.results import accuracy_by_sha256, read_results, write_results
from host.accuracy.scorer import Scorer
from host.accuracy.stats import composite, perplexity_stats, wilson_interval
from host.accuracy.subset import subset_indices, take_subset

# --- items --------------------------------------------------------------------------------


def test_hellaswag_text_is_lm_eval_preprocessed() -> None:
    it = hellaswag_item({"activity_label": "Making a cake", "ctx_b": "she",
                         "ctx_a": "A woman [title] mixes flour.",
                         "endings": ["stirs it [step]", "a", "b", "c"], "label": "0"}, 3)
    assert it.contexts[0] == "Making a cake: A woman. mixes flour. She"
    # lm-eval strips before removing brackets, so a trailing "[step]" leaves a space
    assert it.continuations == (" stirs it ", " a", " b", " c") and it.gold == 0
    assert it.texts()[0] == "Making a cake: A woman. mixes flour. She stirs it "


def test_arc_mmlu_winogrande_items() -> None:
    arc = arc_item({"id": "q", "question": "Why?", "answerKey": "3",
                    "choices": {"text": ["x", "y", "z"], "label": ["1", "2", "3"]}}, 0)
    assert arc.contexts[0] == "Question: Why?\nAnswer:" and arc.gold == 2
    nested = arc_item({"question": {"stem": "Why?", "choices": [{"text": "x", "label": "A"},
                                                                 {"text": "y", "label": "B"}]},
                       "answerKey": "B"}, 4)
    assert nested.continuations == (" x", " y") and nested.gold == 1
    mm = mmlu_item({"question": "2+2?", "subject": "math", "choices": ["3", "4"], "answer": "B"}, 7)
    assert mm.gold == 1 and mm.id == "math/row7"
    wg = winogrande_item({"sentence": "Ann beat Bo because _ ran fast.", "option1": "Ann",
                          "option2": "Bo", "answer": "1"}, 0)
    assert wg.partial and wg.contexts == ("Ann beat Bo because Ann", "Ann beat Bo because Bo")
    assert wg.continuations == (" ran fast.", " ran fast.") and wg.gold == 0


def test_items_sha256_changes_with_text_and_gold() -> None:
    a = [shared_item("1", "c", ["x", "y"], 0)]
    assert items_sha256(a) == items_sha256([shared_item("1", "c", ["x", "y"], 0)])
    assert items_sha256(a) != items_sha256([shared_item("1", "c", ["x", "y"], 1)])
    assert items_sha256(a) != items_sha256([shared_item("1", "c", ["x", "z"], 0)])


# --- subsets and statistics ---------------------------------------------------------------


def test_subsets_are_seeded_nested_and_bounded() -> None:
    a = subset_indices(1000, 200, 0)
    assert a == subset_indices(1000, 200, 0) and a == sorted(a) and len(set(a)) == 200
    assert set(subset_indices(1000, 100, 0)) <= set(a)
    assert a != subset_indices(1000, 200, 1)
    assert subset_indices(5, 0, 3) == [0, 1, 2, 3, 4]
    with pytest.raises(UserError, match="larger than the data"):
        take_subset(list(range(10)), 11, 0, "mmlu")


def test_wilson_interval() -> None:
    lo, hi = wilson_interval(0, 10)
    assert lo == pytest.approx(0.0, abs=1e-12) and hi == pytest.approx(0.2775, abs=1e-4)
    lo, hi = wilson_interval(5, 10)
    assert (lo, hi) == (pytest.approx(0.2366, abs=1e-4), pytest.approx(0.7634, abs=1e-4))
    # llama-perplexity's printed interval for 84/200
    z, p, n = 1.95996398454, 0.42, 200
    zz = z * z / n
    cnf = zz * math.sqrt(n * (4 * p * (1 - p) + zz)) / (2 * z)
    assert wilson_interval(84, 200) == pytest.approx(((p + zz / 2 - cnf) / (1 + zz),
                                                      (p + zz / 2 + cnf) / (1 + zz)))


def test_composite_and_its_interval() -> None:
    acc, (lo, hi) = composite({"a": (0.5, 100), "b": (0.3, 100)}, {"a": 1, "b": 1})
    half = 1.95996398454 * math.sqrt(0.25 * 0.25 / 100 + 0.25 * 0.21 / 100)
    assert acc == pytest.approx(0.4) and (lo, hi) == (pytest.approx(0.4 - half),
                                                      pytest.approx(0.4 + half))
    acc, _ = composite({"a": (1.0, 10), "b": (0.0, 10)}, {"a": 3, "b": 1})
    assert acc == pytest.approx(0.75)


def test_composite_block_is_null_with_reason_when_incomplete() -> None:
    res = {"hellaswag": {"accuracy_norm": 0.4, "n": 100}}
    block = composite_block(res, {"hellaswag": 1, "mmlu": 1}, "accuracy_norm")
    assert block["accuracy"] is None and block["ci95"] is None and "mmlu" in block["reason"]
    assert block["weights"] == {"hellaswag": 0.5, "mmlu": 0.5}


def test_perplexity_stats_matches_definition() -> None:
    nll = np.array([1.0, 2.0, 3.5, 0.5])
    out = perplexity_stats(nll.sum(), (nll**2).sum(), len(nll))
    se = math.sqrt(((nll**2).mean() - nll.mean() ** 2) / (len(nll) - 1))
    assert out["ppl"] == pytest.approx(math.exp(nll.mean()))
    assert out["nll_se"] == pytest.approx(se) and out["ppl_se"] == pytest.approx(se * out["ppl"])


def test_three_rankings_and_ties() -> None:
    # [logprob_sum, n_tokens, n_bytes] per choice
    scores = [[-10.0, 5, 10], [-8.0, 2, 4], [-12.0, 6, 30]]
    assert mc.predictions(scores) == {"raw": 1, "norm": 2, "token_norm": 0}
    records = [{"gold": 1, "scores": scores}, {"gold": 2, "scores": scores}]
    s = mc.summarize(records)
    assert (s["accuracy"], s["accuracy_norm"], s["accuracy_token_norm"]) == (0.5, 0.5, 0.0)
    assert s["n"] == 2 and s["n_correct"] == 1 and s["ci95"] == list(wilson_interval(1, 2))
    assert s["chance_accuracy"] == pytest.approx(1 / 3)


# --- scoring on the tiny model ------------------------------------------------------------


def _independent_logprobs(model: Path, seq: list[int]) -> np.ndarray:
    """log p(seq[j] | seq[:j]) for j >= 1 from a fresh llama-cpp-python context."""
    import llama_cpp

    llm = llama_cpp.Llama(str(model), n_ctx=256, logits_all=True, n_threads=2, verbose=False)
    try:
        llm.eval(seq)
        x = np.array(llm.scores[: len(seq) - 1], dtype=np.float64)
    finally:
        llm.close()
    lse = x.max(1) + np.log(np.exp(x - x.max(1, keepdims=True)).sum(1))
    return x[np.arange(len(seq) - 1), seq[1:]] - lse


def test_choice_scores_match_an_independent_computation(tiny_model: Path) -> None:
    item = shared_item("t", "The cat sat on the", ["mat.", "red house by the river.", "dog"], 0)
    wino = winogrande_item({"sentence": "The dog chased the cat because _ was fast.",
                            "option1": "the dog", "option2": "the cat", "answer": "1"}, 0)
    with Scorer(tiny_model, 128, 2) as scorer:
        for it in (item, wino):
            got = mc.score_item(scorer, it)
            for (seq, start), (lp_sum, n_tok, n_bytes) in zip(mc.item_group(scorer, it), got,
                                                             strict=True):
                ref = _independent_logprobs(tiny_model, seq)[start - 1 :]
                assert lp_sum == pytest.approx(float(ref.sum()), abs=1e-3)
                assert n_tok == len(seq) - start
                assert n_bytes == sum(scorer.piece_bytes(t) for t in seq[start:])
        # shared context: the scored tokens are exactly the ending's (" mat." etc.)
        (seq0, s0), (_, s1), _ = mc.item_group(scorer, item)
        assert s0 == s1 == len(scorer.tokenize("The cat sat on the"))
        assert scorer.llm.detokenize(seq0[s0:]).decode() == " mat."
        # partial: only the words after the blank are scored, for both options
        (w0, t0), (w1, t1) = mc.item_group(scorer, wino)
        assert scorer.llm.detokenize(w0[t0:]) == scorer.llm.detokenize(w1[t1:]) == b" was fast."


def test_item_scores_do_not_depend_on_what_came_before(tiny_model: Path) -> None:
    a = shared_item("a", "Question: what is red?\nAnswer:", ["fire", "water"], 0)
    b = shared_item("b", "Question: what is blue?\nAnswer:", ["sky", "grass"], 0)
    with Scorer(tiny_model, 128, 2) as scorer:
        alone = mc.score_item(scorer, b)
        mc.score_item(scorer, a)
        after = mc.score_item(scorer, b)
    assert after == alone


def test_model_that_fails_to_load(tmp_path: Path) -> None:
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + b"\x00" * 64)
    with pytest.raises(UserError, match="model failed to load") as exc:
        Scorer(bad, 128, 1)
    assert "\n" not in str(exc.value)
    (tmp_path / "x.gguf").write_text("hello")
    with pytest.raises(UserError, match="not a GGUF file"):
        Scorer(tmp_path / "x.gguf", 128, 1)
    with pytest.raises(UserError, match="model file not found"):
        Scorer(tmp_path / "missing.gguf", 128, 1)


# --- results file, cache, map id ----------------------------------------------------------


def test_results_reader_refuses_unknown_and_newer(tmp_path: Path) -> None:
    path = tmp_path / "r.json"
    path.write_text(json.dumps({"format": "epi-accuracy", "format_version": 2, "models": []}))
    with pytest.raises(UserError, match="newer"):
        read_results(path)
    path.write_text(json.dumps({"format": "epi-trace", "format_version": 1, "models": []}))
    with pytest.raises(UserError, match="field 'format'"):
        read_results(path)
    path.write_text(json.dumps({"format": "epi-accuracy", "format_version": 1,
                                "models": [{"path": "m", "sha256": "ab"}]}))
    with pytest.raises(UserError, match="models\\[0\\]: field 'map_id' missing"):
        read_results(path)
    with pytest.raises(UserError, match="not found"):
        read_results(tmp_path / "none.json")


def test_cache_roundtrip_and_key_mismatch() -> None:
    key = {"kind": "benchmark", "benchmark": "mmlu", "model_sha256": "a" * 64, "n": 1}
    result = {"records": [{"id": "q0", "gold": 1, "scores": [[-3.0, 2, 5], [-1.5, 2, 6]]}],
              "seconds": 0.5, "n_ctx": 512}
    assert cache.load_result(key) is None
    cache.store_result(key, result)
    assert cache.load_result(key) == result
    assert cache.load_result({**key, "n": 4}) is None


def test_model_sha256_is_remembered(tmp_path: Path) -> None:
    f = tmp_path / "m.gguf"
    f.write_bytes(b"GGUF1234")
    first = cache.model_sha256(f)
    assert first == cache.file_sha256(f)
    memo = json.loads((cache.cache_root() / "sha256.json").read_text())
    assert first in memo.values()
    f.write_bytes(b"GGUF12345")  # size changes: rehashed
    assert cache.model_sha256(f) != first


def _quant_manifest(map_id: str) -> str:
    return json.dumps({"format": "epi-quant-manifest", "format_version": 1, "map_id": map_id})


def test_map_id_from_quant_manifest(tmp_path: Path) -> None:
    model = tmp_path / "q4-mix.gguf"
    assert read_map_id(model) is None
    (tmp_path / "q4-mix.manifest.json").write_text(_quant_manifest("q4-mix"))
    assert read_map_id(model) == "q4-mix"
    (tmp_path / "q4-mix.manifest.json").write_text(
        json.dumps({"format": "epi-model-manifest", "format_version": 1}))
    assert read_map_id(model) is None  # `epi model prepare` names its manifest the same way
    for bad, message in (("{", "not valid JSON"), ("[" * 100_000, "nested deeper"),
                         (_quant_manifest("../x"), "map_id"), ('{"map_id": "x"}', "format")):
        (tmp_path / "q4-mix.manifest.json").write_text(bad)
        with pytest.raises(UserError, match=message):
            read_map_id(model)


# --- the command --------------------------------------------------------------------------


def test_parse_options() -> None:
    assert parse_benches("hellaswag, mmlu,mmlu") == ["hellaswag", "mmlu"]
    assert "winogrande" in parse_benches("all")
    with pytest.raises(UserError, match="unknown benchmark 'hellaswagg'"):
        parse_benches("hellaswagg")
    assert parse_weights("mmlu=2,hellaswag=1") == {"mmlu": 2.0, "hellaswag": 1.0}
    with pytest.raises(UserError, match="NAME=WEIGHT"):
        parse_weights("mmlu")


def _link_model(tiny_model: Path, tmp_path: Path, name: str = "tiny-q.gguf") -> Path:
    link = tmp_path / name
    link.symlink_to(tiny_model)
    return link


def test_accuracy_command_end_to_end_and_cached(tiny_model: Path, prepared: Path,
                                                ppl_text: Path, tmp_path: Path) -> None:
    model = _link_model(tiny_model, tmp_path)
    (tmp_path / "tiny-q.manifest.json").write_text(_quant_manifest("tiny-q"))
    out = tmp_path / "acc.json"
    args = [str(model), "--n", "5", "--bench", "hellaswag,arc_challenge,mmlu,winogrande",
            "--ppl", str(ppl_text), "--ctx", "128", "--ppl-windows", "3", "--threads", "2",
            "--out", str(out)]
    res = CliRunner().invoke(accuracy, args)
    assert res.exit_code == 0, res.output
    doc = read_results(out)
    (m,) = doc["models"]
    assert m["sha256"] == cache.file_sha256(tiny_model) and m["map_id"] == "tiny-q"
    assert accuracy_by_sha256(doc)[m["sha256"]] is m
    assert m["perplexity"]["n_windows"] == 3 and m["perplexity"]["settings"]["n_ctx"] == 128
    assert m["perplexity"]["n_tokens_scored"] == 3 * (128 - 64 - 1)
    assert m["perplexity"]["ppl"] > 1 and m["perplexity"]["ppl_se"] > 0
    for name, b in m["benchmarks"].items():
        assert b["n"] == 5 and b["subset"] == {**b["subset"], "n": 5, "seed": 0}, name
        for key in ("ci95", "ci95_norm", "ci95_token_norm"):
            assert 0 <= b[key][0] <= b[key][1] <= 1
        assert not b["cached"]
    assert m["benchmarks"]["mmlu"]["subset"]["of"] == 11
    c = m["composite"]
    assert c["metric"] == "accuracy_norm" and c["ci95"][0] <= c["accuracy"] <= c["ci95"][1]
    assert c["accuracy"] == pytest.approx(np.mean([m["benchmarks"][b]["accuracy_norm"]
                                                   for b in ("mmlu", "arc_challenge",
                                                             "hellaswag")]))
    assert m["crosscheck"] is None and doc["settings"]["seed"] == 0
    assert "composite" in res.output and "perplexity" in res.output

    res = CliRunner().invoke(accuracy, args)
    again = read_results(out)["models"][0]
    assert all(b["cached"] for b in again["benchmarks"].values()) and again["perplexity"]["cached"]
    assert again["benchmarks"] == {k: {**v, "cached": True} for k, v in m["benchmarks"].items()}
    res = CliRunner().invoke(accuracy, [*args, "--no-cache", "--bench", "winogrande"])
    assert not read_results(out)["models"][0]["benchmarks"]["winogrande"]["cached"]


def test_accuracy_errors(tiny_model: Path, prepared: Path, tmp_path: Path) -> None:
    runner = CliRunner()

    def err(*args: str) -> str:
        res = runner.invoke(accuracy, [*args, "--out", str(tmp_path / "o.json")])
        assert isinstance(res.exception, UserError), res.output
        assert "\n" not in str(res.exception)
        return str(res.exception)

    assert "unknown benchmark 'piqa'" in err(str(tiny_model), "--bench", "piqa")
    assert "larger than the data (12 items)" in err(str(tiny_model), "--bench", "hellaswag",
                                                    "--n", "13")
    (tmp_path / "bad.gguf").write_bytes(b"GGUF" + bytes(40))
    assert "model failed to load" in err(str(tmp_path / "bad.gguf"), "--n", "2")
    assert "model file not found" in err(str(tmp_path / "none.gguf"))
    assert "file not found" in err(str(tiny_model), "--ppl", str(tmp_path / "none.txt"))
    assert "unknown benchmark" in err(str(tiny_model), "--weights", "piqa=1")
    assert "must be 0 (all) or positive" in err(str(tiny_model), "--n", "-3")
    files = sorted((prepared / "hellaswag").glob("*.arrow"))
    files[0].write_bytes(b"damaged")
    assert "changed since it was prepared" in err(str(tiny_model), "--bench", "hellaswag")
    assert not (tmp_path / "o.json").exists()


def test_missing_data_is_one_line_exit_2(tiny_model: Path, tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "epi.cli", "accuracy", str(tiny_model), "--bench", "mmlu",
         "--out", str(tmp_path / "o.json")],
        capture_output=True, text=True, check=False, env={**os.environ},
    )
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("\n") == 1 and "not prepared (run `epi data prepare`)" in proc.stderr


def test_evaluate_refuses_bad_settings(tiny_model: Path) -> None:
    with pytest.raises(UserError, match="--metric"):
        evaluate([tiny_model], Settings(metric="f1"))
    with pytest.raises(UserError, match="weights must sum"):
        evaluate([tiny_model], Settings(weights={"mmlu": 0.0}))


def test_results_writer_validates(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="field 'models'"):
        write_results(tmp_path / "r.json", {"format": "epi-accuracy", "format_version": 1})
