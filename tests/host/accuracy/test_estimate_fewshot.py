"""The accuracy probe projects a few-shot stage as the stage scores it: each shot prefix
decoded once, every item's own tokens at a rate probed with the prefix resident, and the
perplexity windows timed rather than assumed (a zero-shot rate and an assumed window time
under-projected a 25-shot ARC / 10-shot HellaSwag stage by a third on the 2-core VM).

Expected token counts are computed here from the items' texts (the whole context shared by
an item's endings once, each ending's tail), independently of the probe's own counting."""

from __future__ import annotations

from pathlib import Path

import pytest

from host.accuracy import estimate, evaldata, fewshot
from host.accuracy.readers import load_items
from host.accuracy.scorer import Scorer
from host.accuracy.subset import take_subset

SHOTS = {"arc_challenge": 3, "mmlu": 2}


def _stage_items(root: Path, bench: str, n: int) -> list:
    files, _ = evaldata.benchmark_files(root, bench)
    everything = load_items(bench, files)
    groups = fewshot.choose(bench, everything, SHOTS[bench], fewshot.DEFAULT_SHOT_SEED)
    pool = fewshot.without_shots(everything, groups)
    return fewshot.with_shots(bench, take_subset(pool, n, 0, bench), groups)


def _full_tokens(scorer: Scorer, item) -> int:  # type: ignore[no-untyped-def]
    """KV cells of an item scored alone: the common context once, every ending's tail."""
    seqs = [scorer.tokenize(t) for t in item.texts()]
    c = 0
    while all(len(q) > c and q[c] == seqs[0][c] for q in seqs):
        c += 1
    c = min(c, min(len(q) for q in seqs) - 1)
    return c + sum(len(q) - c for q in seqs)


def test_a_few_shot_projection_counts_each_prefix_once(tiny_model: Path,
                                                      prepared: Path) -> None:
    p = estimate.projected_seconds(tiny_model, list(SHOTS), 4, threads=2, n_ctx=256,
                                   probe_items=2, data_dir=prepared, shots=SHOTS)
    with Scorer(tiny_model, 2048, 2) as scorer:
        for bench in SHOTS:
            b = p["benches"][bench]
            items = _stage_items(prepared, bench, 4)
            prefixes = {it.shared_prefix for it in items}
            alone = sum(len(scorer.tokenize(x)) for x in prefixes)
            # the prefix tokens as counted alone, give or take one token at each boundary
            assert abs(b["prefix_tokens"] - alone) <= len(prefixes)
            # items' own tokens + each prefix once = every item in full, less the prefix
            # each item after the first of its group would decode again
            repeats = sum(sum(1 for it in items if it.shared_prefix == x) - 1 for x in prefixes)
            full = sum(_full_tokens(scorer, it) for it in items)
            per_prefix = b["prefix_tokens"] / len(prefixes)
            assert b["kv_tokens"] + b["prefix_tokens"] == pytest.approx(
                full - repeats * per_prefix, abs=len(items))
            assert b["s_per_token"] > 0 and b["prefix_seconds"] > 0
            assert b["seconds"] == pytest.approx(b["s_per_token"] * b["kv_tokens"]
                                                 + b["prefix_seconds"])
    assert p["ppl"] is None
    assert p["seconds"] == pytest.approx(p["load_s"] + sum(
        b["seconds"] for b in p["benches"].values()))


def test_the_few_shot_probe_refuses_items_of_different_prefixes(tiny_model: Path,
                                                                prepared: Path) -> None:
    files, _ = evaldata.benchmark_files(prepared, "mmlu")
    everything = load_items("mmlu", files)
    groups = fewshot.choose("mmlu", everything, 2, fewshot.DEFAULT_SHOT_SEED)
    items = fewshot.with_shots("mmlu", fewshot.without_shots(everything, groups), groups)
    mixed = [next(it for it in items if it.shared_prefix == g.prefix) for g in groups]
    assert len({it.shared_prefix for it in mixed}) == 2
    with Scorer(tiny_model, 1024, 2) as scorer, pytest.raises(ValueError, match="one shot"):
        estimate.probe_few_shot(scorer, mixed)


def test_perplexity_windows_are_timed_and_added(tiny_model: Path, prepared: Path) -> None:
    text, _ = evaldata.text_file(prepared, "lambada")
    p = estimate.projected_seconds(tiny_model, ["hellaswag"], 3, threads=2, n_ctx=256,
                                   probe_items=2, data_dir=prepared, ppl_text=text,
                                   ppl_windows=16)
    q = p["ppl"]
    assert q is not None and q["windows"] == 16
    assert q["tokenize_s"] > 0 and q["s_per_window"] > 0
    assert q["seconds"] == pytest.approx(q["tokenize_s"] + 16 * q["s_per_window"])
    assert p["seconds"] == pytest.approx(p["load_s"] + p["benches"]["hellaswag"]["seconds"]
                                         + q["seconds"])
