"""The qualification's text and its record (JSON saved beside the calibration files)."""

from __future__ import annotations

import math
from pathlib import Path

from epi.core.files import write_json_atomic
from epi.formats.json_types import JSON
from meter.qualify.analysis import ChannelQualification

QUALIFICATION_FORMAT = "epi-meter-qualification"
QUALIFICATION_FORMAT_VERSION = 1


def _fmt(x: float | None) -> str:
    if x is None:
        return "-"
    return f"{x:.4g}" if math.isfinite(x) else str(x)


def render(results: list[ChannelQualification], reference: str) -> str:
    lines = [f"reference: {reference}"]
    for q in results:
        verdict = "PASS" if q.passed else "FAIL"
        lines.append(f"channel {q.channel}: {verdict} against class {q.accuracy_class_pct:g} %"
                     f" (energy error {_fmt(q.energy_error_pct)} % ± "
                     f"{_fmt(q.energy_error_u_pct)} %, noise floor {_fmt(q.noise_floor_w)} W, "
                     f"smallest load metered {_fmt(q.smallest_load_w)} W)")
        for f in q.findings:
            mark = "ok  " if f.ok else "FAIL"
            lines.append(f"  {mark} {f.name:20s} {_fmt(f.value)} (limit {_fmt(f.limit)}): "
                         f"{f.detail}")
    return "\n".join(lines) + "\n"


def record(results: list[ChannelQualification], reference: str, board: str,
           emulated: bool) -> dict[str, JSON]:
    return {
        "format": QUALIFICATION_FORMAT,
        "format_version": QUALIFICATION_FORMAT_VERSION,
        "board": board,
        "emulated": emulated,
        "reference": reference,
        "passed": all(q.passed for q in results),
        "channels": [q.as_dict() for q in results],
    }


def save(path: Path, rec: dict[str, JSON]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(path, rec)
