"""Few-shot scoring with the shot prefix shared through the KV cache, side by side with
zero-shot scoring and with recomputing the prefix for every item, in one run.

ARC-Challenge at the study's 25 shots on SmolLM2-135M (the demo's model), the same items
three ways on one loaded model (one context size, so only the prompt differs):

- `fewshot-25-vs-zeroshot-per-item`: seconds per item with the 25-shot prefix decoded once
  and shared (its one decode spread over the items), over zero-shot seconds per item (goal
  ≤ 1.3);
- `fewshot-shared-vs-recomputed`: seconds per item recomputing the prefix for every item
  (the same prompts, no shared prefix) over the shared way (goal ≥ 5).

Usage: `python bench/bench_fewshot.py [--items 40] [--rounds 3] [--threads 2]`. Needs the
prepared data (`epi data prepare`) and the model (`epi model prepare smollm2`).
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from benchlib import emit, machine_line  # noqa: E402

from host.accuracy import fewshot  # noqa: E402
from host.accuracy import multiple_choice as mc  # noqa: E402
from host.accuracy.evaldata import benchmark_files, data_dir  # noqa: E402
from host.accuracy.readers import load_items  # noqa: E402
from host.accuracy.scorer import Scorer  # noqa: E402
from host.accuracy.subset import take_subset  # noqa: E402
from host.quant.models import prepare_model  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--items", type=int, default=40)
    ap.add_argument("--recomputed-items", type=int, default=4,
                    help="items scored without the shared prefix (each costs the prefix)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    print(machine_line("bench_fewshot.py"))
    model = prepare_model("smollm2").path
    assert model is not None
    files, _ = benchmark_files(data_dir(), "arc_challenge")
    everything = load_items("arc_challenge", files)
    k = fewshot.STUDY_SHOTS["arc_challenge"]
    groups = fewshot.choose("arc_challenge", everything, k, fewshot.DEFAULT_SHOT_SEED)
    zero = take_subset(fewshot.without_shots(everything, groups), args.items, 0)
    shot = fewshot.with_shots("arc_challenge", zero, groups)
    flat = [dataclasses.replace(i, shared_prefix="") for i in shot[:args.recomputed_items]]
    scorer = Scorer(model, 2048, args.threads)
    ratios, speedups = [], []
    try:
        mc.score_items(scorer, zero[:2])  # warm-up
        for r in range(args.rounds):
            t = time.perf_counter()
            mc.score_items(scorer, zero)
            z = (time.perf_counter() - t) / len(zero)
            t = time.perf_counter()
            mc.score_items(scorer, shot)  # includes the prefix's one decode
            s = (time.perf_counter() - t) / len(shot)
            t = time.perf_counter()
            mc.score_items(scorer, flat)
            f = (time.perf_counter() - t) / len(flat)
            ratios.append(s / z)
            speedups.append(f / s)
            print(f"round {r + 1}: zero-shot {z:.3f} s/item, 25-shot shared {s:.3f} s/item, "
                  f"25-shot recomputed {f:.3f} s/item")
    finally:
        scorer.close()
    emit("fewshot-25-vs-zeroshot-per-item", statistics.median(ratios), len(ratios),
         [min(ratios), max(ratios)], f"{args.items} ARC-Challenge items, {args.threads} threads")
    emit("fewshot-shared-vs-recomputed", statistics.median(speedups), len(speedups),
         [min(speedups), max(speedups)], f"{args.recomputed_items} items recomputed")


if __name__ == "__main__":
    main()
