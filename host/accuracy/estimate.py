"""Projected time of an accuracy stage, from a short timed probe on this machine.

    projected_seconds(model, ["hellaswag", "mmlu"], 400, threads=4)

loads the model once (timed), scores a few items of every benchmark (the probe, timed), and
scales each benchmark's probe by KV tokens: scoring time is close to proportional to the
tokens evaluated (an item's shared context once plus every ending), so the projection uses
the token count of the very items the stage will score, not an average item. The seconds
per token are taken after one warm-up item, as the stage's steady state.

Few-shot items are probed as the stage scores them: the shot prefix decoded once (timed on
its own) and every probe item scored with it resident, so the per-token rate includes the
attention over the prefix (at 25 shots an item's tokens attend over ~1,000 cached cells: a
zero-shot rate under-projected a 25-shot ARC and 10-shot HellaSwag stage by a third). The
projection is then the prefix decodes plus the items' own tokens at that rate.

Perplexity windows, when asked for (`ppl_text`), are timed too: the text's tokenization (the
stage tokenizes the whole file, as llama-perplexity does) and two windows.

The result is a dict with the total (`seconds`) and its parts, so a campaign can print
"accuracy stage: about 2 h 10 min" before it starts.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TypedDict

from host.accuracy import fewshot
from host.accuracy import multiple_choice as mc
from host.accuracy.items import Item
from host.accuracy.scorer import Scorer
from host.accuracy.subset import take_subset

PROBE_ITEMS = 8
DEFAULT_CTX = 512


def item_kv_tokens(scorer: Scorer, item: Item) -> int:
    """KV cells the branching scorer evaluates for `item` (shared context once)."""
    return sum(g.n_tokens for g in mc.item_groups(scorer, item))


def probe_seconds_per_token(scorer: Scorer, items: Sequence[Item]) -> float:
    """Seconds per evaluated KV token, scoring `items` (the first is a warm-up, untimed)."""
    if len(items) < 2:
        raise ValueError("a probe needs at least two items (one warm-up)")
    mc.score_items(scorer, items[:1])
    timed = items[1:]
    t0 = time.perf_counter()
    mc.score_items(scorer, timed)
    seconds = time.perf_counter() - t0
    return seconds / sum(item_kv_tokens(scorer, it) for it in timed)


class BenchProjection(TypedDict):
    """One benchmark's projection: items, the KV tokens their own text evaluates (a shot
    prefix not included), the probed rate for them, the shot prefixes' decode time, seconds
    (= s_per_token · kv_tokens + prefix_seconds)."""

    n: int
    kv_tokens: int
    s_per_token: float
    prefix_tokens: int
    prefix_seconds: float
    seconds: float


class PerplexityProjection(TypedDict):
    """The perplexity windows' projection: tokenizing the text, then windows at the probed
    time per window."""

    windows: int
    tokenize_s: float
    s_per_window: float
    seconds: float


class Projection(TypedDict):
    """What `projected_seconds` returns (model load included in `seconds`)."""

    seconds: float
    load_s: float
    benches: dict[str, BenchProjection]
    probe_items: int
    threads: int
    n_ctx: int
    ppl: PerplexityProjection | None


def projected_seconds(
    model: Path,
    benches: Sequence[str],
    n_items: int | Mapping[str, int],
    threads: int,
    *,
    n_ctx: int = DEFAULT_CTX,
    seed: int = 0,
    probe_items: int = PROBE_ITEMS,
    data_dir: Path | None = None,
    shots: Mapping[str, int] | None = None,
    shot_seed: int = fewshot.DEFAULT_SHOT_SEED,
    ppl_text: Path | None = None,
    ppl_windows: int = 0,
) -> Projection:
    """Projected seconds to score `n_items` of every benchmark (int, or per benchmark) on `model`.

    Returns {"seconds", "load_s", "benches": {name: {"n", "kv_tokens", "s_per_token",
    "seconds"}}, "probe_items", "threads"}. The items are the seeded subsets the accuracy
    stage takes (same `seed`), read from the prepared data (`epi data prepare`).
    """
    from host.accuracy import evaldata
    from host.accuracy.readers import load_items

    root = data_dir or evaldata.data_dir()
    t0 = time.perf_counter()
    scorer = Scorer(Path(model), n_ctx, threads)
    load_s = time.perf_counter() - t0
    benches_out: dict[str, BenchProjection] = {}
    try:
        for bench in benches:
            n = n_items[bench] if isinstance(n_items, Mapping) else n_items
            files, _ = evaldata.benchmark_files(root, bench)
            all_items = load_items(bench, files)
            k = int((shots or {}).get(bench, 0))
            groups = fewshot.choose(bench, all_items, k, shot_seed)
            pool = fewshot.without_shots(all_items, groups)
            items = fewshot.with_shots(bench, take_subset(pool, n, seed, bench), groups)
            probe = take_subset(pool, min(probe_items + 1, len(pool)), seed + 1, bench)
            if k and groups:
                # probe items of one shot group (one MMLU subject), as the stage scores them
                key = fewshot.group_key(bench, probe[0])
                same = [it for it in pool if fewshot.group_key(bench, it) == key]
                probe = fewshot.with_shots(
                    bench, take_subset(same, min(probe_items + 1, len(same)), seed + 1, bench),
                    groups)
            # the context the stage itself opens: the largest item, shots included, whole
            need = max(mc.group_cells(scorer, it) for it in [*items, *probe])
            if need > scorer.n_ctx:
                scorer.close()
                scorer = Scorer(Path(model), mc.context_cells(need), threads)
            # a few-shot prefix is decoded once per group and shared by its items
            prefix: dict[str, int] = {}
            for it in items:
                if it.shared_prefix and it.shared_prefix not in prefix:
                    prefix[it.shared_prefix] = len(mc.prefix_tokens(scorer, it.shared_prefix,
                                                                    it))
            own = sum(item_kv_tokens(scorer, it) - prefix.get(it.shared_prefix, 0)
                      for it in items)
            if k and groups:
                rate, prefix_rate = probe_few_shot(scorer, probe)
            else:
                rate, prefix_rate = probe_seconds_per_token(scorer, probe), 0.0
            prefix_s = prefix_rate * sum(prefix.values())
            benches_out[bench] = {"n": len(items), "kv_tokens": own, "s_per_token": rate,
                                  "prefix_tokens": sum(prefix.values()),
                                  "prefix_seconds": prefix_s, "seconds": rate * own + prefix_s}
        ppl_out = (probe_perplexity(scorer, ppl_text, ppl_windows)
                   if ppl_text is not None and ppl_windows > 0 else None)
    finally:
        scorer.close()
    return {"seconds": load_s + sum(b["seconds"] for b in benches_out.values())
            + (ppl_out["seconds"] if ppl_out else 0.0),
            "load_s": load_s, "benches": benches_out, "probe_items": probe_items,
            "threads": threads, "n_ctx": n_ctx, "ppl": ppl_out}


def probe_few_shot(scorer: Scorer, items: Sequence[Item]) -> tuple[float, float]:
    """(seconds per item token with the shot prefix resident, seconds per prefix token),
    from `items` that share one prefix: the first scored as a warm-up (untimed), the
    prefix's decode timed on its own, then the others scored with it resident."""
    if len(items) < 2:
        raise ValueError("a probe needs at least two items (one warm-up)")
    if len({it.shared_prefix for it in items}) != 1 or not items[0].shared_prefix:
        raise ValueError("a few-shot probe's items must share one shot prefix")
    mc.score_items(scorer, items[:1])
    tokens = mc.prefix_tokens(scorer, items[0].shared_prefix, items[0])
    ctx = scorer.branching()
    t0 = time.perf_counter()
    ctx.load_prefix(tokens)
    prefix_s = time.perf_counter() - t0
    ctx.load_prefix([])
    timed = items[1:]
    t0 = time.perf_counter()
    mc.score_items(scorer, timed)  # decodes the prefix once more, then every item
    total_s = time.perf_counter() - t0
    own = sum(item_kv_tokens(scorer, it) - len(tokens) for it in timed)
    # the items' share is what the run took beyond its prefix decode; a run the machine's
    # noise made shorter than the prefix alone falls back to one rate for every token
    item_s = total_s - prefix_s if total_s > prefix_s else total_s * own / (own + len(tokens))
    return item_s / own, prefix_s / len(tokens)


