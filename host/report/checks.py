"""Checks that the analysis files agree with each other before the report believes them.

The report reads five files that one `epi analyze` run wrote together. A file edited, cut
short or copied in from another analysis would otherwise give a report that contradicts
itself (a valid configuration shown as "null — invalid runs", valid-run counts that change
while the medians stay, a configuration with no run still shown) or a crash. Each check
refuses in one line naming the file, the field and the problem.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np
import pandas as pd

from epi.core.errors import UserError
from host.analysis.vocabulary import SCOPE_ALL, EnergyBasis, Phase, TokenUnit

KEY = ("config", "scope", "phase", "unit", "basis")
# Columns that hold joules (or joules per token): never negative on the gross basis, whose
# energy is what a meter counted.
_J_COLUMNS = ("j_per_token_median", "j_per_token_ci_lo", "j_per_token_ci_hi",
              "j_per_token_mean", "energy_per_request_j_median", "epi", "epi_ci_lo",
              "epi_ci_hi")


# The columns the report reads as numbers or as true/false, per file; a cell that is neither
# empty nor of its kind is refused (a text in a number column would otherwise crash a figure).
NUMBERS = {
    "results.csv": ("n_runs", "n_runs_valid", "n_repeats", "j_per_token_median",
                    "j_per_token_cv", "j_per_token_ci_lo", "j_per_token_ci_hi", "ci_coverage",
                    "j_per_token_mean", "energy_per_request_j_median",
                    "duration_per_request_s_median", "accuracy", "accuracy_ci_lo",
                    "accuracy_ci_hi", "epi", "epi_ci_lo", "epi_ci_hi", "epi_ci_coverage",
                    "perplexity"),
    "runs.csv": ("cv", "n_windows", "median_duration_s"),
    "windows.csv": ("request_id", "t0_local_ns", "t1_local_ns", "t0_meter_ns", "t1_meter_ns",
                    "duration_s", "n_prompt_tokens", "n_generated_tokens", "n_samples",
                    "energy_j", "energy_net_j"),
    "repeats.csv": ("j_per_token", "energy_per_request_j", "duration_per_request_s"),
}
COUNTS = {"n_runs", "n_runs_valid", "n_repeats", "n_windows", "n_samples", "n_prompt_tokens",
          "n_generated_tokens", "request_id"}
MAX_COUNT = 2 ** 53
BOOLS = {"runs.csv": ("valid",)}
_TRUE_FALSE = {"true", "false", "1", "0", "1.0", "0.0"}


def _fail(path: Path, what: str) -> UserError:
    return UserError(f"{path}: {what}")


def check_types(table: pd.DataFrame, path: Path) -> None:
    """Every number column holds numbers (or nothing), every true/false column true or false."""
    for col in NUMBERS.get(path.name, ()):
        if col not in table.columns:
            continue
        raw = table[col]
        vals = pd.to_numeric(raw, errors="coerce").astype(float).to_numpy()
        # a cell that did not read as a number: bad unless it is a spelt-out nan or empty
        # (the text test runs only when there is such a cell: it is most of the load's time)
        bad = raw.notna().to_numpy() & np.isnan(vals)
        if bad.any():
            bad &= ~raw.astype(str).str.lower().isin(["nan", ""]).to_numpy()
        bad |= np.isinf(vals)
        if col in COUNTS:
            bad |= ~np.isnan(vals) & ((vals < 0) | (vals >= MAX_COUNT)
                                      | (vals != np.floor(vals)))
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            what = "a count (a whole number ≥ 0)" if col in COUNTS else "a finite number"
            raise _fail(path, f"row {i + 2}: field {col!r} is {str(raw.iloc[i])[:40]!r}, "
                        f"not {what}")
    for col in BOOLS.get(path.name, ()):
        if col not in table.columns:
            continue
        raw = table[col].astype(str).str.strip().str.lower()
        bad = ~raw.isin(_TRUE_FALSE)
        if bad.any():
            i = int(np.flatnonzero(bad.to_numpy())[0])
            raise _fail(path, f"row {i + 2}: field {col!r} is {str(table[col].iloc[i])[:40]!r}, "
                        "expected True or False")


def check_results(results: pd.DataFrame, path: Path, run_configs: set[str]) -> None:
    """One row per (config, scope, phase, unit, basis); no negative gross joules; every
    configuration has runs in results.json."""
    if results.empty:
        return
    dup = results.duplicated(list(KEY), keep=False)
    if dup.any():
        i = int(np.flatnonzero(dup.to_numpy())[0])
        r = results.iloc[i]
        raise _fail(path, f"row {i + 2}: duplicated row for config {r['config']!r}, scope "
                    f"{r['scope']!r}, phase {r['phase']!r}, unit {r['unit']!r}, basis "
                    f"{r['basis']!r} (each figure must appear once)")
    gross = results[results["basis"].astype(str) == EnergyBasis.GROSS]
    for col in _J_COLUMNS:
        if col not in gross.columns:
            continue
        vals = pd.to_numeric(gross[col], errors="coerce")
        if vals.isna().all() and gross[col].notna().any():
            raise _fail(path, f"column {col!r}: not numbers")
        neg = vals < 0
        if neg.any():
            idx = neg.idxmax()
            raise _fail(path, f"row {int(results.index.get_loc(idx)) + 2}: field {col!r} is "
                        f"{float(vals[idx]):g}, a negative gross energy (config "
                        f"{gross.loc[idx, 'config']!r})")
    extra = sorted(set(results["config"].astype(str)) - run_configs)
    if extra:
        raise _fail(path, f"configuration {extra[0]!r} has no run in results.json (files "
                    "from different analyses, or edited)")
    missing = sorted(run_configs - set(results["config"].astype(str)))
    if missing:
        raise _fail(path, f"configuration {missing[0]!r} of results.json's runs has no row "
                    "(files from different analyses, or edited)")


def check_windows(windows: pd.DataFrame, path: Path, verdicts: pd.DataFrame,
                  run_ids: set[str]) -> None:
    """windows.csv complete: not cut mid-line, every window of a known run, and as many
    windows per run and phase as the verdicts (runs.csv) counted."""
    try:
        with open(path, "rb") as fh:
            fh.seek(0, 2)
            size = fh.tell()
            if size:
                fh.seek(size - 1)
                if fh.read(1) != b"\n":
                    raise _fail(path, "truncated: the last line has no line end (cut short "
                                "while written or copied)")
    except OSError as exc:
        raise _fail(path, f"cannot read ({exc.strerror})") from None
    if windows.empty:
        return
    for col in ("run_id", "config", "kind", "scope"):
        missing = windows[col].isna()
        if missing.any():
            raise _fail(path, f"row {int(np.flatnonzero(missing.to_numpy())[0]) + 2}: field "
                        f"{col!r} is empty (truncated or edited)")
    unknown = sorted(set(windows["run_id"].astype(str)) - run_ids)
    if unknown:
        raise _fail(path, f"run {unknown[0]!r} is not among results.json's runs (files from "
                    "different analyses)")
    energy = pd.to_numeric(windows["energy_j"], errors="coerce")
    if (energy < 0).any():
        i = int(np.flatnonzero((energy < 0).to_numpy())[0])
        raise _fail(path, f"row {i + 2}: field 'energy_j' is {float(energy.iloc[i]):g}, a "
                    "negative energy")
    if verdicts.empty or "n_windows" not in verdicts.columns:
        return
    have = windows[windows["scope"] == SCOPE_ALL].groupby(["run_id", "kind"]).size()
    for r in verdicts.to_dict("records"):
        want = pd.to_numeric(r.get("n_windows"), errors="coerce")
        if not np.isfinite(want):
            continue
        got = int(have.get((str(r["run_id"]), str(r["phase"])), 0))
        if got < int(want):
            raise _fail(path, f"run {r['run_id']!r} phase {r['phase']!r}: {got} windows, "
                        f"runs.csv counted {int(want)} (truncated?)")


def check_verdicts(verdicts: pd.DataFrame, path: Path, results: pd.DataFrame,
                   run_ids: set[str]) -> None:
    """runs.csv agrees with results.csv: per configuration and phase, the number of valid
    runs is the one results.csv's figures were computed from."""
    if verdicts.empty:
        if run_ids:
            raise _fail(path, f"holds no run, but results.json lists {len(run_ids)} (files "
                        "from different analyses, or emptied)")
        return
    unknown = sorted(set(verdicts["run_id"].astype(str)) - run_ids)
    if unknown:
        raise _fail(path, f"run {unknown[0]!r} is not among results.json's runs (files from "
                    "different analyses)")
    if "n_runs_valid" not in results.columns:
        return
    valid = verdicts.assign(v=verdicts["valid"].astype(str).str.lower() == "true")
    counts = valid.groupby(["config", "phase"])["v"].sum()
    rows = results[(results["scope"] == SCOPE_ALL) & (results["basis"] == EnergyBasis.GROSS)]
    for r in rows.to_dict("records"):
        want = pd.to_numeric(r.get("n_runs_valid"), errors="coerce")
        if not np.isfinite(want):
            continue
        got = int(counts.get((str(r["config"]), str(r["phase"])), 0))
        figure = pd.to_numeric(r.get("j_per_token_median"), errors="coerce")
        if (want > 0 and not np.isfinite(figure) and r["phase"] == Phase.REQUEST
                and r.get("unit") == TokenUnit.GENERATED):
            raise _fail(path.with_name("results.csv"), f"configuration {r['config']!r}: "
                        f"j_per_token_median is empty although {int(want)} valid run(s) "
                        "give it (edited, or a damaged analysis)")
        if got != int(want):
            raise _fail(path, f"configuration {r['config']!r} phase {r['phase']!r}: {got} "
                        f"valid run(s), but results.csv's figures come from {int(want)} "
                        "(files from different analyses, or edited)")


