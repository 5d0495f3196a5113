"""What goes into a bundle, gathered from an analysis directory and the inputs it names.

`results.json`'s `inputs` names the token-log directories, the trace and the accuracy file
the analysis read. A bundle holds, by member path:

- `analysis/…`: every regular file of the analysis directory (results, windows, runs, …);
- `runs/NN-RUN_ID/…`: each token-log directory's files (run.json carries the model sha256,
  llama.cpp version, build flags and CPU features, and the clock offsets);
- `manifests/MAP_ID.manifest.json`: the quantization manifest beside each run's model, where
  the model's directory is on this machine (the mix map's sha256, effective tensor types);
- `accuracy/accuracy.json`: the accuracy results (item-set hashes per benchmark);
- `trace/seg-NNNNNN.meta.json`, `.events.csv` whole (calibration, CT, board, power model),
  and `.samples.csv` cut to the rows the windows used: every sample within `MARGIN_S` of the
  meter-clock span of each run's windows (the idle baseline included).

Symbolic links are not followed, and only regular files are taken.
"""

from __future__ import annotations

import csv
import io
import math
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from epi.core.errors import UserError
from epi.formats.fields import parse_json_bytes
from epi.formats.json_types import JSON, JSONObject

MARGIN_S = 5.0
_SAFE = re.compile(r"[^A-Za-z0-9._\-]+")


@dataclass
class Collected:
    """Member path → bytes, and what the excerpt kept (for the manifest)."""

    files: dict[str, bytes] = field(default_factory=dict)
    excerpt: dict[str, JSON] = field(default_factory=dict)
    missing: list[str] = field(default_factory=list)


def safe_part(text: str) -> str:
    """A member-path part from any text (run ids, file names)."""
    return (_SAFE.sub("_", text).strip("._") or "x")[:100]


def _regular_files(d: Path) -> Iterable[Path]:
    for p in sorted(d.iterdir()):
        if p.is_file() and not p.is_symlink() and not p.name.startswith("."):
            yield p


def _add_dir(out: Collected, prefix: str, d: Path, recurse: bool) -> None:
    for p in _regular_files(d):
        out.files[f"{prefix}/{safe_part(p.name)}"] = p.read_bytes()
    if recurse:
        for sub in sorted(d.iterdir()):
            if sub.is_dir() and not sub.is_symlink() and not sub.name.startswith("."):
                _add_dir(out, f"{prefix}/{safe_part(sub.name)}", sub, recurse)


def _input_path(text: object, analysis_dir: Path, what: str) -> Path:
    """An input path as results.json records it: absolute, or relative to the directory
    the analysis ran in (tried: the current one, then the analysis directory's parent)."""
    if not isinstance(text, str) or not text:
        raise UserError(f"{analysis_dir}/results.json: field 'inputs': {what} path missing")
    p = Path(text)
    for cand in ([p] if p.is_absolute() else [p, analysis_dir.parent / p]):
        if cand.exists():
            return cand
    raise UserError(f"{analysis_dir}/results.json: {what} {text} (field 'inputs') not found: "
                    "a bundle needs it")


def window_spans(windows_csv: bytes) -> dict[str, tuple[int, int]]:
    """run id → (first, last) meter-clock time of its windows (windows.csv)."""
    spans: dict[str, tuple[int, int]] = {}
    for row in csv.DictReader(io.StringIO(windows_csv.decode("utf-8", "replace"))):
        try:
            t0, t1 = float(row["t0_meter_ns"]), float(row["t1_meter_ns"])
        except (KeyError, TypeError, ValueError):
            continue
        if not (math.isfinite(t0) and math.isfinite(t1)):
            continue
        lo, hi = spans.get(row.get("run_id") or "", (int(t0), int(t1)))
        spans[row.get("run_id") or ""] = (min(lo, int(t0)), max(hi, int(t1)))
    return spans


def excerpt_samples(data: bytes, ranges: list[tuple[int, int]]) -> tuple[bytes, int, int]:
    """The header and the rows whose `t_mono_ns` falls in one of `ranges`; (bytes, kept,
    total)."""
    lines = data.split(b"\n")
    header = lines[0]
    try:
        col = header.decode().split(",").index("t_mono_ns")
    except ValueError:
        raise UserError("trace samples file lacks a t_mono_ns column") from None
    kept, total = [header], 0
    for line in lines[1:]:
        if not line:
            continue
        total += 1
        try:
            t = int(line.split(b",")[col])
        except (IndexError, ValueError):
            continue
        if any(lo <= t <= hi for lo, hi in ranges):
            kept.append(line)
    return b"\n".join(kept) + b"\n", len(kept) - 1, total


