"""The accuracy side of EPI: read an accuracy file and pick one figure per configuration.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from epi.core.errors import UserError
from host.analysis import statistics
from host.analysis.model import Options, RunInfo
from host.analysis.vocabulary import COMPOSITE_METRIC


# --------------------------------------------------------------------------- accuracy
def load_accuracy(path: Path | None, runs: Sequence[RunInfo], opts: Options
                  ) -> tuple[dict[str, statistics.Accuracy], dict[str, float], list[str]]:
    """Accuracy and perplexity per configuration (file joined on model sha256, CLI overrides)."""
    accs: dict[str, statistics.Accuracy] = {}
    ppl: dict[str, float] = {}
    notes: list[str] = []
    if path is not None:
        from host.accuracy.join_keys import run_join_key
        from host.accuracy.results import accuracy_by_sha256, read_results

        by_sha = accuracy_by_sha256(read_results(path))
        for info in runs:
            entry = by_sha.get(run_join_key(info.run.header))  # a split: both models' sha256
            if entry is None or info.config in accs:
                continue
            p = entry.get("perplexity") or {}
            if isinstance(p.get("ppl"), (int, float)):
                ppl[info.config] = float(p["ppl"])
            metric = opts.accuracy_metric
            if metric == COMPOSITE_METRIC:
                block = entry.get("composite") or {}
                val, ci = block.get("accuracy"), block.get("ci95")
                weights = block.get("weights") or {}
                wtxt = ", ".join(f"{k} {v:.2f}" for k, v in weights.items())
                basis = f"composite {block.get('metric', '?')} ({wtxt}) from {path}"
                if val is None:
                    notes.append(f"{info.config}: composite accuracy is null in {path}"
                                 f" ({block.get('reason', 'no reason given')})")
                    continue
            else:
                block = (entry.get("benchmarks") or {}).get(metric)
                if block is None:
                    notes.append(f"{info.config}: benchmark {metric!r} not in {path}")
                    continue
                # length-normalised like the composite's default, when the file has it
                kind = "accuracy_norm" if block.get("accuracy_norm") is not None else "accuracy"
                val = block.get(kind)
                ci = block.get("ci95_norm" if kind == "accuracy_norm" else "ci95")
                basis = f"{metric} {kind} (n={block.get('n')}) from {path}"
            lo, hi = (ci if isinstance(ci, list) and len(ci) == 2 else (None, None))
            accs[info.config] = statistics.Accuracy(
                float(val), float(lo) if lo is not None else float("nan"),
                float(hi) if hi is not None else float("nan"), basis)
    configs = {i.config for i in runs}
    for cfg, val in opts.accuracy_values.items():
        if cfg not in configs:
            raise UserError(f"--accuracy-value: no analysed run has configuration {cfg!r} "
                            f"(configurations: {', '.join(sorted(configs))})")
        if not 0.0 < val <= 1.0:
            raise UserError(f"--accuracy-value: {cfg}={val} is not in (0, 1]")
        accs[cfg] = statistics.Accuracy(val, float("nan"), float("nan"),
                                    "given on the command line (--accuracy-value)")
    return accs, ppl, notes
