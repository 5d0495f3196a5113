"""Every benchmark goal, in one place (issue 18: no hidden thresholds).

`GOALS[key]`: `goal` (the number), `op` (how `measured` must compare to it: "<=" or ">="),
`unit`, and `text` (what is measured, in a line). Each bench/bench_*.py prints one
`BENCH {json}` line per figure with the same key; bench/run_all.py (`make bench`) collects the
lines and prints the table, marking a goal without a line as missing. docs/bench.md says how
each figure is measured. Other lanes add their own keys.
"""

from __future__ import annotations

from typing import Any

GOALS: dict[str, dict[str, Any]] = {
    "mc_scoring_vs_llama_perplexity": {
        "goal": 1.0, "op": "<=", "unit": "ratio",
        "text": "HellaSwag scoring, epi s/item / llama-perplexity s/item (same threads; both "
                "timed at N and 2N items, difference taken: load excluded on both sides)",
    },
    "mc_scoring_cpu_vs_llama_perplexity": {
        "goal": 1.0, "op": "<=", "unit": "ratio",
        "text": "the same ratio in CPU seconds (process + children, all threads): robust to "
                "the load of a shared machine",
    },
    "mc_accuracy_diff_vs_llama_perplexity": {
        "goal": 0.005, "op": "<=", "unit": "accuracy (abs)",
        "text": "|epi accuracy_token_norm - llama-perplexity accuracy| on the same 2N items "
                "(one item in 200)",
    },
    "ppl_window_vs_llama_perplexity": {
        "goal": 1.0, "op": "<=", "unit": "ratio",
        "text": "perplexity, epi s/window / llama-perplexity s/window (same basis as above)",
    },
    "aligner_vs_numpy_pass": {
        "goal": 3.0, "op": "<=", "unit": "ratio",
        "text": "window_energy on every channel / one np.cumsum pass over the same samples",
    },
    "aligner_speedup_vs_window_loop": {
        "goal": 10.0, "op": ">=", "unit": "x",
        "text": "best straightforward per-window loop (slices of precomputed arrays, "
                "np.trapezoid) / window_energy",
    },
    "aligner_speedup_vs_pandas": {
        "goal": 5.0, "op": ">=", "unit": "x",
        "text": "pandas as a user would write it (merge_asof + groupby) / window_energy "
                "(worth its complexity: at least 5x what a pandas user gets)",
    },
    "runner_vs_bare_llama_cpp": {
        "goal": 0.99, "op": ">=", "unit": "ratio",
        "text": "tokens/s of the epi runner with all logging / a bare llama-cpp-python loop",
    },
}


def met(key: str, measured: float | None) -> bool | None:
    """Whether `measured` meets goal `key` (None when not measured)."""
    if measured is None or measured != measured:  # None or NaN
        return None
    g = GOALS[key]
    return measured <= g["goal"] if g["op"] == "<=" else measured >= g["goal"]