def _trace_dirs(inputs: JSONObject, analysis_dir: Path) -> list[Path]:
    trace = inputs.get("trace")
    items = trace if isinstance(trace, list) else [trace]
    return [_input_path(t, analysis_dir, "trace") for t in items]


def _quant_manifest(run_json: bytes, where: str) -> tuple[str, bytes] | None:
    header = parse_json_bytes(run_json, where)
    model = header.get("model") if isinstance(header, dict) else None
    if not isinstance(model, dict) or not isinstance(model.get("path"), str):
        return None
    beside = Path(model["path"]).with_suffix(".manifest.json")
    if not beside.is_file() or beside.is_symlink():
        return None
    return safe_part(str(model.get("map_id") or beside.stem)), beside.read_bytes()


def collect(analysis_dir: Path) -> Collected:
    """Every member of the bundle of `analysis_dir` (see the module docstring)."""
    analysis_dir = Path(analysis_dir)
    results = analysis_dir / "results.json"
    if not results.is_file():
        raise UserError(f"{analysis_dir}: no results.json: not an analysis directory "
                        "(`epi analyze --out DIR` writes one)")
    doc = parse_json_bytes(results.read_bytes(), str(results))
    if not isinstance(doc, dict) or doc.get("format") != "epi-analysis":
        raise UserError(f"{results}: field 'format' is not 'epi-analysis'")
    inputs = doc.get("inputs")
    if not isinstance(inputs, dict):
        raise UserError(f"{results}: field 'inputs' missing")
    out = Collected()
    _add_dir(out, "analysis", analysis_dir, recurse=True)

    run_dirs = inputs.get("run_dirs")
    if not isinstance(run_dirs, list):
        raise UserError(f"{results}: field 'inputs.run_dirs' is not a list")
    for i, text in enumerate(run_dirs):
        d = _input_path(text, analysis_dir, "run directory")
        prefix = f"runs/{i:02d}-{safe_part(d.name)}"
        _add_dir(out, prefix, d, recurse=False)
        run_json = out.files.get(f"{prefix}/run.json")
        found = _quant_manifest(run_json, str(d / "run.json")) if run_json else None
        if found is not None:
            out.files[f"manifests/{found[0]}.manifest.json"] = found[1]
        elif run_json is not None:
            out.missing.append(f"quantization manifest of {d.name}'s model (not on this host)")

    if inputs.get("accuracy"):
        acc = _input_path(inputs["accuracy"], analysis_dir, "accuracy file")
        out.files["accuracy/accuracy.json"] = acc.read_bytes()

    spans = window_spans((analysis_dir / "windows.csv").read_bytes()
                         if (analysis_dir / "windows.csv").is_file() else b"")
    margin = int(MARGIN_S * 1e9)
    ranges = sorted((lo - margin, hi + margin) for lo, hi in spans.values())
    kept = total = 0
    for k, tdir in enumerate(_trace_dirs(inputs, analysis_dir)):
        prefix = "trace" if k == 0 else f"trace-{k}"
        for p in _regular_files(tdir):
            if not re.fullmatch(r"seg-\d+\.(meta\.json|events\.csv|samples\.csv)", p.name):
                continue
            data = p.read_bytes()
            if p.name.endswith(".samples.csv"):
                data, n_kept, n_total = excerpt_samples(data, ranges)
                kept, total = kept + n_kept, total + n_total
            out.files[f"{prefix}/{p.name}"] = data
    out.excerpt = {"basis": "samples within the margin of each run's window span, meter clock",
                   "margin_s": MARGIN_S, "ranges_mono_ns": [list(r) for r in ranges],
                   "rows_kept": kept, "rows_in_trace": total}
    return out


def manifest_note(c: Collected) -> dict[str, JSON]:
    """What the bundle's manifest says about its own content, beside the member list."""
    return {"trace_excerpt": c.excerpt, "not_included": list(c.missing),
            "layout": {
                "analysis/": "the analysis directory", "runs/": "token logs",
                "manifests/": "quantization manifests", "accuracy/": "accuracy results",
                "trace/": "trace excerpt: meta and events whole, samples the windows used"}}
