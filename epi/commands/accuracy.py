"""`epi accuracy MODEL...`: perplexity and multiple-choice accuracy into an epi-accuracy file."""

from __future__ import annotations

import contextlib
import math
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import click

from epi.commands.params import (
    SEED,
    THREADS,
    BoundedInt,
    check_output_file,
)
from epi.core.errors import UserError
from host.accuracy.evaldata import resolve_ppl
from host.accuracy.evaluate import COMPOSITE_METRICS, DEFAULT_BENCHES, Settings, evaluate
from host.accuracy.fewshot import DEFAULT_SHOT_SEED, parse_shots
from host.accuracy.items import BENCHMARKS
from host.accuracy.results import write_results


def parse_benches(value: str) -> list[str]:
    """'hellaswag,mmlu' → ['hellaswag', 'mmlu']; 'all' → every benchmark."""
    names = [v.strip() for v in value.split(",") if v.strip()]
    if names == ["all"]:
        return list(BENCHMARKS)
    if not names:
        raise UserError("--bench: no benchmark named")
    for n in names:
        if n not in BENCHMARKS:
            raise UserError(f"--bench: unknown benchmark {n!r} (known: {', '.join(BENCHMARKS)})")
    return list(dict.fromkeys(names))


def parse_weights(value: str) -> dict[str, float]:
    """'mmlu=1,hellaswag=2' → {'mmlu': 1.0, 'hellaswag': 2.0}."""
    weights = {}
    for part in (p.strip() for p in value.split(",") if p.strip()):
        name, sep, w = part.partition("=")
        if not sep:
            raise UserError(f"--weights: expected NAME=WEIGHT, got {part!r}")
        try:
            weight = float(w)
        except ValueError:
            raise UserError(
                f"--weights: weight of {name.strip()!r} is not a number: {w!r}"
            ) from None
        if not math.isfinite(weight) or weight < 0 or weight > 1e6:
            raise UserError(f"--weights: weight of {name.strip()!r} is {w!r}, expected a finite "
                            "number in [0, 1e6]")
        weights[name.strip()] = weight
    if not weights:
        raise UserError("--weights: no weights given")
    if sum(weights.values()) <= 0:
        raise UserError("--weights: the weights sum to 0 (at least one must be positive)")
    return weights


@contextlib.contextmanager
def _bar(label: str, total: int) -> Iterator[Callable[[int], None]]:
    with click.progressbar(length=total, label=label, show_eta=True, show_percent=True,
                           show_pos=True, file=sys.stderr) as bar:
        yield bar.update


def _fmt_ci(ci: list[float] | None) -> str:
    return f"[{ci[0]:.3f}, {ci[1]:.3f}]" if ci else "n/a"


def summary_lines(doc: dict[str, Any]) -> list[str]:
    """A short human summary of the results document."""
    metric = doc["settings"]["metric"]
    lines = []
    for m in doc["models"]:
        head = f"{Path(m['path']).name}  sha256 {m['sha256'][:12]}  map_id {m['map_id']}"
        split = m.get("split")
        if split is not None:
            d = split["decode"]
            head = (f"split: prefill {Path(m['path']).name} (sha256 {m['sha256'][:12]}), "
                    f"decode {Path(d['path']).name} (sha256 {d['sha256'][:12]})")
        lines.append(head)
        p = m["perplexity"]
        if p is not None:
            se = f" ± {p['ppl_se']:.3f}" if p["ppl_se"] is not None else ""
            lines.append(f"  perplexity {p['ppl']:.3f}{se}  ({p['n_tokens_scored']} tokens, "
                         f"ctx {p['settings']['n_ctx']}, stride {p['settings']['stride']})")
        for name, b in m["benchmarks"].items():
            lines.append(
                f"  {name:<14} raw {b['accuracy']:.3f} {_fmt_ci(b['ci95'])}  "
                f"norm {b['accuracy_norm']:.3f} {_fmt_ci(b['ci95_norm'])}  "
                f"token_norm {b['accuracy_token_norm']:.3f}  n={b['n']}  "
                f"{b['seconds_per_item']:.2f} s/item{' (cached)' if b['cached'] else ''}")
        c = m["composite"]
        if c["accuracy"] is None:
            lines.append(f"  composite      null ({c['reason']})")
        else:
            weights = ", ".join(f"{k}={v:.3g}" for k, v in c["weights"].items())
            lines.append(f"  composite      {c['accuracy']:.3f} {_fmt_ci(c['ci95'])} "
                         f"({metric}, weights {weights})")
        x = m["crosscheck"]
        if x is not None:
            for name, v in x.items():
                if not isinstance(v, dict):
                    continue
                if v.get("agree") is None:
                    lines.append(f"  llama-perplexity {name}: not compared ({v.get('reason')})")
                    continue
                diff = (f"rel diff {v['rel_diff']:.2e}" if "rel_diff" in v
                        else f"abs diff {v['abs_diff']:.4f}")
                lines.append(f"  llama-perplexity {name}: ours {v['ours']:.4f} vs "
                             f"{v['llama_perplexity']:.4f} ({diff}) "
                             f"{'agree' if v['agree'] else 'DISAGREE'}")
    return lines


