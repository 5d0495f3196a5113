"""Benchmark items scored on a Dask distributed cluster, merged in item order.

Accuracy needs no meter and no Pi, and every item is scored on its own (the KV cache is
reset per item: host/accuracy/multiple_choice.py), so a benchmark's items can be spread over
any number of workers and put back together in item order — the merge is by chunk index,
never by completion order, and every record's id is checked against the item it belongs
to. The result is the single-process result item by item, provided every worker runs the
same llama.cpp build (tests/host/accuracy/test_distributed.py checks both).

The cluster is Dask distributed (`dask[distributed]`, the `cluster` extra): a scheduler
address `tcp://HOST:PORT` (workers started with `dask worker`), or `local:N`, N worker
processes on this machine bound to 127.0.0.1. Each worker keeps its model loaded between
chunks. A worker checks the model file's sha256 against the client's before scoring, so a
worker with a different file at the same path is refused, not merged.

The scores go into the accuracy store (host/accuracy/store.py) under the workers' llama.cpp
build; the ordinary evaluation (host/accuracy/evaluate.py) then reads them from there, so a
cluster run and a single-process run produce the same `epi-accuracy` document, and the
campaign finds what the cluster scored.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import re
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from epi.core.errors import UserError
from host.accuracy import cache, store
from host.accuracy import multiple_choice as mc
from host.accuracy.evaluate import (
    BenchData,
    Progress,
    Settings,
    _mc_context,
    _Models,
    benchmark_key,
    check_settings,
    evaluate,
    load_benchmarks,
    no_progress,
)
from host.accuracy.items import Item
from host.gguf_io.file import check_gguf

if TYPE_CHECKING:
    from distributed import Client

#: chunks per worker: small enough that a slow worker does not hold the others up at the end
CHUNKS_PER_WORKER = 4
MAX_LOCAL_WORKERS = 256
CONNECT_TIMEOUT_S = 10


@dataclass(frozen=True)
class ClusterSpec:
    """Where to score: a scheduler address, or a number of local worker processes."""

    address: str | None = None
    local_workers: int | None = None

    def describe(self) -> str:
        return self.address or f"local:{self.local_workers}"


def parse_cluster(text: str) -> ClusterSpec:
    """'tcp://HOST:PORT' or 'local:N' → a ClusterSpec; anything else a one-line UserError."""
    m = re.fullmatch(r"local:(\d{1,6})", text.strip())
    if m:
        n = int(m.group(1))
        if not 1 <= n <= MAX_LOCAL_WORKERS:
            raise UserError(f"--cluster: local worker count {n} outside 1..{MAX_LOCAL_WORKERS}")
        return ClusterSpec(local_workers=n)
    if re.fullmatch(r"(tcp|tls)://[A-Za-z0-9._\-\[\]:]+:\d{1,5}", text.strip()):
        return ClusterSpec(address=text.strip())
    raise UserError(f"--cluster: expected tcp://HOST:PORT or local:N, got {text!r}")


def _import_distributed() -> ModuleType:
    try:
        import distributed
    except ImportError as exc:
        raise UserError(f"--cluster needs Dask distributed ({exc}): install with "
                        "`pip install -e '.[cluster]'`") from None
    return distributed


@contextlib.contextmanager
def connect(spec: ClusterSpec) -> Iterator[Client]:
    """A Dask client for `spec`: a local cluster on 127.0.0.1 (closed afterwards), or the
    scheduler at its address; an unreachable scheduler is one line."""
    distributed = _import_distributed()
    if spec.local_workers is not None:
        with distributed.LocalCluster(
            n_workers=spec.local_workers, threads_per_worker=1, processes=True,
            host="127.0.0.1", dashboard_address=None, silence_logs=logging.ERROR,
        ) as lc, distributed.Client(lc) as client:
            yield client
        return
    try:
        client = distributed.Client(spec.address, timeout=CONNECT_TIMEOUT_S)
    except (OSError, TimeoutError) as exc:
        raise UserError(f"--cluster: no Dask scheduler at {spec.address} ({exc})") from None
    with client:
        yield client


# -- the worker side (runs in each Dask worker process) ------------------------------------

_models: dict[tuple[str, int], _Models] = {}
_models_lock = threading.Lock()


def worker_build() -> dict[str, store.JSON]:
    """This worker's llama.cpp build (its results are keyed by it)."""
    return store.build_identity()


def _worker_models(model: str, sha: str, threads: int | None) -> _Models:
    """This worker's loaded model, after checking its file is the client's (by sha256)."""
    path = Path(model)
    if not path.is_file():
        raise UserError(f"worker {os.uname().nodename}: model {model} not found")
    theirs = cache.model_sha256(path)
    if theirs != sha:
        raise UserError(f"worker {os.uname().nodename}: model {model} has sha256 "
                        f"{theirs[:12]}…, the client's has {sha[:12]}…")
    n_threads = threads or os.cpu_count() or 1
    key = (str(path), n_threads)
    with _models_lock:
        if key not in _models:
            _models[key] = _Models(path, n_threads)
        return _models[key]


def worker_context(model: str, sha: str, items: Sequence[Item], ctx: int,
                   threads: int | None) -> int:
    """The context that holds the longest choice of `items` (as the single process sizes it)."""
    return _mc_context(_worker_models(model, sha, threads), items, ctx)


