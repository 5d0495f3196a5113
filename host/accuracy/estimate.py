"""Projected time of an accuracy stage, from a short timed probe on this machine.

    projected_seconds(model, ["hellaswag", "mmlu"], 400, threads=4)

loads the model once (timed), scores a few items of every benchmark (the probe, timed), and
scales each benchmark's probe by KV tokens: scoring time is close to proportional to the
tokens evaluated (an item's shared context once plus every ending), so the projection uses
the token count of the very items the stage will score, not an average item. The seconds
per token are taken after one warm-up item, as the stage's steady state.

The result is a dict with the total (`seconds`) and its parts, so a campaign can print
"accuracy stage: about 2 h 10 min" before it starts. Perplexity windows are not included.
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
    """One benchmark's projection: items, KV tokens to evaluate, probed rate, seconds."""

    n: int
    kv_tokens: int
    s_per_token: float
    seconds: float


class Projection(TypedDict):
    """What `projected_seconds` returns (model load included in `seconds`)."""

    seconds: float
    load_s: float
    benches: dict[str, BenchProjection]
    probe_items: int
    threads: int
    n_ctx: int


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
            # the context the stage itself opens: the largest item, shots included, whole
            need = max(mc.group_cells(scorer, it) for it in items)
            if need > scorer.n_ctx:
                scorer.close()
                scorer = Scorer(Path(model), -(-need // 256) * 256, threads)
            rate = probe_seconds_per_token(scorer, probe)
            # a few-shot prefix is decoded once per group and shared by its items
            prefix = {g.prefix: len(scorer.tokenize(g.prefix)) for g in groups}
            tokens = (sum(item_kv_tokens(scorer, it) - prefix.get(it.shared_prefix, 0)
                          for it in items) + sum(prefix.values()))
            benches_out[bench] = {"n": len(items), "kv_tokens": tokens,
                                  "s_per_token": rate, "seconds": rate * tokens}
    finally:
        scorer.close()
    return {"seconds": load_s + sum(b["seconds"] for b in benches_out.values()),
            "load_s": load_s, "benches": benches_out, "probe_items": probe_items,
            "threads": threads, "n_ctx": n_ctx}


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