@click.command("accuracy")
@click.argument("models", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("--bench", default=",".join(DEFAULT_BENCHES), show_default=True,
              help="Comma-separated benchmarks (hellaswag, arc_challenge, arc_easy, mmlu, "
                   "winogrande) or 'all'.")
@click.option("--n", "n", default=200, show_default=True, type=BoundedInt(None, 10_000_000),
              help="Items per benchmark: a seeded subset (0 = every item).")
@click.option("--seed", default=0, show_default=True, type=SEED, help="Seed of the subsets.")
@click.option("--ppl", default=None, metavar="FILE",
              help="Text for perplexity: a file, or a prepared text name ('lambada').")
@click.option("--ctx", default=512, show_default=True, type=BoundedInt(8, 1_048_576),
              help="Context length of the perplexity windows (and minimum for benchmarks).")
@click.option("--stride", default=None, type=BoundedInt(1, 1_048_576),
              help="Perplexity window stride [default: ctx, llama-perplexity's chunks].")
@click.option("--ppl-windows", default=40, show_default=True, type=BoundedInt(None, 10_000_000),
              help="At most this many perplexity windows from the start of the text (0 = all).")
@click.option("--weights", default="mmlu=1,arc_challenge=1,hellaswag=1", show_default=True,
              help="Composite weights, NAME=WEIGHT,... (normalised to sum 1).")
@click.option("--metric", default="accuracy_norm", show_default=True,
              type=click.Choice(COMPOSITE_METRICS), help="Accuracy the composite averages.")
@click.option("--threads", default=None, type=THREADS, help="CPU threads [default: all cores].")
@click.option("--data", "data_dir", default=None, type=click.Path(path_type=Path),
              help="Prepared data directory [default: $EPI_HOME/data].")
@click.option("--crosscheck", is_flag=True,
              help="Also run llama-perplexity on the same model, data and settings and record "
                   "the agreement.")
@click.option("--no-cache", is_flag=True, help="Recompute instead of reading cached results.")
@click.option("--cluster", default=None, metavar="ADDRESS",
              help="Score benchmark items on a Dask cluster: tcp://HOST:PORT or local:N "
                   "(docs/accuracy.md); --threads is then per worker.")
@click.option("--shots", default="0", show_default=True, metavar="SPEC",
              help="Few-shot examples per benchmark: 0 (zero-shot), one count for every "
                   "benchmark, NAME=K,... per benchmark, or 'study' (mmlu=5, "
                   "arc_challenge=25, hellaswag=10). lm-evaluation-harness's templates "
                   "(docs/accuracy.md).")
@click.option("--shot-seed", default=DEFAULT_SHOT_SEED, show_default=True, type=SEED,
              help="Seed that draws the ARC and HellaSwag shots.")
@click.option("--decode-model", default=None, type=click.Path(path_type=Path),
              metavar="GGUF",
              help="Score the split configuration that prefills on MODEL and decodes on this "
                   "GGUF (another quantization of the same base model): each item's context "
                   "on MODEL, the continuation on GGUF after a KV-state handover "
                   "(docs/accuracy.md, \"Split configurations\").")
@click.option("--out", default="accuracy.json", show_default=True,
              type=click.Path(path_type=Path), help="Results file (epi-accuracy JSON).")
def accuracy(models: tuple[Path, ...], bench: str, n: int, seed: int, ppl: str | None,
             ctx: int, stride: int | None, ppl_windows: int, weights: str, metric: str,
             threads: int | None, data_dir: Path | None, crosscheck: bool, no_cache: bool,
             cluster: str | None, shots: str, shot_seed: int, decode_model: Path | None,
             out: Path) -> None:
    """Perplexity and multiple-choice accuracy of each MODEL (GGUF), cached, into --out."""
    if decode_model is not None and cluster is not None:
        raise UserError("--decode-model: a split configuration is scored on this host only, "
                        "not on a Dask cluster (drop --cluster)")
    if n < 0:
        raise UserError(f"--n: subset size must be 0 (all) or positive, got {n}")
    if ppl_windows < 0:
        raise UserError(f"--ppl-windows: must be 0 (all) or positive, got {ppl_windows}")
    check_output_file(out, "--out")  # before the scoring, not after it
    ppl_file, ppl_name = resolve_ppl(ppl, data_dir)
    settings = Settings(
        benches=parse_benches(bench), n=n, seed=seed, ctx=ctx, stride=stride,
        ppl_file=ppl_file, ppl_name=ppl_name, ppl_windows=ppl_windows,
        weights=parse_weights(weights), metric=metric, data_dir=data_dir,
        crosscheck=crosscheck, use_cache=not no_cache,
    )
    settings.shots = parse_shots(shots, list(settings.benches))
    settings.shot_seed = shot_seed
    if threads is not None:
        settings.threads = threads

    def echo(line: str) -> None:
        click.echo(line, err=True)

    if cluster is not None:
        from host.accuracy.distributed import evaluate_on_cluster, parse_cluster

        doc = evaluate_on_cluster(list(models), settings, parse_cluster(cluster), threads,
                                  progress=_bar, echo=echo)
    else:
        doc = evaluate(list(models), settings, progress=_bar, echo=echo,
                       decode_model=decode_model)
    write_results(out, doc)
    for line in summary_lines(doc):
        click.echo(line)
    click.echo(f"wrote {out}")
