"""The summary of one verified bundle: its configurations' headline figures, the protocol
its runs and accuracy file record, and the hardware the lab states.

`figures` reads a results table; `epi submit` gives it the bundle's own `results.csv`, the
checker the one it recomputes from the bundle's traces and token logs, so both sides of a
comparison come from the same code.
"""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

from epi import __version__
from epi.core.errors import UserError
from epi.formats.json_types import JSONObject
from host.analysis.headline import is_headline
from host.bundle.archive import Bundle, sha256_bytes
from host.bundle.facts import _map_sha, _num, _obj, _runs
from host.community.record import (
    HARDWARE_FIELDS,
    Board,
    ConfigFigures,
    Hardware,
    Protocol,
    Submission,
)

#: analysis options that decide what counts (recorded as the protocol's decide rules)
DECIDE_OPTIONS = ("cv_threshold", "ci_level", "min_samples", "max_offset_frac",
                  "energy_basis", "energy_method", "edge")


def _int(text: str | None) -> int:
    v = _num(text)
    return int(v) if v is not None else 0


def figures(results_csv: str, bundle: Bundle) -> list[ConfigFigures]:
    """Every configuration's headline figures from a results table, joined to the bundle's
    runs (model sha256) and manifests (map sha256)."""
    models: dict[str, JSONObject] = {}
    for r in _runs(bundle):
        model = r.get("model")
        if isinstance(model, dict) and model.get("map_id"):
            models.setdefault(str(model["map_id"]), model)
    out = []
    for row in csv.DictReader(io.StringIO(results_csv)):
        if not is_headline(row):
            continue
        config = row.get("config") or ""
        sha = models.get(config, {}).get("sha256")
        out.append(ConfigFigures(
            config=config, model_sha256=str(sha) if sha else None, map_id=config,
            map_sha256=_map_sha(bundle, config), power_source=row.get("power_source") or "",
            n_runs=_int(row.get("n_runs")), n_runs_valid=_int(row.get("n_runs_valid")),
            n_repeats=_int(row.get("n_repeats")),
            j_per_token=_num(row.get("j_per_token_median")),
            j_per_token_ci=[_num(row.get("j_per_token_ci_lo")),
                            _num(row.get("j_per_token_ci_hi"))],
            j_ci_coverage=_num(row.get("ci_coverage")), accuracy=_num(row.get("accuracy")),
            accuracy_ci=[_num(row.get("accuracy_ci_lo")), _num(row.get("accuracy_ci_hi"))],
            epi=_num(row.get("epi")), epi_ci=[_num(row.get("epi_ci_lo")),
                                              _num(row.get("epi_ci_hi"))],
            epi_ci_coverage=_num(row.get("epi_ci_coverage")),
            instrument_u_pct=row.get("instrument_u_pct") or "",
            qualification=row.get("board_qualification") or "",
            reason=row.get("reason") or None))
    return sorted(out, key=lambda c: c.config)


def board_of(configs: list[ConfigFigures]) -> Board:
    """"measured" only when every figure's power is measured."""
    return "measured" if configs and all(
        c.power_source.startswith("measured") for c in configs) else "modelled"


def protocol(bundle: Bundle) -> Protocol:
    """The protocol the runs, accuracy file and analysis options record."""
    tokens, repeats = set(), set()
    for r in _runs(bundle):
        s = r.get("settings")
        if isinstance(s, dict):
            if isinstance(s.get("tokens_per_request"), int):
                tokens.add(int(s["tokens_per_request"]))
            if isinstance(s.get("repeats"), int):
                repeats.add(int(s["repeats"]))
    items: dict[str, int] = {}
    shots: set[str] = set()
    if "accuracy/accuracy.json" in bundle.members:
        models = _obj(bundle, "accuracy/accuracy.json").get("models")
        for m in models if isinstance(models, list) else []:
            benches = m.get("benchmarks") if isinstance(m, dict) else None
            for name, res in (benches.items() if isinstance(benches, dict) else []):
                sub = res.get("subset") if isinstance(res, dict) else None
                if isinstance(sub, dict) and isinstance(sub.get("n"), int):
                    items[str(name)] = int(sub["n"])
                for key in ("shots", "n_shots", "num_fewshot"):
                    if isinstance(res, dict) and res.get(key) is not None:
                        shots.add(f"{name}: {res[key]}")
    opts = _obj(bundle, "analysis/results.json").get("options")
    decide: dict[str, float | int | str | None] = {}
    for k in DECIDE_OPTIONS:
        v = opts.get(k) if isinstance(opts, dict) else None
        decide[k] = v if isinstance(v, (int, float, str)) and not isinstance(v, bool) else None
    return Protocol(shots="; ".join(sorted(shots)) or "zero-shot", items=items,
                    tokens_per_request=sorted(tokens), repeats=sorted(repeats), decide=decide)


