"""Every benchmark goal, in one place, so that no threshold hides in a bench script.

`GOALS[key]`: `goal` (the number), `op` (how `measured` must compare to it: "<=", ">=", or
"in" for a [low, high] goal), `unit`, and `text` (what is measured, in a line). Each
bench/bench_*.py prints one `BENCH {json}` line per figure with the same key;
bench/run_all.py (`make bench`) collects the lines and prints the table, marking a goal
without a line as missing. docs/bench.md says how each figure is measured.
"""

from __future__ import annotations

from typing import Any

GOALS: dict[str, dict[str, Any]] = {
    "fewshot-25-vs-zeroshot-per-item": {
        "goal": 1.3, "op": "<=", "unit": "ratio",
        "text": "ARC-Challenge 25-shot s/item (prefix decoded once, shared through the KV "
                "cache) / zero-shot s/item, same model and context, one run",
    },
    "fewshot-shared-vs-recomputed": {
        "goal": 5.0, "op": ">=", "unit": "x",
        "text": "25-shot s/item recomputing the prefix per item / with the prefix shared",
    },
    "fewshot-25-vs-zeroshot-at-study-items": {
        "goal": 1.3, "op": "<=", "unit": "ratio",
        "text": "the same ratio on SmolLM2-135M with the prefix's one decode spread over the "
                "paper study's 299 ARC items (prefix decode and items' time measured apart)",
    },
    "fewshot-25-vs-zeroshot-study-shape": {
        "goal": 1.3, "op": "<=", "unit": "ratio",
        "text": "that ratio at Llama-3.1-8B's layer shape (2 layers, random weights, Q4_0): "
                "the study's model, where the prefix's attention is a small share of a layer",
    },
    "mc_scoring_vs_llama_perplexity": {  # asked to reach <= 0.8x by batching
        "goal": 0.8, "op": "<=", "unit": "ratio",
        "text": "HellaSwag scoring, epi s/item / llama-perplexity s/item (same threads; both "
                "timed at N and 2N items, difference taken: load excluded on both sides)",
    },
    "mc_scoring_cpu_vs_llama_perplexity": {
        "goal": 0.8, "op": "<=", "unit": "ratio",
        "text": "the same ratio in CPU seconds (process + children, all threads): robust to "
                "the load of a shared machine",
    },
    "mc_accuracy_diff_vs_llama_perplexity": {
        "goal": 0.005, "op": "<=", "unit": "accuracy (abs)",
        "text": "|epi accuracy_token_norm - llama-perplexity accuracy| on the same 2N items "
                "(one item in 200)",
    },
    "ppl_window_vs_llama_perplexity": {  # performance round 4: <= 0.9x at its defaults
        "goal": 0.9, "op": "<=", "unit": "ratio",
        "text": "perplexity, epi s/window / llama-perplexity s/window at llama-perplexity's "
                "defaults: batch 2048 (n_batch / n_ctx windows per decode) and flash "
                "attention on (its `auto` on the CPU), same basis as above",
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
    "split_handover_share_of_prefill_256": {
        "goal": 0.05, "op": "<=", "unit": "ratio",
        "text": "split configuration: sequence-state handover time / prefill time per request, "
                "256 context tokens (SmolLM2-135M F16 prefill, Q4_1 decode)",
    },
    "split_handover_share_of_prefill_2048": {
        "goal": 0.05, "op": "<=", "unit": "ratio",
        "text": "the same at 2,048 context tokens",
    },
    "sampler-daemon-bus-fraction": {
        "goal": 0.9, "op": ">=", "unit": "fraction",
        "text": "sweeps per second the daemon achieves on its real bus path (EmulatedSpiBus "
                "with 160 kHz wire time, system clock, sampler + driver + trace writer) as a "
                "fraction of the wire-time limit",
    },
    "sampler-soak-lost-fraction": {
        "goal": 0.0, "op": "<=", "unit": "fraction",
        "text": "fraction of scheduled reads neither written nor reported (late/skipped/failed "
                "/not ready) in a soak on the system clock at the daemon's default rate",
    },
    "fault-soak-energy-error": {
        "goal": 0.002, "op": "<=", "unit": "fraction",
        "text": "|trace energy - emulator truth less the intervals the trace declares unmetered| "
                "/ that truth, max over 4 channels, trace read back, daemon on the system "
                "clock with every fault kind in turn",
    },
    "fault-soak-unexplained-rows": {
        "goal": 0, "op": "<=", "unit": "rows",
        "text": "rows more than 1 % off the constant load (or 0 W) with no event explaining "
                "them within 2 s, same soak",
    },
    "fault-soak-overdeclared-intervals": {
        "goal": 0, "op": "<=", "unit": "intervals",
        "text": "unmetered intervals the trace declares where no fault was injected (a daemon "
                "must not hide a loss by declaring it anywhere), same soak",
    },
    "fault-soak-bridge-energy-error": {
        "goal": 0.002, "op": "<=", "unit": "fraction",
        "text": "the same soak on the bridge path (the same chips and faults behind the "
                "emulated MCU, the bridge recorder): |trace - truth less declared| / truth, max "
                "over 4 channels",
    },
    "fault-soak-bridge-unexplained-rows": {
        "goal": 0, "op": "<=", "unit": "rows",
        "text": "bridge soak: rows more than 1 % off the load (or 0 W) with no event within 2 s",
    },
    "fault-soak-bridge-overdeclared-intervals": {
        "goal": 0, "op": "<=", "unit": "intervals",
        "text": "bridge soak: unmetered intervals declared where no fault was injected",
    },
    "trace-read-stdlib-vs-read_csv": {
        "goal": 15.0, "op": "<=", "unit": "ratio",
        "text": "the checked stdlib trace reader takes at most 15x the time of a bare "
                "pandas.read_csv of the samples (pure Python on the meter side)",
    },
    "trace-read-view-vs-read_csv": {
        "goal": 20.0, "op": "<=", "unit": "ratio",
        "text": "the analysis's trace view (reader + frames + invalid intervals) takes at most "
                "20x a bare pandas.read_csv of the samples",
    },
    "analyze-study-scale-warm-s": {
        "goal": 120.0, "op": "<=", "unit": "s",
        "text": "`epi analyze` end to end on the paper study's size (148 h at 20 Hz x 4 "
                "channels, ~42.6 M rows in ~100 segments, 72 runs), columnar cache built",
    },
    "analyze-study-scale-cold-s": {
        "goal": 120.0, "op": "<=", "unit": "s",
        "text": "the same, from the CSV segments alone (every row parsed and checked, the "
                "columnar cache written)",
    },
    "analyze-study-scale-peak-mb": {
        "goal": 2048.0, "op": "<=", "unit": "MB",
        "text": "peak resident memory of that `epi analyze` process, the larger of cold and "
                "warm",
    },
    "sources-read-cost-rapl-us": {
        "goal": 1000.0, "op": "<=", "unit": "µs",
        "text": "one RAPL read (package + DRAM energy_uj) costs under 1 ms, so 20 Hz polling "
                "takes under 2 % of a core",
    },
    "sources-read-cost-hwmon-us": {
        "goal": 1000.0, "op": "<=", "unit": "µs",
        "text": "one hwmon read (every power/energy attribute) costs under 1 ms",
    },
    "sources-read-cost-nvml-binding-us": {
        "goal": 500.0, "op": "<=", "unit": "µs",
        "text": "epi's own ctypes overhead per NVML read (fake library) is small next to the "
                "~3.8 ms an nvmlDeviceGetTotalEnergyConsumption call takes on an H100",
    },
    "sources-achieved-over-update-rate-nvml": {
        "goal": [0.8, 1.05], "op": "in", "unit": "ratio",
        "text": "rows per second of a 10 Hz counter polled on its own thread, over its update "
                "rate: close to 1, and never above (never faster than the counter updates)",
    },
    "sources-poll-over-update-rate-slow-hwmon": {
        "goal": 1.5, "op": "<=", "unit": "ratio",
        "text": "a sensor that updates once a second, first polled at 10 Hz: after adapting, "
                "polls per second over updates per second at most 1.5",
    },
    "sources-wall-sweep-lateness-ratio": {
        "goal": 2.0, "op": "<=", "unit": "ratio",
        "text": "p99 lateness of the wall meter's sweeps with a slow source (40 ms reads) "
                "recorded beside it, over without: at most 2 (sources run on their own threads)",
    },
    "bridge-sweep-rate-fraction": {
        "goal": 0.9, "op": ">=", "unit": "fraction",
        "text": "sustained sweep rate through the MCU bridge as a fraction of the lesser of the "
                "SPI-limited and UART-limited rates (115200 and 921600 baud, JSON and compact)",
    },
    "bridge-clock-map-error-ms": {
        "goal": 1.0, "op": "<=", "unit": "ms",
        "text": "MCU -> Pi CLOCK_MONOTONIC mapping error against the injected truth, 50 ppm "
                "drift and jittered latency, max over the samples after the first minute (ms)",
    },
    "campaign-overhead-per-run-s": {
        "goal": 1.0, "op": "<=", "unit": "s",
        "text": "seconds a campaign run step takes beyond the same `epi run` invoked directly "
                "(journal, spec, process session, result), median over runs, tiny model",
    },
    "report-render-s": {
        "goal": 30.0, "op": "<=", "unit": "s",
        "text": "seconds `epi report` needs to render an analysis (6 figures as PNG + SVG, "
                "HTML + Markdown) of a small campaign, median of repeated renders",
    },
    "accuracy_cluster_2_vs_1_workers": {
        "goal": 1.5, "op": ">=", "unit": "ratio",
        "text": "accuracy items/s on a local Dask cluster, 2 workers / 1 worker (1 llama.cpp "
                "thread each; start-up and model load excluded); needs 2 free cores",
    },
    "adaptive_vs_fixed_time": {
        "goal": 1.0, "op": "<=", "unit": "ratio",
        "text": "measuring time of a real adaptive campaign (tiny model, emulated meter, 3 maps, "
                "all pairs, 3-6 rounds; assessments included) over a fixed protocol that "
                "reaches the same decisions (every configuration for the rounds the slowest "
                "comparison needed, at the campaign's own round time): at most 1",
    },
    "adaptive_vs_fixed_time_sim": {
        "goal": 1.0, "op": "<=", "unit": "ratio",
        "text": "the same ratio, median over simulated studies drawn from the campaign's "
                "measured means, per-round spread, invalid fraction and run/assessment times "
                "(decided by host.campaign.adaptive itself); a simulation, labelled so",
    },
    "demo-wall-s": {
        "goal": 1160.0, "op": "<=", "unit": "s",
        "text": "`epi demo` (examples/study-demo.toml, fresh campaign directory) wall time with "
                "one core kept busy by an unrelated loop (bench_demo.py --busy-cores 1): no "
                "longer than the demo before the work that keeps it valid under load (19 min 20 s)",
    },
    "cpu-steadiness-prefill-cv": {
        "goal": 0.026, "op": "<=", "unit": "CV",
        "text": "CV over requests of one llama.cpp thread's CPU s per prefill token (demo prompt, "
                "SmolLM2-135M): at 2.6 % a demo repeat (3 requests, if independent) varies 1.5 % "
                "and two repeats pass the 3 % repeat-CV gate 95 % of the time per phase (a run "
                "needs three phases; drift over tens of seconds makes it worse) "
                "(bench_cpu_steadiness.py)",
    },
    "cpu-steadiness-decode-cv": {
        "goal": 0.026, "op": "<=", "unit": "CV",
        "text": "the same for CPU s per decode token: the machine's own floor under the demo's "
                "valid runs, with no meter in the way",
    },
    "remeasure-demo-miss-prob": {
        "goal": 0.05, "op": "<=", "unit": "fraction",
        "text": "simulated demos (the demo study's plan through host/campaign/remeasure.py, each "
                "run valid with the idle pass probability on record) that end with a "
                "configuration without a valid run, with remeasure = 4; a simulation, labelled "
                "so (bench_remeasure.py)",
    },
    "demo-configs-valid-frac": {
        "goal": 1.0, "op": ">=", "unit": "fraction",
        "text": "configurations of that demo with a valid figure in every phase (for each of "
                "prefill, decode and request a run whose phase passes the default gates): "
                "every configuration valid, the demo's goal",
    },
    "demo-runs-valid-frac": {
        "goal": 1.0, "op": ">=", "unit": "fraction",
        "text": "runs of that demo whose every phase passes the default validity gates",
    },
    "demo-rq1-pair-frac": {
        "goal": 1.0, "op": ">=", "unit": "fraction",
        "text": "demo runs (bench_demo.py --runs 4 --busy-cores 0) whose first answer (same "
                "perplexity, different joules) is asked of a perplexity-matched pair",
    },
    "demo-two-decided-frac": {
        "goal": 0.75, "op": ">=", "unit": "fraction",
        "text": "demo runs in which at least 2 of the comparisons the study names end decided "
                "or equivalent (idle 2-core VM, 4 runs: at least 3 of 4)",
    },
    "demo-sizing-stated-frac": {
        "goal": 1.0, "op": ">=", "unit": "fraction",
        "text": "demo runs whose console states the run sizing (what the budget can decide) "
                "before round 1, idle or with one core busy",
    },
    "demo-wall-s-warm": {
        "goal": 960.0, "op": "<=", "unit": "s",
        "text": "the slowest warm demo (runs 2-4 of bench_demo.py --runs 4 --busy-cores 0: "
                "models, data and accuracy cached): 16 min",
    },
    "demo-undecided-without-round-count": {
        "goal": 0, "op": "<=", "unit": "comparisons",
        "text": "comparisons the demo study names left undecided without the rounds they "
                "would need",
    },
}


def met(key: str, measured: float | None) -> bool | None:
    """Whether `measured` meets goal `key` (None when not measured)."""
    if measured is None or measured != measured:  # None or NaN
        return None
    g = GOALS[key]
    if g["op"] == "in":
        low, high = g["goal"]
        return bool(low <= measured <= high)
    return measured <= g["goal"] if g["op"] == "<=" else measured >= g["goal"]
