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

KEY = ("config", "scope", "phase", "unit", "basis")
# Columns that hold joules (or joules per token): never negative on the gross basis, whose
# energy is what a meter counted.
_J_COLUMNS = ("j_per_token_median", "j_per_token_ci_lo", "j_per_token_ci_hi",
              "j_per_token_mean", "energy_per_request_j_median", "epi", "epi_ci_lo",
              "epi_ci_hi")


def _fail(path: Path, what: str) -> UserError:
    return UserError(f"{path}: {what}")


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
    gross = results[results["basis"].astype(str) == "gross"]
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
    have = windows[windows["scope"] == "all"].groupby(["run_id", "kind"]).size()
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
        return
    unknown = sorted(set(verdicts["run_id"].astype(str)) - run_ids)
    if unknown:
        raise _fail(path, f"run {unknown[0]!r} is not among results.json's runs (files from "
                    "different analyses)")
    if "n_runs_valid" not in results.columns:
        return
    valid = verdicts.assign(v=verdicts["valid"].astype(str).str.lower() == "true")
    counts = valid.groupby(["config", "phase"])["v"].sum()
    rows = results[(results["scope"] == "all") & (results["basis"] == "gross")]
    for r in rows.to_dict("records"):
        want = pd.to_numeric(r.get("n_runs_valid"), errors="coerce")
        if not np.isfinite(want):
            continue
        got = int(counts.get((str(r["config"]), str(r["phase"])), 0))
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