def recorded_hardware(bundle: Bundle) -> dict[str, list[str]]:
    """What the runs themselves record: the nodes and the llama.cpp build flags."""
    nodes, flags = set(), set()
    for r in _runs(bundle):
        placement = r.get("placement")
        for p in placement if isinstance(placement, list) else []:
            if isinstance(p, dict) and p.get("node"):
                nodes.add(str(p["node"]))
        llama = r.get("llama_cpp")
        bf = llama.get("build_flags") if isinstance(llama, dict) else None
        for f in (bf if isinstance(bf, list) else str(bf or "").split()):
            flags.add(str(f))
    return {"nodes": sorted(nodes), "llama_cpp_build_flags": sorted(flags)}


def read_hardware(path: Path, bundle: Bundle) -> Hardware:
    """The lab's hardware file (JSON: board, cpu, memory_gb, os, thermal) with the nodes and
    build flags the runs record (the file states them only where the runs do not); one line
    naming the file and the field when one is missing."""
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UserError(f"--hardware: {path}: no such file") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise UserError(f"--hardware: {path}: not a readable JSON file "
                        f"({exc.__class__.__name__})") from None
    if not isinstance(doc, dict):
        raise UserError(f"--hardware: {path}: expected a JSON object")
    recorded = recorded_hardware(bundle)
    for f, v in recorded.items():
        if v and f in doc and doc[f] != v:
            raise UserError(f"--hardware: {path}: field {f!r}: the runs record {v}; a "
                            "hardware file may state it only where the runs do not")
    merged = {**doc, **{f: v for f, v in recorded.items() if v}}
    for f in HARDWARE_FIELDS:
        if merged.get(f) in (None, "", []):
            raise UserError(f"--hardware: {path}: field {f!r} missing (every hardware field "
                            "is required: docs/community.md)")
    for f in ("board", "cpu", "os", "thermal"):
        if not isinstance(merged[f], str):
            raise UserError(f"--hardware: {path}: field {f!r} must be a string")
    mem = merged["memory_gb"]
    if isinstance(mem, bool) or not isinstance(mem, (int, float)) or not 0 < mem < 1e7:
        raise UserError(f"--hardware: {path}: field 'memory_gb' must be a positive number")
    for f in ("nodes", "llama_cpp_build_flags"):
        v = merged[f]
        if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
            raise UserError(f"--hardware: {path}: field {f!r} must be a list of strings")
    extra = sorted(set(merged) - set(HARDWARE_FIELDS))
    if extra:
        raise UserError(f"--hardware: {path}: unknown field {extra[0]!r}")
    return Hardware(board=str(merged["board"]), nodes=list(merged["nodes"]),
                    cpu=str(merged["cpu"]), memory_gb=float(mem), os=str(merged["os"]),
                    llama_cpp_build_flags=list(merged["llama_cpp_build_flags"]),
                    thermal=str(merged["thermal"]))


def summarize(bundle: Bundle, bundle_bytes: bytes, hardware: Hardware, lab: str,
              study: str) -> Submission:
    if "analysis/results.csv" not in bundle.members:
        raise UserError(f"{bundle.path}: no analysis/results.csv")
    configs = figures(bundle.members["analysis/results.csv"].decode("utf-8", "replace"),
                      bundle)
    if not configs:
        raise UserError(f"{bundle.path}: results.csv has no headline rows (gross J per "
                        "generated token over whole requests)")
    return Submission(lab=lab, study=study, board=board_of(configs),
                      bundle_file=bundle.path.name, bundle_sha256=sha256_bytes(bundle_bytes),
                      hardware=hardware, protocol=protocol(bundle), configs=configs,
                      epi_version=__version__)
