"""Accuracy items per second on a local Dask cluster with 1 and with 2 workers, as a ratio.

    .venv/bin/python bench/bench_accuracy_cluster.py [MODEL.gguf] [--n 32] [--repeats 3]

Each worker is one process with one llama.cpp thread, so 2 workers use 2 cores where 1 uses
one: the ratio says how much of a second core the distributed scoring turns into items (2.0
is perfect; scheduling, pickling and the merge cost the rest). Basis: the same N items of
ARC-Challenge (the prepared data, else synthetic items, said so) scored through
host.accuracy.distributed.score_benchmark, the path `epi accuracy --cluster` takes; cluster
start-up and every worker's model load happen before the clock starts (a warm-up chunk on
each worker). The two cluster sizes alternate in order between rounds, and the ratio is
taken per round: median and [min-max] over --repeats. The machine's cores and load are
printed with the figure: on a machine with fewer than 2 free cores the ratio cannot reach 2.
MODEL defaults to the prepared SmolLM2 F16 base, else a freshly written tiny test model.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_accuracy import default_model
from benchlib import emit, machine_line, summary

from epi.core.errors import UserError
from host.accuracy import cache, distributed
from host.accuracy.evaluate import BenchData, Settings
from host.accuracy.items import Item, items_sha256, shared_item


def bench_items(n: int) -> tuple[list[Item], str]:
    """N ARC-Challenge items from the prepared data, else N synthetic 4-choice items."""
    from host.accuracy import evaldata
    from host.accuracy.readers import load_items
    from host.accuracy.subset import take_subset

    try:
        files, _ = evaldata.benchmark_files(evaldata.data_dir(), "arc_challenge")
        items = take_subset(load_items("arc_challenge", files), n, 0, "arc_challenge")
        return items, f"{len(items)} ARC-Challenge items (prepared data, seed 0)"
    except (UserError, OSError, ValueError) as exc:  # not prepared: fall back, and say why
        words = ("the", "a", "man", "dog", "runs", "over", "house", "river", "blue", "small",
                 "old", "reads", "ball", "water")
        items = [shared_item(f"s{i}", " ".join(words[(i + k) % len(words)] for k in range(9))
                             + "?", [" ".join(words[(i * 3 + c + k) % len(words)]
                                              for k in range(1 + c)) for c in range(4)], i % 4)
                 for i in range(n)]
        return items, f"{n} synthetic 4-choice items (ARC data not prepared: {exc})"


def one_size(model: Path, sha: str, bd: BenchData, settings: Settings, workers: int) -> float:
    """Items per second of `workers` local workers (1 thread each), start-up and load excluded."""
    spec = distributed.ClusterSpec(local_workers=workers)
    with distributed.connect(spec) as client:
        n_ctx = client.submit(distributed.worker_context, str(model), sha, bd.items,
                              settings.ctx, 1, pure=False).result()
        client.run(distributed.score_chunk, str(model), sha, bd.items[:1], n_ctx, 1)  # warm
        t0 = time.monotonic()
        out = distributed.score_benchmark(client, model, sha, bd, settings, 1, workers)
        seconds = time.monotonic() - t0
    assert len(out["records"]) == len(bd.items)
    return len(bd.items) / seconds


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", nargs="?", type=Path)
    ap.add_argument("--n", type=int, default=32, help="items per timing")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    print(machine_line(Path(__file__).name))
    with tempfile.TemporaryDirectory() as tmp:
        model = args.model or default_model(Path(tmp))
        items, what = bench_items(args.n)
        sha = cache.model_sha256(model)
        settings = Settings(benches=["arc_challenge"], n=len(items), ctx=512, threads=1)
        bd = BenchData("arc_challenge", items, {"items_sha256": items_sha256(items)}, {})
        print(f"model {model.name}; {what}; 1 llama.cpp thread per worker; "
              f"{os.cpu_count()} cores on this machine")
        ratios, rates = [], {1: [], 2: []}
        for r in range(args.repeats):
            got = {}
            for workers in ((1, 2) if r % 2 == 0 else (2, 1)):
                got[workers] = one_size(model, sha, bd, settings, workers)
                rates[workers].append(got[workers])
            ratios.append(got[2] / got[1])
            print(f"round {r + 1}: 1 worker {got[1]:.2f} items/s, 2 workers {got[2]:.2f} "
                  f"items/s, ratio {ratios[-1]:.2f}")
    med, spread = summary(ratios)
    one, _ = summary(rates[1])
    two, _ = summary(rates[2])
    emit("accuracy_cluster_2_vs_1_workers", round(med, 3), len(ratios),
         [round(v, 3) for v in spread],
         note=f"{os.cpu_count()} cores; median items/s: 1 worker {one:.2f}, 2 workers "
              f"{two:.2f}; {what}; model {model.name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
