"""Few-shot scoring with the shot prefix shared through the KV cache, side by side with
zero-shot scoring and with recomputing the prefix for every item, in one run.

ARC-Challenge at the study's 25 shots on SmolLM2-135M (the demo's model), the same items
three ways on one loaded model (one context size, so only the prompt differs):

- `fewshot-25-vs-zeroshot-per-item`: seconds per item with the 25-shot prefix decoded once
  and shared (its one decode spread over the items), over zero-shot seconds per item (goal
  ≤ 1.3);
- `fewshot-shared-vs-recomputed`: seconds per item recomputing the prefix for every item
  (the same prompts, no shared prefix) over the shared way (goal ≥ 5);
- `fewshot-25-vs-zeroshot-at-study-items`: the first ratio with the prefix's one decode spread
  over the paper study's ARC-Challenge items (hardware/study-paper-llama-3.1-8b.toml: 299)
  instead of the bench's few: (prefix + N × item) / (N × zero-shot item), from the prefix
  decode timed on its own and the items' time beyond it, both measured in the same round;
- `fewshot-25-vs-zeroshot-study-shape`: that ratio at the study model's shape
  (`--shapes study`): a GGUF with Llama-3.1-8B's layer (4096 wide, 32 query and 8 KV heads
  of 128, FFN 14336) written here with random weights, 2 layers, quantized to Q4_0 by
  llama-quantize (cached under $EPI_HOME/bench), tokenized by llama.cpp's SPM test vocab. The
  prefix's attention per item token, 2 × heads × head width × cells multiply-adds a layer,
  is fixed by the shape: against SmolLM2-135M's layer (3.5 M weights, 9 heads of 64) 1,000
  cells add ~33 % to the layer's multiply-adds, against Llama-3.1-8B's (218 M weights) ~4 %
  (on CPU, attention costs more per multiply-add than the weight products: the items' own
  time measured at this shape is ~1.2× zero-shot). Random weights change no kernel's cost;
  2 layers instead of 32 leave the output head a larger share (it does not grow with the
  prefix), so this ratio, if anything, reads low by a few per cent of the excess.

Usage: `python bench/bench_fewshot.py [--items 40] [--rounds 3] [--threads 2]
[--shapes smollm2,study]`. Needs the prepared data (`epi data prepare`) and the model
(`epi model prepare smollm2`).
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from benchlib import emit, machine_line  # noqa: E402

from epi.core.paths import epi_home  # noqa: E402
from epi.formats.fields import read_toml_file  # noqa: E402
from host.accuracy import fewshot  # noqa: E402
from host.accuracy import multiple_choice as mc  # noqa: E402
from host.accuracy.evaldata import benchmark_files, data_dir  # noqa: E402
from host.accuracy.readers import load_items  # noqa: E402
from host.accuracy.scorer import Scorer  # noqa: E402
from host.accuracy.subset import take_subset  # noqa: E402
from host.llama.install import tool_env, tool_path  # noqa: E402
from host.quant.models import prepare_model  # noqa: E402
from host.quant.tiny_model import write_test_model  # noqa: E402

STUDY_FILE = REPO / "hardware" / "study-paper-llama-3.1-8b.toml"
# Llama-3.1-8B's layer, from its config.json: hidden_size, num_attention_heads,
# num_key_value_heads, intermediate_size
STUDY_SHAPE = {"n_embd": 4096, "n_head": 32, "n_head_kv": 8, "n_ff": 14336}
STUDY_SHAPE_LAYERS = 2


def study_items() -> int:
    """The paper study's ARC-Challenge item count, read from its study file."""
    doc = read_toml_file(STUDY_FILE, "study file")
    return int(doc["accuracy"]["benchmarks"]["arc_challenge"])


def study_shape_model(threads: int) -> Path:
    """A Q4_0 GGUF of Llama-3.1-8B's layer shape (random weights), written once and cached."""
    out = epi_home() / "bench" / f"llama31-8b-shape-{STUDY_SHAPE_LAYERS}l-q4_0.gguf"
    if out.exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    f16 = out.with_name(out.stem + "-f16.gguf")
    print(f"writing {f16.name} ({STUDY_SHAPE_LAYERS} layers of Llama-3.1-8B's shape) and "
          "quantizing it to Q4_0 once", flush=True)
    write_test_model(f16, n_layers=STUDY_SHAPE_LAYERS, **STUDY_SHAPE)
    partial = out.with_name(out.name + ".partial")
    try:
        subprocess.run([str(tool_path("llama-quantize")), str(f16), str(partial), "Q4_0",
                        str(threads)], check=True, env=tool_env(), capture_output=True)
        partial.rename(out)
    finally:
        f16.unlink(missing_ok=True)
        partial.unlink(missing_ok=True)
    return out


