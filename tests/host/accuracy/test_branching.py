"""KV-branched multiple-choice scoring: same figures as one sequence at a time, any packing.

The reference is llama-cpp-python's high-level path (`Scorer.logprobs`: every choice its own
single-sequence evaluation from scratch, logits of every position), independent of the
branching code under test.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from host.accuracy import estimate
from host.accuracy import multiple_choice as mc
from host.accuracy.branching import Group
from host.accuracy.items import Item, shared_item, winogrande_item
from host.accuracy.scorer import Scorer

# Packing changes which rows share a matrix product; measured on the tiny model and the 135M
# model up to ~1e-4 nats per choice (docs/accuracy.md). A broken branch (wrong sequence ids,
# a missing prefix, a shifted row) moves a sum by whole nats.
TOL_NATS = 2e-3


def _items(synth: type, n: int) -> list:
    w = synth.Words(5)
    items = [shared_item(f"s{i}", "Activity: " + w.sentence(w.integer(4, 14)).capitalize() + ".",
                         [w.sentence(w.integer(1, 7)) + "." for _ in range(4)], i % 4)
             for i in range(n)]
    items.append(winogrande_item({"sentence": "The dog chased the cat because _ was fast.",
                                  "option1": "the dog", "option2": "the cat", "answer": "1"}, 0))
    return items


def _reference(scorer: Scorer, item: Item) -> list[float]:
    out = []
    for seq, start in mc.item_group(scorer, item):
        scorer.reset()
        out.append(float(scorer.logprobs(seq, start).sum()))
    return out


def test_branched_and_packed_scores_match_single_sequences(tiny_model: Path, synth: type) -> None:
    # 8 items and the winogrande one: ~260 tokens, more than one context of 256, so packing
    # splits them (the reference, every choice from scratch, is this test's cost: 12 items
    # took ~3.7 s of CPU for nothing more proven; many batches: the next test)
    items = _items(synth, 8)
    with Scorer(tiny_model, 256, 2) as scorer:
        assert sum(g.n_tokens for it in items for g in mc.item_groups(scorer, it)) > scorer.n_ctx
        ref = [_reference(scorer, it) for it in items]
        alone = mc.score_items(scorer, items, pack=False)
        packed = mc.score_items(scorer, items, pack=True)
        n_tok = [[len(seq) - s for seq, s in mc.item_group(scorer, it)] for it in items]
    for r, a, p, nt in zip(ref, alone, packed, n_tok, strict=True):
        assert [c[1] for c in a["scores"]] == nt == [c[1] for c in p["scores"]]
        for want, got_a, got_p in zip(r, a["scores"], p["scores"], strict=True):
            assert got_a[0] == pytest.approx(want, abs=TOL_NATS)
            assert got_p[0] == pytest.approx(want, abs=TOL_NATS)
    assert [r["id"] for r in packed] == [it.id for it in items]  # per-item outcomes kept


def test_packing_fills_the_context_in_several_batches(tiny_model: Path, synth: type) -> None:
    items = _items(synth, 18)  # ~590 tokens (30 items took ~6 s of CPU for nothing more)
    with Scorer(tiny_model, 128, 2) as scorer:  # several packs (llama.cpp gives 256 cells)
        groups = [g for it in items for g in mc.item_groups(scorer, it)]
        assert sum(g.n_tokens for g in groups) > 2 * scorer.n_ctx
        packed = mc.score_items(scorer, items, pack=True)
        alone = mc.score_items(scorer, items, pack=False)
    for a, p in zip(alone, packed, strict=True):
        for x, y in zip(a["scores"], p["scores"], strict=True):
            assert x[0] == pytest.approx(y[0], abs=TOL_NATS)


def test_an_item_longer_than_the_context_is_scored_choice_by_choice(tiny_model: Path,
                                                                   synth: type) -> None:
    w = synth.Words(3)
    with Scorer(tiny_model, 256, 2) as scorer:
        n_ctx = scorer.n_ctx
        context, e1, e2 = "", "", ""
        while len(scorer.tokenize(context)) < 0.55 * n_ctx:
            context += " " + w.sentence(5)
        while len(scorer.tokenize(e1)) < 0.3 * n_ctx:
            e1 += " " + w.sentence(5)
            e2 += " " + w.sentence(5)
        long_item = shared_item("long", context.strip(), [e1.strip(), e2.strip()], 0)
        seqs = [scorer.tokenize(t) for t in long_item.texts()]
        assert all(len(q) <= n_ctx for q in seqs)
        groups = mc.item_groups(scorer, long_item)
        assert len(groups) == 2  # together they do not fit the context, each alone does
        got = mc.score_items(scorer, [long_item])[0]["scores"]
        ref = _reference(scorer, long_item)
    assert [g[0] for g in got] == pytest.approx(ref, abs=TOL_NATS)


def test_group_prefix_never_passes_a_start() -> None:
    g = Group(((1, 2, 3, 4, 5), (1, 2, 3, 9)), (2, 3))
    assert g.prefix_len == 2 and g.n_tokens == 2 + 3 + 2
    g = Group(((1, 2, 3, 4), (1, 2, 7, 8)), (3, 3))
    assert g.prefix_len == 2


def test_projected_seconds_scales_the_probe_by_kv_tokens(tiny_model: Path, prepared: Path) -> None:
    p = estimate.projected_seconds(tiny_model, ["hellaswag"], 4, threads=2, n_ctx=256,
                                   probe_items=2, data_dir=prepared)
    b = p["benches"]["hellaswag"]
    assert b["n"] == 4 and b["s_per_token"] > 0
    assert b["seconds"] == pytest.approx(b["s_per_token"] * b["kv_tokens"])
    assert p["seconds"] == pytest.approx(p["load_s"] + b["seconds"])
    # the token count is the shared context once plus every ending, counted independently
    from host.accuracy import evaldata
    from host.accuracy.readers import load_items
    from host.accuracy.subset import take_subset

    files, _ = evaldata.benchmark_files(prepared, "hellaswag")
    items = take_subset(load_items("hellaswag", files), 4, 0)
    with Scorer(tiny_model, 256, 2) as scorer:
        total = 0
        for it in items:
            seqs = [scorer.tokenize(t) for t in it.texts()]
            c = 0
            while all(len(q) > c and q[c] == seqs[0][c] for q in seqs):
                c += 1
            c = min(c, min(len(q) for q in seqs) - 1)
            total += c + sum(len(q) - c for q in seqs)
    assert b["kv_tokens"] == total
    assert "projected accuracy scoring" in estimate.describe(p)


def test_log_sum_exp_rows_matches_float64_and_does_not_depend_on_the_chunking() -> None:
    """log Σ exp per row against a float64 computation, within the 10⁻⁶ nats that float32
    exponentials summed pairwise allow for any row (flat random rows, the hard case), over
    more rows than one scratch chunk holds; and every row's figure is the same bit for bit
    with a scratch of another size, or none (numpy reduces each row on its own)."""
    from host.accuracy.branching import LSE_CHUNK_ROWS, log_sum_exp_rows

    rng = np.random.default_rng(7)
    rows = (rng.standard_normal((2 * LSE_CHUNK_ROWS + 5, 49_152), np.float32) * 4)
    got = log_sum_exp_rows(rows)
    x = rows.astype(np.float64)
    mx = x.max(axis=1)
    want = mx + np.log(np.exp(x - mx[:, None]).sum(axis=1))
    assert np.abs(got - want).max() < 1e-6
    small = np.empty((7, rows.shape[1]), np.float32)
    assert np.array_equal(log_sum_exp_rows(rows, small), got)
    assert np.array_equal(log_sum_exp_rows(rows[:1]), got[:1])