def run_index(doc: Mapping[str, object]) -> tuple[set[str], set[str]]:
    """(run ids, configurations) of results.json's runs."""
    runs = doc.get("runs")
    runs = runs if isinstance(runs, list) else []
    return ({str(r["run_id"]) for r in runs if isinstance(r, dict)},
            {str(r["config"]) for r in runs if isinstance(r, dict)})


# results.json's record lists: the names each record must carry (known configurations or
# plain strings), and the kinds of the fields the report reads. A number may be null.
_NAME, _TEXT, _NUM, _FLAG = "name", "text", "number", "flag"
RECORDS: dict[str, dict[str, str]] = {
    "comparisons": {"comparison": _TEXT, "config_a": _NAME, "config_b": _NAME,
                    **dict.fromkeys(("energy_delta_j_per_token", "energy_delta_ci_lo",
                                     "energy_delta_ci_hi", "energy_ci_coverage", "n_pairs",
                                     "accuracy_delta", "accuracy_delta_ci_lo",
                                     "accuracy_delta_ci_hi", "accuracy_mcnemar_p",
                                     "accuracy_n_items", "accuracy_discordant"), _NUM),
                    "energy_distinguishable": _FLAG, "accuracy_distinguishable": _FLAG},
    "savings": {"config": _NAME, "baseline": _NAME,
                **dict.fromkeys(("j_per_token", "latency_s", "energy_saving_pct",
                                 "energy_saving_pct_ci_lo", "energy_saving_pct_ci_hi",
                                 "energy_ci_coverage", "n_pairs", "latency_saving_pct",
                                 "accuracy_delta", "accuracy_delta_ci_lo",
                                 "accuracy_delta_ci_hi", "accuracy_mcnemar_p"), _NUM),
                "energy_distinguishable": _FLAG, "accuracy_distinguishable": _FLAG},
    "perplexity_matched_pairs": {"cheaper": _NAME, "dearer": _NAME,
                                 **dict.fromkeys(("ppl_cheaper", "ppl_dearer",
                                                  "j_per_token_cheaper", "j_per_token_dearer",
                                                  "saving_pct", "saving_pct_ci_lo",
                                                  "saving_pct_ci_hi", "ci_coverage",
                                                  "n_pairs"), _NUM),
                                 "distinguishable": _FLAG},
    "phase_breakdown": {"config": _NAME, **dict.fromkeys(("prefill_mj", "decode_mj",
                                                         "idle_mj"), _NUM)},
    "layer_groups.differential": {"group": _TEXT, "config_a": _NAME, "config_b": _NAME,
                                  "type_a": _TEXT, "type_b": _TEXT,
                                  **dict.fromkeys(("delta_j_per_token", "ci_lo", "ci_hi",
                                                   "ci_coverage", "n_a", "n_b"), _NUM),
                                  "distinguishable": _FLAG},
}
_OPTIONAL_TEXT = ("reason", "verdict", "energy_ci_method", "accuracy_method", "ci_method",
                  "power_source", "method", "energy_basis", "basis")