def measure(model: Path, items: int, recomputed_items: int, rounds: int, threads: int
            ) -> dict[str, list[float]]:
    """Per round: zero-shot, 25-shot shared and 25-shot recomputed seconds per item, and the
    shot prefix's decode on its own; one loaded model and context for all of it."""
    files, _ = benchmark_files(data_dir(), "arc_challenge")
    everything = load_items("arc_challenge", files)
    k = fewshot.STUDY_SHOTS["arc_challenge"]
    groups = fewshot.choose("arc_challenge", everything, k, fewshot.DEFAULT_SHOT_SEED)
    zero = take_subset(fewshot.without_shots(everything, groups), items, 0)
    shot = fewshot.with_shots("arc_challenge", zero, groups)
    flat = [dataclasses.replace(i, shared_prefix="") for i in shot[:recomputed_items]]
    scorer = Scorer(model, 2048, threads)
    got: dict[str, list[float]] = {"zero": [], "shared": [], "recomputed": [], "prefix": []}
    try:
        prefix = mc.prefix_tokens(scorer, shot[0].shared_prefix, shot[0])
        mc.score_items(scorer, zero[:2])  # warm-up
        for r in range(rounds):
            t = time.perf_counter()
            mc.score_items(scorer, zero)
            z = (time.perf_counter() - t) / len(zero)
            t = time.perf_counter()
            mc.score_items(scorer, shot)  # includes the prefix's one decode
            s = (time.perf_counter() - t) / len(shot)
            t = time.perf_counter()
            mc.score_items(scorer, flat)  # no shared prefix: the shot prefix is dropped
            f = (time.perf_counter() - t) / len(flat)
            ctx = scorer.branching()
            t = time.perf_counter()
            ctx.load_prefix(prefix)  # the prefix's decode on its own
            p = time.perf_counter() - t
            ctx.load_prefix([])
            for key, value in (("zero", z), ("shared", s), ("recomputed", f), ("prefix", p)):
                got[key].append(value)
            print(f"round {r + 1}: zero-shot {z:.3f} s/item, 25-shot shared {s:.3f} s/item "
                  f"(its {len(prefix)}-token prefix decodes in {p:.2f} s), 25-shot recomputed "
                  f"{f:.3f} s/item", flush=True)
    finally:
        scorer.close()
    return got


def at_items(got: dict[str, list[float]], items: int, n: int) -> list[float]:
    """Per round, the shared/zero-shot ratio with the prefix's decode spread over n items:
    the items' own time is the shared run's beyond its prefix decode."""
    out = []
    for z, s, p in zip(got["zero"], got["shared"], got["prefix"], strict=True):
        own = max(s * items - p, 0.0) / items
        out.append((p / n + own) / z)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--items", type=int, default=40)
    ap.add_argument("--recomputed-items", type=int, default=4,
                    help="items scored without the shared prefix (each costs the prefix)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--shapes", default="smollm2,study",
                    help="smollm2 (the demo's model), study (Llama-3.1-8B's layer shape)")
    ap.add_argument("--study-shape-items", type=int, default=16,
                    help="items per pass at the study's shape (each costs ~40x SmolLM2's)")
    args = ap.parse_args()
    shapes = [x for x in args.shapes.split(",") if x]
    if not shapes or set(shapes) - {"smollm2", "study"}:
        ap.error(f"--shapes: expected smollm2 and/or study, got {args.shapes!r}")
    print(machine_line("bench_fewshot.py"))
    n = study_items()
    if "smollm2" in shapes:
        model = prepare_model("smollm2").path
        assert model is not None
        got = measure(model, args.items, args.recomputed_items, args.rounds, args.threads)
        ratios = [s / z for z, s in zip(got["zero"], got["shared"], strict=True)]
        speedups = [f / s for s, f in zip(got["shared"], got["recomputed"], strict=True)]
        emit("fewshot-25-vs-zeroshot-per-item", statistics.median(ratios), len(ratios),
             [min(ratios), max(ratios)],
             f"{args.items} ARC-Challenge items, {args.threads} threads")
        emit("fewshot-shared-vs-recomputed", statistics.median(speedups), len(speedups),
             [min(speedups), max(speedups)], f"{args.recomputed_items} items recomputed")
        spread = at_items(got, args.items, n)
        emit("fewshot-25-vs-zeroshot-at-study-items", statistics.median(spread), len(spread),
             [min(spread), max(spread)], f"SmolLM2-135M, the prefix spread over {n} items")
    if "study" in shapes:
        model = study_shape_model(args.threads)
        items = args.study_shape_items
        got = measure(model, items, 1, args.rounds, args.threads)
        spread = at_items(got, items, n)
        emit("fewshot-25-vs-zeroshot-study-shape", statistics.median(spread), len(spread),
             [min(spread), max(spread)],
             f"Llama-3.1-8B's layer shape ({STUDY_SHAPE_LAYERS} layers, random, Q4_0), "
             f"{items} items measured, the prefix spread over {n} items, "
             f"{args.threads} threads")


if __name__ == "__main__":
    main()
