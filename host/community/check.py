"""Every problem of one submission directory, one line each (MLPerf Power's checker in
spirit): nothing the summary says is taken on trust.

- the bundle is read and verified (every member's sha256, host/bundle/archive.py) and its
  file's sha256 must be the one the summary names;
- every figure is recomputed by the project's own analysis (host.analysis.output.analyze_to)
  from the bundle's token logs, trace excerpt and accuracy file, with the options the
  analysis recorded, and must match the summary (a hand-edited summary does not);
- the protocol, validity counts and power source must be the recomputed ones; a figure
  from modelled power is refused for the measured board;
- every hardware field must be stated.
"""

from __future__ import annotations

import json
import math
import tempfile
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any

from epi.core.errors import UserError
from host.bundle import archive
from host.community.make import board_of, figures, protocol, recorded_hardware
from host.community.record import Board, ConfigFigures, Submission, missing_hardware

SUMMARY = "summary.json"
#: relative tolerance for a recomputed figure (the analysis is deterministic; this is
#: only the decimal round trip of the CSV)
RTOL = 1e-9


def _close(a: object, b: object) -> bool:
    if isinstance(a, float) and isinstance(b, (int, float)) and not isinstance(b, bool):
        return math.isclose(a, float(b), rel_tol=RTOL, abs_tol=1e-12)
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return all(_close(x, y) for x, y in zip(a, b, strict=True))
    return a == b


def _recompute(bundle: archive.Bundle, tmp: Path) -> str:
    """results.csv recomputed from the bundle's own traces, token logs and accuracy file."""
    from host.analysis.model import Options
    from host.analysis.output import analyze_to

    x = tmp / "x"
    archive.unpack(bundle, x)
    runs = sorted(p for p in (x / "runs").glob("*") if p.is_dir())
    if not runs or not (x / "trace").is_dir():
        raise UserError(f"{bundle.path}: no token logs or trace excerpt to recompute from")
    opts = bundle.json("analysis/results.json")
    recorded = opts.get("options") if isinstance(opts, dict) else None
    known = {f.name for f in fields(Options)}
    kwargs: dict[str, Any] = {k: v for k, v in (recorded or {}).items()
              if k in known and (v is None or isinstance(v, (int, float, str)))
              and not str(k).endswith(("_dir", "_file", "_path"))}
    try:
        options = Options(**kwargs)
    except (TypeError, ValueError) as exc:
        raise UserError(f"{bundle.path}: the analysis options it records cannot be used "
                        f"again ({exc})") from None
    acc = x / "accuracy" / "accuracy.json"
    analyze_to(tmp / "again", runs, x / "trace", options, acc if acc.is_file() else None)
    return (tmp / "again" / "results.csv").read_text(encoding="utf-8")


def check(directory: Path, *, board: Board | None = None) -> list[str]:
    """The problems of the submission in `directory` (empty when it passes)."""
    where = str(directory)
    path = directory / SUMMARY
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        return [f"{path}: cannot read the summary ({exc.__class__.__name__})"]
    problems = []
    try:
        raw = json.loads(text)
    except (json.JSONDecodeError, RecursionError):
        raw = None
    missing = missing_hardware(raw)
    problems += [f"{path}: hardware.{f}: missing (required metadata)" for f in missing]
    if missing and isinstance(raw, dict) and isinstance(raw.get("hardware"), dict):
        return problems  # the record cannot be read without them; nothing more to say
    try:
        sub = Submission.from_json(text, str(path))
    except UserError as exc:
        return [*problems, str(exc)]
    bundle_path = directory / sub.bundle_file
    if Path(sub.bundle_file).name != sub.bundle_file:
        return [f"{path}: bundle_file: {sub.bundle_file!r} is not a file name in {where}"]
    try:
        data = bundle_path.read_bytes()
    except OSError as exc:
        return [f"{bundle_path}: cannot read the bundle ({exc.__class__.__name__})"]
    if archive.sha256_bytes(data) != sub.bundle_sha256:
        problems.append(f"{bundle_path}: sha256 is not the summary's bundle_sha256 "
                        "(bundle replaced or altered)")
    try:
        bundle = archive.read(bundle_path)
    except UserError as exc:
        return [*problems, str(exc)]
    try:
        with tempfile.TemporaryDirectory(prefix="epi-check-") as tmp:
            again = figures(_recompute(bundle, Path(tmp)), bundle)
    except UserError as exc:
        return [*problems, f"{bundle_path}: cannot recompute: {exc}"]
    problems += _compare_figures(path, sub, again)
    for key, value in recorded_hardware(bundle).items():
        if value and getattr(sub.hardware, key) != value:
            problems.append(f"{path}: hardware.{key}: says {getattr(sub.hardware, key)}, the "
                            f"bundle's runs record {value}")
    if asdict(sub.protocol) != asdict(protocol(bundle)):
        problems.append(f"{path}: protocol: not the one the bundle records "
                        f"({json.dumps(asdict(protocol(bundle)), sort_keys=True)})")
    if not sub.protocol.tokens_per_request or not sub.protocol.repeats:
        problems.append(f"{path}: protocol: tokens per request and repeats must be stated")
    true_board = board_of(again)
    if sub.board != true_board:
        problems.append(f"{path}: board: says {sub.board!r}, the recomputed power source "
                        f"is {true_board!r}")
    if board == "measured" and true_board != "measured":
        problems.append(f"{path}: modelled power is refused for the measured board "
                        f"({', '.join(sorted({c.power_source for c in again}))})")
    return problems


def _compare_figures(path: Path, sub: Submission, again: list[ConfigFigures]) -> list[str]:
    out = []
    mine = {c.config: c for c in sub.configs}
    theirs = {c.config: c for c in again}
    for name in sorted(set(mine) ^ set(theirs)):
        side = "only in the summary" if name in mine else "missing from the summary"
        out.append(f"{path}: configuration {name!r}: {side}")
    for name in sorted(set(mine) & set(theirs)):
        a, b = asdict(mine[name]), asdict(theirs[name])
        for key in a:
            if not _close(b[key], a[key]):
                out.append(f"{path}: configs[{name}].{key}: summary says {a[key]!r}, "
                           f"recomputed from the bundle {b[key]!r}")
        if b["n_runs_valid"] < b["n_runs"] and b["n_runs_valid"] == 0 and a["epi"] is not None:
            out.append(f"{path}: configs[{name}]: no valid run, yet a figure is given")
    return out
