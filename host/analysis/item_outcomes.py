"""Per-item accuracy outcomes of each configuration, for paired accuracy comparisons.

Read from the accuracy file's benchmark entries (`items`, formats.md §4) with the same metric
and weights the EPI accuracy uses (composite: its `metric` and `weights`; one benchmark: its
length-normalised ranking when present). A file written before per-item outcomes were stored
gives none, and the comparison says so.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from host.analysis.model import Options, RunInfo
from host.analysis.vocabulary import COMPOSITE_METRIC


def load_item_outcomes(path: Path | None, runs: Sequence[RunInfo], opts: Options
                       ) -> tuple[dict[str, dict[str, dict[str, int]]], dict[str, float]]:
    """({config: {benchmark: {item id: 0/1}}}, {benchmark: weight}) from the accuracy file."""
    if path is None:
        return {}, {}
    from host.accuracy.join_keys import run_join_key
    from host.accuracy.results import accuracy_by_sha256, outcomes_by_item, read_results

    by_sha = accuracy_by_sha256(read_results(path))
    out: dict[str, dict[str, dict[str, int]]] = {}
    weights: dict[str, float] = {}
    for info in runs:
        entry = by_sha.get(run_join_key(info.run.header))  # a split: both models' sha256
        if entry is None or info.config in out:
            continue
        benches = entry.get("benchmarks") or {}
        if opts.accuracy_metric == COMPOSITE_METRIC:
            block = entry.get("composite") or {}
            metric = str(block.get("metric") or "accuracy_norm")
            w = {str(k): float(v) for k, v in (block.get("weights") or {}).items()}
        else:
            b = benches.get(opts.accuracy_metric) or {}
            metric = "accuracy_norm" if b.get("accuracy_norm") is not None else "accuracy"
            w = {opts.accuracy_metric: 1.0}
        per: dict[str, dict[str, int]] = {}
        for bench in w:
            got = outcomes_by_item(benches.get(bench) or {}, metric)
            if got is not None:
                per[bench] = got
        if per:
            out[info.config] = per
            weights = weights or w
    return out, weights