def probe_perplexity(scorer: Scorer, text_path: Path, windows: int) -> PerplexityProjection:
    """Time what the stage's perplexity does: tokenize the whole text, then score windows
    (two, in one decode call as the stage batches them), and project `windows` of them."""
    from host.accuracy import perplexity as ppl

    t0 = time.perf_counter()
    tokens = scorer.tokenize(ppl.read_text(text_path))
    tokenize_s = time.perf_counter() - t0
    n_ctx = DEFAULT_CTX
    probe = min(2, windows)
    t0 = time.perf_counter()
    ppl.perplexity_tokens(scorer, tokens, n_ctx, n_ctx, probe)
    per_window = (time.perf_counter() - t0) / probe
    return {"windows": windows, "tokenize_s": tokenize_s, "s_per_window": per_window,
            "seconds": tokenize_s + per_window * windows}


def describe(projection: Projection) -> str:
    """One line: the total and each benchmark's share."""
    parts = ", ".join(f"{name} {b['n']} items {b['seconds']:.0f} s"
                      for name, b in projection["benches"].items())
    return (f"projected accuracy scoring: {projection['seconds']:.0f} s "
            f"({projection['seconds'] / 60:.1f} min; load {projection['load_s']:.1f} s, {parts}; "
            f"from a {projection['probe_items']}-item probe per benchmark, "
            f"{projection['threads']} threads)")


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m host.accuracy.estimate MODEL --bench hellaswag,mmlu --n 400 --threads 2`."""
    import argparse

    from epi.core.errors import UserError

    ap = argparse.ArgumentParser(description="Projected accuracy-scoring time (short probe).")
    ap.add_argument("model", type=Path)
    ap.add_argument("--bench", default="hellaswag,arc_challenge,mmlu")
    ap.add_argument("--n", type=int, default=200, help="items per benchmark")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--ctx", type=int, default=DEFAULT_CTX)
    ap.add_argument("--probe", type=int, default=PROBE_ITEMS, help="timed probe items")
    args = ap.parse_args(argv)
    try:
        p = projected_seconds(args.model, [b for b in args.bench.split(",") if b], args.n,
                              args.threads, n_ctx=args.ctx, probe_items=args.probe)
    except UserError as exc:
        print(f"error: {exc}")
        return 2
    print(describe(p))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
