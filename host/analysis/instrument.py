"""The instrument part of a J/token figure's uncertainty, and whether the board was
qualified.

The repeat interval covers repeat-to-repeat variation only. The meter chain adds its own,
separate term, from the closed forms of `meter.plan` (docs/atm90e26.md §3):

* the chip's active-energy class, `CHIP_ENERGY_ACCURACY_PCT` (0.1 %);
* the gain reference: the calibration reference (`DEFAULT_REFERENCE_PCT`, a plug-in meter's
  1 %) when the channel ran with a calibration file, else the CT's class
  (`ct.accuracy_class_pct` from the trace meta, `DEFAULT_CT_CLASS_PCT` when not given);
* one energy count (`joules_per_count` of the channel's meter constant) over the figure's
  energy per window — one count per channel behind the figure, summed.

The terms are combined root-sum-square, as `meter.plan.figures` does. Where several channels
stand behind a figure, the class terms are taken as their largest (one reference calibrates
them all: correlated, so they do not shrink by summing). The PL-constant rounding term of the
plan needs the chip's front end, which the trace meta does not record: it is left out and the
basis says so.

A channel whose power is modelled (emulator) or read from a software source has no
instrument term: the figure says "n/a (modelled)" / "n/a (software source)", never 0.

Qualification (docs/analysis.md "Instrument uncertainty and qualification"): the record is
looked for, in order, (1) at `qualification` in the segment meta (a path, or the record
itself), (2) as `qualification.json` beside the first channel calibration file named in the
meta (`channels[].calibration.source`, where `epi meter qualify` saves it), (3) as
`qualification.json` beside the board file (`board.path`). Relative paths are tried as given,
then against the trace directory. None found: the board is not qualified, and every figure
on it says so.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from epi.formats.json_types import JSON, JSONObject
from host.analysis.power_source import MEASURED
from host.analysis.traces import Trace
from meter.plan import (
    CHIP_ENERGY_ACCURACY_PCT,
    DEFAULT_CT_CLASS_PCT,
    DEFAULT_REFERENCE_PCT,
    joules_per_count,
)

QUALIFICATION_FILE = "qualification.json"
UNCALIBRATED_PREFIX = "design"  # meter.chip_factory: "design values (uncalibrated)"
DEFAULT_MAX_INSTRUMENT_U_PCT = 2.0  # the analysis option's default bound (Options)


@dataclass(frozen=True)
class ChannelInstrument:
    """One channel's instrument terms (None: no instrument term — `why` says why)."""

    channel: int
    joules_per_count: float | None
    class_terms_pct: dict[str, float] | None
    why: str  # "" when the terms are known; else "modelled" / "software source" / reason


@dataclass(frozen=True)
class Qualification:
    """Whether the board was qualified, as the analysis found it."""

    qualified: bool
    passed: bool | None
    class_pct: float | None
    path: str | None
    detail: str  # one plain line for tables and the report

    def as_json(self) -> dict[str, JSON]:
        return {"qualified": self.qualified, "passed": self.passed,
                "class_pct": self.class_pct, "path": self.path, "detail": self.detail}


@dataclass(frozen=True)
class FigureInstrument:
    """The instrument term of one figure."""

    u_pct: float  # NaN when there is none
    basis: str


def _num(x: object) -> float | None:
    if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x):
        return None
    return float(x)


def _channel_meta(trace: Trace) -> dict[int, JSONObject]:
    """channel → its last segment's `channels[]` entry (meta.json); a joined trace's channels
    from the trace each came from."""
    if trace.origins:
        per = {id(t): _channel_meta(t) for t in trace.member_traces}
        return {new: per[id(t)][ch] for new, (t, ch) in trace.origins.items()
                if ch in per[id(t)]}
    out: dict[int, JSONObject] = {}
    for seg in trace.segments:
        chans = seg.meta.get("channels")
        for ch in chans if isinstance(chans, list) else []:
            if isinstance(ch, dict) and isinstance(ch.get("channel"), int):
                out[int(ch["channel"])] = ch
    return out


def channel_terms(trace: Trace, sources: dict[int, str]) -> dict[int, ChannelInstrument]:
    """Each channel's instrument terms from the trace meta and `meter.plan`'s closed forms."""
    metas = _channel_meta(trace)
    out: dict[int, ChannelInstrument] = {}
    for ch, label in sources.items():
        if "modelled" in label:
            out[ch] = ChannelInstrument(ch, None, None, "modelled")
            continue
        if label != MEASURED:
            out[ch] = ChannelInstrument(ch, None, None, "software source")
            continue
        meta = metas.get(ch, {})
        mc = _num(meta.get("meter_constant_imp_per_kwh"))
        if mc is None or mc <= 0:
            out[ch] = ChannelInstrument(ch, None, None, "meter constant not in the trace meta")
            continue
        cal = meta.get("calibration")
        source = str(cal.get("source") or "") if isinstance(cal, dict) else ""
        calibrated = bool(source) and not source.startswith(UNCALIBRATED_PREFIX)
        ct = meta.get("ct")
        ct_class = _num(ct.get("accuracy_class_pct")) if isinstance(ct, dict) else None
        terms = {"chip energy class": CHIP_ENERGY_ACCURACY_PCT}
        if calibrated:
            terms["calibration reference"] = DEFAULT_REFERENCE_PCT
        else:
            terms["CT class" + ("" if ct_class is not None else " (assumed)")] = (
                ct_class if ct_class is not None else DEFAULT_CT_CLASS_PCT)
        out[ch] = ChannelInstrument(ch, joules_per_count(mc), terms, "")
    return out


