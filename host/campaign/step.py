"""One campaign step, run as its own process: `python -m host.campaign.step SPEC.json`.

The campaign writes the step's spec (kind and arguments) into the step's directory, starts
this module in a new session (host.campaign.procs) and waits. The step writes `result.json`
atomically when it has finished; the campaign journals the step as done only after that. A
step killed half-way leaves no result, so it is never counted.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any, cast

from epi.core.errors import UserError
from epi.core.files import write_json_atomic
from host.campaign.journal import StepResult
from host.campaign.plan import StepKind
from host.campaign.specs import AccuracyArgs, DataArgs, PrepareArgs, QuantizeArgs, RunArgs


def _echo(line: str) -> None:
    print(line, flush=True)


def do_prepare(a: PrepareArgs) -> StepResult:
    from host.quant.models import prepare_model

    manifest = prepare_model(a["name"], log=_echo)
    return {"path": manifest.path, "sha256": manifest.sha256}


def do_quantize(a: QuantizeArgs) -> StepResult:
    from host.accuracy.cache import model_sha256
    from host.quant.gguf_info import read_model
    from host.quant.mixmap import load_mixmap
    from host.quant.quantize import quantize_map

    base = Path(a["base"])
    if not base.is_file():
        raise UserError(f"{base}: base model not found")
    r = quantize_map(load_mixmap(Path(a["map"])), read_model(base), model_sha256(base),
                     Path(a["out_dir"]), threads=a["threads"])
    _echo(f"{r.output}: {'up to date, skipped' if r.skipped else 'quantized'}")
    return {"output": str(r.output), "skipped": r.skipped,
            "size_bytes": r.manifest.output.size_bytes,
            "bits_per_weight": r.manifest.total.bits_per_weight}


def do_data(a: DataArgs) -> StepResult:
    from host.accuracy import evaldata

    root = evaldata.data_dir()
    prepared = evaldata.ensure_prepared(a["benchmarks"], a["texts"], root, echo=_echo)
    if not prepared:
        _echo(f"evaluation data already prepared in {root}")
    return {"prepared": prepared, "root": str(root)}


def do_accuracy(a: AccuracyArgs) -> StepResult:
    """Score one model; benchmarks with different item counts are scored per count and
    merged, with the composite recomputed over all of them. A study's shared store is named
    in EPI_ACCURACY_STORE for the step, so that every scorer of it (this process, the local
    Dask workers it starts) uses it; the variable is put back afterwards, so a caller in
    the same process (the tests) keeps its own."""
    from host.accuracy import store

    if not a.get("store"):
        return _score_accuracy(a)
    before = os.environ.get(store.ENV)
    os.environ[store.ENV] = str(a.get("store"))
    try:
        return _score_accuracy(a)
    finally:
        if before is None:
            os.environ.pop(store.ENV, None)
        else:
            os.environ[store.ENV] = before


def _score_accuracy(a: AccuracyArgs) -> StepResult:
    from host.accuracy.evaldata import resolve_ppl
    from host.accuracy.evaluate import Settings, composite_block, evaluate
    from host.accuracy.results import write_results

    model = Path(a["model"])
    decode = Path(d) if (d := a.get("decode_model")) else None
    cluster = a.get("cluster")
    if decode is not None and cluster:
        _echo(f"{model.name}: a split configuration is scored on this host, not on {cluster} "
              "(both models and the handover in one process)")
        cluster = None
    by_n: dict[int, list[str]] = {}
    for bench, n in a["benchmarks"].items():
        by_n.setdefault(int(n), []).append(bench)
    ppl_file, ppl_name = resolve_ppl(a["ppl"], None)
    doc: dict[str, Any] | None = None  # host.accuracy's epi-accuracy document
    groups = sorted(by_n.items()) or [(10, [])]
    for i, (n, benches) in enumerate(groups):
        s = Settings(benches=benches, n=n, seed=a["seed"], threads=a["threads"],
                     ppl_file=ppl_file if i == 0 else None, ppl_name=ppl_name,
                     ppl_windows=a["ppl_windows"],
                     weights={b: 1.0 for b in a["benchmarks"]} or {"mmlu": 1.0},
                     shots={b: k for b, k in a.get("shots", {}).items() if b in benches},
                     shot_seed=a.get("shot_seed", 1234))
        if cluster:
            from host.accuracy.distributed import evaluate_on_cluster, parse_cluster

            part = evaluate_on_cluster([model], s, parse_cluster(cluster), echo=_echo)
        else:
            part = evaluate([model], s, echo=_echo, decode_model=decode)
        if doc is None:
            doc = part
            doc["settings"]["n"] = dict(a["benchmarks"])
            doc["settings"]["benchmarks"] = list(a["benchmarks"])
        else:
            doc["models"][0]["benchmarks"].update(part["models"][0]["benchmarks"])
    assert doc is not None
    entry = doc["models"][0]
    weights = {b: 1.0 for b in a["benchmarks"]}
    entry["composite"] = composite_block(entry["benchmarks"], weights, doc["settings"]["metric"])
    write_results(Path(a["out"]), doc)
    c = entry["composite"]
    _echo(f"{model.name}: composite accuracy {c['accuracy']}")
    return {"out": a["out"], "composite": c["accuracy"],
            "perplexity": (entry["perplexity"] or {}).get("ppl"),
            # cached only when nothing was scored: every benchmark and the perplexity
            "cached": all(b.get("cached") for b in entry["benchmarks"].values())
            and bool((entry["perplexity"] or {"cached": True}).get("cached"))}


def do_run(a: RunArgs) -> StepResult:
    from host.run.runner import RunSettings, run

    s = RunSettings(model=Path(a["model"]), out=Path(a["out"]),
                    prompts=Path(a["prompts"]) if a["prompts"] else None,
                    tokens=a["tokens"], repeats=a["repeats"], warmups=a["warmups"],
                    warmup_tokens=a.get("warmup_tokens"),
                    threads=a["threads"], workers=a["workers"], split=a["split"],
                    meters=tuple(a["meters"]), idle_s=a["idle_s"], cooldown_s=a["cooldown_s"],
                    seed=a["seed"], node=a["node"], map_id=a.get("map_id"),
                    decode_model=Path(dm) if (dm := a.get("decode_model")) else None)
    r = run(s, echo=_echo)
    return {"run_dir": str(r.run_dir), "n_requests": r.n_requests, "n_measured": r.n_measured,
            "prefill_ms_median": r.prefill_ms_median,
            "decode_tok_s_median": r.decode_tok_s_median}


def run_kind(kind: str, args: dict[str, object]) -> StepResult:
    """Run one step of `kind` with the arguments the campaign wrote (host.campaign.specs)."""
    if kind == StepKind.PREPARE:
        return do_prepare(cast(PrepareArgs, args))
    if kind == StepKind.QUANTIZE:
        return do_quantize(cast(QuantizeArgs, args))
    if kind == StepKind.DATA:
        return do_data(cast(DataArgs, args))
    if kind == StepKind.ACCURACY:
        return do_accuracy(cast(AccuracyArgs, args))
    if kind == StepKind.RUN:
        return do_run(cast(RunArgs, args))
    raise UserError(f"step kind {kind!r} is not prepare, quantize, data, accuracy or run")


def main(argv: list[str]) -> int:
    spec_path = Path(argv[0])
    spec = json.loads(spec_path.read_text())
    try:
        result = run_kind(spec["kind"], spec["args"])
    except UserError as exc:
        print(f"epi: error: {exc}", flush=True)
        write_json_atomic(spec_path.with_name("error.json"), {"error": str(exc)})
        return exc.exit_code
    except KeyboardInterrupt:
        print("step interrupted", flush=True)
        return 130
    write_json_atomic(Path(spec["result"]), result)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
