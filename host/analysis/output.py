"""The analysis output (docs/formats.md, epi.formats.analysis): build every file in memory,
then write them all atomically (a temporary sibling directory renamed into place, so an error
never leaves half an output), and `analyze_to`, the one call behind `epi analyze` and the
campaign's analysis step.

An existing output directory keeps the user's other files: only the analysis' own files are
replaced.
"""

from __future__ import annotations

import json
import math
import os
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from epi.core.errors import UserError
from epi.formats.analysis import RESULT_COLUMNS, RESULT_FORMAT, RESULT_VERSION, WINDOW_COLUMNS
from epi.formats.json_types import JSON
from host.analysis import components, instrument, pipeline
from host.analysis.model import Analysis, Options
from host.analysis.vocabulary import SCOPE_ALL


@dataclass(frozen=True)
class Inputs:
    """What the analysis read (results.json's `inputs`)."""

    run_dirs: tuple[Path, ...]
    trace: Path
    accuracy: Path | None

    def as_json(self) -> dict[str, JSON]:
        return {"run_dirs": [str(d) for d in self.run_dirs], "trace": str(self.trace),
                "accuracy": str(self.accuracy) if self.accuracy else None}


def clean(obj: object) -> JSON:
    """JSON-safe: NaN → null, numpy scalars → Python, paths → text."""
    if isinstance(obj, dict):
        return {str(k): clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [clean(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return clean(obj.tolist())
    if isinstance(obj, np.bool_):
        return bool(obj)
    if isinstance(obj, np.integer):
        return int(obj)
    if isinstance(obj, (np.floating, float)):
        return None if not math.isfinite(float(obj)) else float(obj)
    if obj is pd.NA or obj is None:
        return None
    if isinstance(obj, Path):
        return str(obj)
    if isinstance(obj, (bool, int, str)):
        return obj
    return str(obj)


def records(df: pd.DataFrame) -> list[JSON]:
    return [clean(r) for r in df.astype(object).where(df.notna(), None).to_dict("records")]


def _run_records(a: Analysis) -> list[JSON]:
    runs: list[JSON] = []
    for i in a.runs:
        runs.append(clean({
            "run_id": i.run.run_id, "path": str(i.run.path), "config": i.config,
            "status": i.run.status, "model": i.run.model,
            "placement": [{"node": p.node, "layers": list(p.layers),
                           "channels": i.node_channels.get(p.node)} for p in i.run.placement],
            "clock": {"basis": i.clock.basis, "note": i.clock.note,
                      "uncertainty_ns": i.offset_uncertainty_ns,
                      "drift_ppm": i.clock.drift_ppm,
                      "sync_points": len(i.clock.sync_local_ns)},
            "meter_boot_id": i.boot_id, "span_meter_ns": i.span_meter_ns,
            "idle_power_w": i.idle_power_w, "idle_reason": i.idle_reason,
            "saturated_readings": i.saturated,
            "verdicts": records(a.verdicts[a.verdicts["run_id"] == i.run.run_id]),
        }))
    return runs


def instrument_record(a: Analysis) -> dict[str, JSON]:
    """results.json's `instrument`: the bound, each channel's terms and the qualification."""
    terms = instrument.channel_terms(a.trace, a.power_sources)
    return {
        "max_instrument_u_pct": a.options.max_instrument_u_pct,
        "channels": {str(c): {"joules_per_count": t.joules_per_count,
                              "terms_pct": None if t.class_terms_pct is None
                              else {**t.class_terms_pct}, "none_because": t.why or None}
                     for c, t in sorted(terms.items())},
        "qualification": instrument.qualification(a.trace).as_json(),
    }


def build_outputs(a: Analysis, inputs: Inputs) -> dict[str, bytes]:
    """File name → content of every output (nothing is written here)."""
    results = a.results.reindex(columns=list(RESULT_COLUMNS))
    doc = {
        "format": RESULT_FORMAT, "format_version": RESULT_VERSION,
        "inputs": inputs.as_json(),
        "trace": {"path": str(a.trace.path), "segments": len(a.trace.segments),
                  "emulated": a.trace.emulated, "power_models": a.trace.power_models,
                  "boot_ids": a.trace.boot_ids},
        "options": {k: (str(v) if isinstance(v, Path) else v)
                    for k, v in vars(a.options).items()},
        "runs": _run_records(a),
        "results": records(results),
        "power_sources": {str(k): v for k, v in a.power_sources.items()},
        "savings": records(a.savings),
        "comparisons": records(a.comparisons),
        "prefill_regression": records(a.prefill_regression),
        "load_lag": records(a.lag),
        "phase_breakdown": records(a.breakdown),
        "pareto": a.pareto,
        "perplexity_matched_pairs": [p.to_json() for p in a.pairs],
        "layer_groups": {
            "measured": records(a.results[(a.results["scope"] != SCOPE_ALL)].reindex(
                columns=list(RESULT_COLUMNS))),
            "differential": [d.to_json() for d in a.differential],
            "time_share_estimate": [t.to_json() for t in a.time_share],
        },
        "notes": a.notes,
        "instrument": instrument_record(a),  # per-channel terms, qualification
        "components": components.records(a),  # software power sources (docs/sources.md)
    }
    return {
        "results.json": (json.dumps(clean(doc), indent=1) + "\n").encode(),
        "results.csv": results.to_csv(index=False).encode(),
        "comparisons.csv": a.comparisons.to_csv(index=False).encode(),
        "prefill_regression.csv": a.prefill_regression.to_csv(index=False).encode(),
        "lag.csv": a.lag.to_csv(index=False).encode(),
        "savings.csv": a.savings.to_csv(index=False).encode(),
        "runs.csv": a.verdicts.to_csv(index=False).encode(),
        "windows.csv": a.windows.reindex(columns=list(WINDOW_COLUMNS)).to_csv(
            index=False).encode(),
        "repeats.csv": a.repeats.to_csv(index=False).encode(),
        **components.files(a),
        **split_files(a),
    }


def split_files(a: Analysis) -> dict[str, bytes]:
    """splits.json when some runs are of split configurations (host/analysis/split_compare.py)."""
    from host.analysis import split_compare

    splits = split_compare.split_parents([(r.config, r.run.header) for r in a.runs])
    if not splits or a.repeats.empty or a.verdicts.empty:
        return {}
    diffs = split_compare.differences(a.repeats, a.verdicts, splits,
                                      basis=a.options.energy_basis, level=a.options.ci_level)
    return {split_compare.SPLITS_JSON: split_compare.write(splits, diffs)}


def write_atomically(out_dir: Path, files: dict[str, bytes], option: str = "--out") -> None:
    """Write into a temporary sibling directory, then rename into place; files in `out_dir`
    that are not among `files` stay as they were. `option` names the output in errors."""
    out_dir = Path(out_dir)
    if out_dir.exists() and not out_dir.is_dir():
        raise UserError(f"{option}: {out_dir} exists and is not a directory")
    parent = out_dir.parent if str(out_dir.parent) else Path(".")
    try:
        parent.mkdir(parents=True, exist_ok=True)
        tmp = parent / f".{out_dir.name}.tmp-{os.getpid()}"
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir()
        for name, data in files.items():
            with open(tmp / name, "wb") as fh:
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
        if not out_dir.exists():
            os.rename(tmp, out_dir)
            return
        for name in files:
            os.replace(tmp / name, out_dir / name)
        tmp.rmdir()
    except OSError as exc:
        raise UserError(f"{option}: cannot write {out_dir} ({exc.strerror})") from None


def analyze_to(out_dir: Path, run_dirs: Sequence[Path], trace_dir: Path | Sequence[Path],
               opts: Options, accuracy_file: Path | None = None, *, option: str = "--out"
               ) -> Analysis:
    """Analyse the runs and write every output file to `out_dir` (atomically); the
    Analysis comes back for the summary tables (host.analysis.summary). Several traces
    (one per meter daemon) are recorded by the first, the one whose clock they are joined in."""
    a = pipeline.analyze(list(run_dirs), trace_dir, opts, accuracy_file)
    first = trace_dir if isinstance(trace_dir, Path) else trace_dir[0]
    write_atomically(out_dir, build_outputs(a, Inputs(tuple(run_dirs), first,
                                                      accuracy_file)), option)
    return a