def figure_term(channels: list[int], terms: dict[int, ChannelInstrument],
                energy_per_window_j: float) -> FigureInstrument:
    """The instrument uncertainty (%, k = 1) of a figure whose windows hold
    `energy_per_window_j` on `channels`."""
    if not channels:
        return FigureInstrument(math.nan, "n/a (no meter channel)")
    missing = sorted({terms[c].why if c in terms else "channel not in the trace"
                      for c in channels if c not in terms or terms[c].class_terms_pct is None})
    if missing:
        return FigureInstrument(math.nan, f"n/a ({'; '.join(missing)})")
    if not (math.isfinite(energy_per_window_j) and energy_per_window_j > 0):
        return FigureInstrument(math.nan, "n/a (the figure has no positive energy per window)")
    classes: dict[str, float] = {}
    count_j = 0.0
    for c in channels:
        t = terms[c]
        assert t.class_terms_pct is not None and t.joules_per_count is not None
        for k, v in t.class_terms_pct.items():
            classes[k] = max(classes.get(k, 0.0), v)
        count_j += t.joules_per_count
    count_pct = count_j / energy_per_window_j * 100.0
    parts = {**classes, "one count per window": count_pct}
    total = math.sqrt(sum(v * v for v in parts.values()))
    basis = ("root-sum-square of " + ", ".join(f"{k} {v:.3g} %" for k, v in parts.items())
             + " (meter.plan; PL-constant rounding not in the trace meta)")
    return FigureInstrument(total, basis)


def _candidates(trace: Trace) -> list[tuple[Path, str]]:
    """(path, how it was found) in the order of the rule in the module docstring."""
    out: list[tuple[Path, str]] = []
    for seg in reversed(trace.segments):
        q = seg.meta.get("qualification")
        if isinstance(q, str) and q:
            out.append((Path(q), "named in the trace meta"))
        for ch in sorted(_channel_meta(trace).items()):
            cal = ch[1].get("calibration")
            src = str(cal.get("source") or "") if isinstance(cal, dict) else ""
            if src and not src.startswith(UNCALIBRATED_PREFIX):
                out.append((Path(src).parent / QUALIFICATION_FILE,
                            "beside the calibration file"))
                break
        board = seg.meta.get("board")
        bpath = board.get("path") if isinstance(board, dict) else None
        if isinstance(bpath, str) and bpath:
            out.append((Path(bpath).parent / QUALIFICATION_FILE, "beside the board file"))
        break  # the last segment's meta describes the board that made the trace
    return out


def _from_record(rec: object, where: str) -> Qualification:
    if not isinstance(rec, dict) or rec.get("format") != "epi-meter-qualification":
        return Qualification(False, None, None, where,
                             f"not qualified: {where} is not an epi-meter-qualification record")
    passed = rec.get("passed")
    chans = rec.get("channels")
    classes = [_num(c.get("accuracy_class_pct")) for c in chans if isinstance(c, dict)] \
        if isinstance(chans, list) else []
    known = [c for c in classes if c is not None]
    cls = max(known) if known else None
    ok = passed if isinstance(passed, bool) else None
    emu = " (emulated board)" if rec.get("emulated") else ""
    verdict = {True: "PASSED", False: "FAILED", None: "verdict not recorded"}[ok]
    cls_text = f"class {cls:g} %" if cls is not None else "class not recorded"
    return Qualification(True, ok, cls, where,
                         f"qualified{emu}: {verdict} against {cls_text} ({where})")


def qualification(trace: Trace) -> Qualification:
    """The board's qualification record, found by the rule in the module docstring."""
    for seg in reversed(trace.segments):
        q = seg.meta.get("qualification")
        if isinstance(q, dict):
            return _from_record(q, "the trace meta")
        break
    tried: list[str] = []
    for path, how in _candidates(trace):
        for p in dict.fromkeys([path, trace.path / path] if not path.is_absolute()
                               else [path]):
            tried.append(str(p))
            if p.is_file():
                try:
                    rec = json.loads(p.read_text())
                except (OSError, ValueError):
                    return Qualification(False, None, None, str(p),
                                         f"not qualified: {p} ({how}) is not readable JSON")
                return _from_record(rec, f"{p}, {how}")
    looked = ("looked at " + ", ".join(tried)) if tried else \
        "the trace meta names no qualification, calibration file or board file"
    return Qualification(False, None, None, None,
                         f"not qualified: no {QUALIFICATION_FILE} found ({looked})")