def score_chunk(model: str, sha: str, items: Sequence[Item], n_ctx: int,
                threads: int | None) -> list[mc.ItemRecord]:
    """Per-item records of one chunk (multiple_choice.score_items, one item per batch)."""
    scorer = _worker_models(model, sha, threads).get(n_ctx)
    return mc.score_items(scorer, items)


# -- the client side -----------------------------------------------------------------------


def chunks(n_items: int, n_workers: int) -> list[tuple[int, int]]:
    """[start, stop) ranges covering 0..n_items in order, about CHUNKS_PER_WORKER a worker."""
    n_chunks = max(1, min(n_items, n_workers * CHUNKS_PER_WORKER))
    size = -(-n_items // n_chunks)
    return [(i, min(i + size, n_items)) for i in range(0, n_items, size)]


def merge(items: Sequence[Item], parts: Sequence[list[mc.ItemRecord]]) -> list[mc.ItemRecord]:
    """The chunks' records joined in item order; each record must belong to its item."""
    records = [r for part in parts for r in part]
    if len(records) != len(items):
        raise UserError(f"cluster returned {len(records)} records for {len(items)} items")
    for i, (rec, item) in enumerate(zip(records, items, strict=True)):
        if rec.get("id") != item.id or rec.get("gold") != item.gold:
            raise UserError(f"cluster record {i} is for item {rec.get('id')!r}, expected "
                            f"{item.id!r}: refusing to merge")
    return records


def cluster_build(client: Client) -> tuple[dict[str, store.JSON], int]:
    """The one llama.cpp build all workers run, and their number; mixed builds are refused
    (their items would not be comparable with each other)."""
    builds: dict[str, dict[str, store.JSON]] = client.run(worker_build)
    if not builds:
        raise UserError("--cluster: the cluster has no workers")
    distinct = {store.digest(b): b for b in builds.values()}
    if len(distinct) > 1:
        desc = "; ".join(f"{addr}: {b.get('llama_cpp_python')} {b.get('build_flags')}"
                         for addr, b in sorted(builds.items()))
        raise UserError(f"--cluster: workers run different llama.cpp builds ({desc}); one "
                        "result must come from one build")
    return next(iter(distinct.values())), len(builds)


def score_benchmark(client: Client, model: Path, sha: str, bd: BenchData, settings: Settings,
                    threads: int | None, n_workers: int,
                    progress: Progress = no_progress) -> dict[str, Any]:
    """One benchmark's records scored over the cluster: {records, seconds, n_ctx}."""
    distributed = _import_distributed()
    t0 = time.monotonic()
    n_ctx = client.submit(worker_context, str(model), sha, bd.items, settings.ctx, threads,
                          pure=False).result()
    ranges = chunks(len(bd.items), n_workers)
    futures = [client.submit(score_chunk, str(model), sha, bd.items[a:b], n_ctx, threads,
                             pure=False) for a, b in ranges]
    sizes = {f.key: b - a for f, (a, b) in zip(futures, ranges, strict=True)}
    with progress(f"{model.name} {bd.name} ({n_workers} workers)", len(bd.items)) as step:
        for fut in distributed.as_completed(futures):
            step(sizes[fut.key])
    records = merge(bd.items, [f.result() for f in futures])
    return {"records": records, "seconds": time.monotonic() - t0, "n_ctx": int(n_ctx)}


def evaluate_on_cluster(models: Sequence[Path], settings: Settings, spec: ClusterSpec,
                        threads: int | None = None, progress: Progress = no_progress,
                        echo: Callable[[str], None] = lambda s: None) -> dict[str, Any]:
    """The `epi-accuracy` document for `models`, benchmark items scored on the cluster.

    Benchmarks already in the store for the workers' build are not rescored (unless
    `settings.use_cache` is off); perplexity and the llama-perplexity cross-check run here,
    as in `evaluate`. `threads`: llama.cpp threads per worker (None: the worker's cores).
    """
    check_settings(settings)
    for m in models:
        check_gguf(Path(m))
    if threads is None and spec.local_workers:  # local workers share this machine's cores
        threads = max(1, (os.cpu_count() or 1) // spec.local_workers)
    benches = load_benchmarks(settings)
    scored: dict[tuple[str, str], dict[str, store.JSON]] = {}
    with connect(spec) as client:
        build, n_workers = cluster_build(client)
        echo(f"cluster {spec.describe()}: {n_workers} worker(s), llama-cpp-python "
             f"{build.get('llama_cpp_python')}")
        with store.benchmark_build(build):
            for m in models:
                model = Path(m)
                sha = cache.model_sha256(model)
                for bd in benches.values():
                    key = benchmark_key(sha, bd, settings)
                    if settings.use_cache and cache.load_result(key) is not None:
                        continue
                    result = score_benchmark(client, model, sha, bd, settings, threads,
                                             n_workers, progress)
                    cache.store_result(key, result)
                    scored[(sha, bd.name)] = {"cluster": spec.describe(),
                                              "workers": n_workers, "llama_build": build}
    # the figures themselves come from the one evaluation path, reading the store
    with store.benchmark_build(build):
        doc = evaluate(models, dataclasses.replace(settings, use_cache=True), progress, echo)
    for entry in doc["models"]:
        for name, result in entry["benchmarks"].items():
            by = scored.get((entry["sha256"], name))
            if by is not None:
                result["cached"] = False
                result["scored_by"] = by
    return doc
