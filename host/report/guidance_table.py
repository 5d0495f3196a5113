"""The report's "Guidance by use" table: host/analysis/guidance.py's three recommendations.

Figures per configuration: accuracy and whole-request J per generated token with their
intervals from results.csv (the report's basis), and decode seconds per generated token from
the valid decode repeats (median over repeats with its order-statistic interval). Thresholds:
the analysis options `guidance_accuracy_loss` and `guidance_j_budget` (study file
`[analysis]`), with the module's defaults.
"""

from __future__ import annotations

import numpy as np

from host.analysis.guidance import (
    ACCURACY_LOSS,
    J_BUDGET,
    ConfigFigures,
    Figure,
    Quantity,
    Recommendation,
    ToldApart,
    guidance,
)
from host.analysis.headline import headline_rows
from host.analysis.intervals import finite as _finite
from host.analysis.intervals import median_interval, number
from host.analysis.vocabulary import Phase, VerdictState
from host.report.answer_model import DECIDED
from host.report.data import ReportData
from host.report.sequential import load_decisions
from host.report.tables import Table, _tail, with_ci


def _figure(row: object, value: str, lo: str, hi: str) -> Figure | None:
    get = getattr(row, "get", None)
    if get is None or not _finite(get(value)):
        return None
    return Figure(number(get(value)), number(get(lo)), number(get(hi)))


def decode_seconds(rd: ReportData) -> dict[str, Figure]:
    """Decode seconds per generated token per configuration: the valid decode repeats'
    duration per request × requests ÷ tokens, their median and its interval."""
    r = rd.repeats
    need = {"config", "scope", "phase", "unit", "basis", "tokens", "n_requests",
            "duration_per_request_s"}
    if r.empty or not need <= set(r.columns):
        return {}
    rows = headline_rows(r, rd.basis, phase=Phase.DECODE)
    if "reason" in rows.columns:
        rows = rows[rows["reason"].isna() | (rows["reason"].astype(str) == "")]
    out = {}
    for cfg, g in rows.groupby("config"):
        s = (g["duration_per_request_s"].astype(float) * g["n_requests"].astype(float)
             / g["tokens"].astype(float)).to_numpy()
        s = s[np.isfinite(s)]
        if len(s):
            ci = median_interval(s)
            out[str(cfg)] = Figure(float(np.median(s)), ci.lo, ci.hi)
    return out


def config_figures(rd: ReportData) -> dict[str, ConfigFigures]:
    h = rd.headline()
    speed = decode_seconds(rd)
    out = {}
    for cfg in h.index:
        row = h.loc[cfg]
        out[str(cfg)] = ConfigFigures(
            _figure(row, "accuracy", "accuracy_ci_lo", "accuracy_ci_hi"),
            _figure(row, "j_per_token_median", "j_per_token_ci_lo", "j_per_token_ci_hi"),
            speed.get(str(cfg)))
    return out


def thresholds(rd: ReportData) -> tuple[float, float]:
    opts = rd.doc.get("options") or {}
    loss = opts.get("guidance_accuracy_loss", ACCURACY_LOSS)
    budget = opts.get("guidance_j_budget", J_BUDGET)
    return (float(loss) if _finite(loss) else ACCURACY_LOSS,
            float(budget) if _finite(budget) else J_BUDGET)


def _figure_text(rec: Recommendation) -> str:
    f = rec.figure
    if f is None:
        return "null"
    fmt = ".3f" if rec.use == "quality-sensitive" else ".4g"
    return with_ci(f.value, f.lo, f.hi, fmt)


def paired_verdicts(rd: ReportData) -> ToldApart:
    """The report's own paired verdicts: the campaign's sequential test for energy where it
    decided adaptively, else the analysis' paired comparisons (energy by round, accuracy by
    item); None where the study compared the two on neither."""
    decisions = load_decisions(rd.analysis_dir)
    rows = [r for r in (rd.doc.get("comparisons") or []) if isinstance(r, dict)]

    def told_apart(a: str, b: str, quantity: Quantity) -> bool | None:
        if quantity == "time":
            return None
        if quantity == "energy" and decisions is not None:
            seq = decisions.verdict(a, b)
            if seq is not None:
                return seq[0] == VerdictState.DECIDED
        key = "energy_distinguishable" if quantity == "energy" else "accuracy_distinguishable"
        for r in rows:
            if {r.get("config_a"), r.get("config_b")} == {a, b} and \
                    isinstance(r.get(key), bool):
                return bool(r[key])
        return None

    return told_apart


def recommendations(rd: ReportData) -> list[Recommendation]:
    loss, budget = thresholds(rd)
    return guidance(config_figures(rd), accuracy_loss=loss, j_budget=budget,
                    told_apart=paired_verdicts(rd))


# what a row's status is about: its pick against its rivals on this quantity only
QUANTITY_WORDS = {"latency-sensitive": "decode time", "energy-sensitive": "energy",
                  "quality-sensitive": "accuracy"}


def guidance_table(rd: ReportData) -> Table:
    rows, classes = [], []
    unit = {"latency-sensitive": "s per generated token (decode)",
            "energy-sensitive": "J per generated token", "quality-sensitive": "accuracy"}
    for rec in recommendations(rd):
        told = ("—" if rec.status == DECIDED or rec.config is None else
                ", ".join(rec.rivals) if rec.rivals else "no interval")
        rows.append([rec.use, rec.criterion, rec.config or "none qualifies",
                     f"{_figure_text(rec)} {unit[rec.use]}",
                     f"{rec.status} on {QUANTITY_WORDS[rec.use]}", told])
        classes.append("pareto" if rec.status == DECIDED else "")
    loss, budget = thresholds(rd)
    caption = (f"The configuration to pick by use. Thresholds: accuracy loss {loss:.3g} "
               f"(absolute), J/token budget {budget:.3g}× the lowest (study file [analysis] "
               "guidance_accuracy_loss, guidance_j_budget). Eligibility uses point estimates; "
               "a pick is decided when every other eligible configuration is told apart from it "
               "(by the study's paired verdict where it has one, else by intervals that do not "
               "overlap), else the last column lists those it cannot yet be told from."
               + _tail(rd))
    return Table("guidance", "Guidance by use", caption,
                 ["use", "rule", "configuration", "figure", "status",
                  "cannot yet be told from"], rows, classes)