def _field_ok(value: object, kind: str, configs: set[str]) -> bool:
    if kind == _NAME:
        return isinstance(value, str) and value in configs
    if kind == _TEXT:
        return isinstance(value, str)
    if kind == _FLAG:
        return value is None or isinstance(value, bool)
    return value is None or (isinstance(value, int | float) and not isinstance(value, bool))


def _records(doc: Mapping[str, object], key: str) -> object:
    if "." not in key:
        return doc.get(key)
    outer, inner = key.split(".")
    holder = doc.get(outer)
    return holder.get(inner) if isinstance(holder, dict) else None


def check_records(doc: Mapping[str, object], path: Path, configs: set[str]) -> None:
    """Every record the report words or tabulates has its names (configurations of this
    analysis) and fields of the right kind; `pareto` and `notes` hold strings."""
    for key, fields in RECORDS.items():
        rows = _records(doc, key)
        if rows is None:
            continue
        if not isinstance(rows, list):
            raise _fail(path, f"field {key!r}: expected a list of records")
        for i, r in enumerate(rows):
            where = f"field '{key}[{i}]'"
            if not isinstance(r, dict):
                raise _fail(path, f"{where}: expected an object, got {type(r).__name__}")
            for name, kind in fields.items():
                if kind in (_NAME, _TEXT) and name not in r:
                    raise _fail(path, f"{where}: key {name!r} missing")
                if name in r and not _field_ok(r[name], kind, configs):
                    want = {"name": "a configuration of this analysis", "text": "a string",
                            "flag": "true, false or null", "number": "a number or null"}[kind]
                    raise _fail(path, f"{where}.{name}: expected {want}, got "
                                f"{str(r[name])[:40]!r}")
            for name in _OPTIONAL_TEXT:
                if r.get(name) is not None and not isinstance(r[name], str):
                    raise _fail(path, f"{where}.{name}: expected a string")
    for key in ("pareto", "notes"):
        items = doc.get(key)
        if isinstance(items, list) and not all(isinstance(x, str) for x in items):
            raise _fail(path, f"field {key!r}: expected a list of strings")
    pareto = doc.get("pareto")
    if isinstance(pareto, list):
        unknown = [c for c in pareto if c not in configs]
        if unknown:
            raise _fail(path, f"field 'pareto': {str(unknown[0])[:40]!r} is not a configuration "
                        "of this analysis")
