"""`epi analyze --json`: the console summary as one document (docs/analysis.md, "The summary
as JSON"; schema docs/schemas/epi-analysis-summary.schema.json): per configuration the
headline figure on the analysis's basis with its interval, accuracy and EPI; every invalid
run phase with its reasons; the notes. The full figures stay in results.json."""

from __future__ import annotations

import math

import pandas as pd

from epi.formats.json_types import JSON
from host.analysis.headline import headline_rows
from host.analysis.model import Analysis

SUMMARY_FORMAT, SUMMARY_VERSION = "epi-analysis-summary", 1


def _num(value: object) -> float | None:
    """A finite float, else None (null in JSON: never a silent zero)."""
    try:
        x = float(value)  # type: ignore[arg-type]  # pandas cells: numbers, NaN or None
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None


def _text(value: object) -> str | None:
    """A cell's text, else None: a missing cell (None, NaN) or an empty one is null in JSON,
    never the text "nan", "None" or ""."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    return str(value) or None


def summary_document(a: Analysis, out_dir: str) -> dict[str, JSON]:
    basis = a.options.energy_basis
    res = a.results
    head = headline_rows(res, basis)
    configs: list[JSON] = []
    for _, r in head.iterrows():
        configs.append({
            "config": str(r["config"]), "power_source": _text(r["power_source"]),
            "n_runs": int(r["n_runs"]), "n_runs_valid": int(r["n_runs_valid"]),
            "j_per_generated_token": {
                "basis": basis, "median": _num(r["j_per_token_median"]),
                "ci_lo": _num(r["j_per_token_ci_lo"]), "ci_hi": _num(r["j_per_token_ci_hi"]),
                "ci_coverage": _num(r["ci_coverage"]),
                "n_repeats": int(r["n_repeats"]) if _num(r["n_repeats"]) is not None else 0,
                "instrument_u_pct": _num(r.get("instrument_u_pct"))},
            "accuracy": _num(r["accuracy"]), "epi": _num(r["epi"]),
            "epi_ci_lo": _num(r["epi_ci_lo"]), "epi_ci_hi": _num(r["epi_ci_hi"]),
            "reason": _text(r["reason"]),
        })
    bad: pd.DataFrame = a.verdicts[~a.verdicts["valid"].astype(bool)]
    return {
        "format": SUMMARY_FORMAT, "format_version": SUMMARY_VERSION,
        "out": out_dir, "energy_basis": basis,
        "configurations": configs,
        "invalid": [{"config": str(r["config"]), "run_id": str(r["run_id"]),
                     "phase": str(r["phase"]), "reasons": str(r["reasons"])}
                    for _, r in bad.iterrows()],
        "pareto": list(a.pareto),
        "notes": list(a.notes),
    }
