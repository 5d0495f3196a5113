"""The analysis output format (`epi analyze --out DIR`, docs/formats.md): its name, version,
files and the columns of its two wide tables. The writer is host.analysis.output; the readers
(host.report.data, host.search.measure) check `format` against RESULT_FORMAT.

Standard library only: a declaration, no pandas.
"""

from __future__ import annotations

RESULT_FORMAT = "epi-analysis"
RESULT_VERSION = 1

# the files every analysis directory holds (plus the software components' own, when present)
RESULT_FILES = ("results.json", "results.csv", "comparisons.csv", "prefill_regression.csv",
                "lag.csv", "savings.csv", "runs.csv", "windows.csv", "repeats.csv")

WINDOW_COLUMNS = (
    "run_id", "config", "kind", "request_id", "repeat", "prompt_id", "scope", "power_source",
    "t0_local_ns", "t1_local_ns", "t0_meter_ns", "t1_meter_ns", "duration_s",
    "n_prompt_tokens", "n_generated_tokens", "n_samples", "energy_j", "energy_method",
    "energy_net_j", "energy_trapezoid_j", "energy_counter_j", "counter_minus_trapezoid_j",
    "counter_resolution_j", "power_w", "lag_correction_ms", "lag_energy_moved_j",
    "request_method", "reason_code",
    "reason", "counter_reason", "net_reason",
)
RESULT_COLUMNS = (
    "config", "scope", "layers", "phase", "unit", "basis", "figure", "power_source", "n_runs",
    "n_runs_valid", "n_repeats", "j_per_token_median", "j_per_token_cv", "j_per_token_ci_lo",
    "j_per_token_ci_hi", "ci_method", "ci_coverage", "ci_level_met", "ci_note",
    "ci_level_wanted", "j_per_token_mean", "j_per_token_mean_ci_lo", "j_per_token_mean_ci_hi",
    "energy_per_request_j_median", "duration_per_request_s_median", "accuracy",
    "accuracy_ci_lo", "accuracy_ci_hi", "accuracy_basis", "epi", "epi_ci_lo", "epi_ci_hi",
    "epi_ci_coverage", "epi_energy_basis", "epi_reason", "perplexity", "pareto",
    "prefill_regression_j_per_token", "prefill_regression_ci_lo", "prefill_regression_ci_hi",
    "prefill_regression_method", "lag_correction", "energy_method", "edge_model", "reason",
    # the instrument term beside the repeat interval, and the board's qualification
    "instrument_u_pct", "instrument_u_basis", "board_qualification",
)
