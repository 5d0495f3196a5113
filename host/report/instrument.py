"""The report's instrument uncertainty and board qualification, read from the
analysis: results.csv's `instrument_u_pct` / `instrument_u_basis` per figure and results.json's
`instrument` record (host.analysis.instrument writes both).

An analysis older than these columns says so ("not recorded"), never a silent 0 and never a
claim that the board was qualified.
"""

from __future__ import annotations

import math

import pandas as pd

from epi.formats.json_types import JSON
from host.analysis.power_source import MODELLED
from host.report.data import ReportData

NOT_RECORDED = "not recorded (an analysis older than instrument uncertainty: re-run epi analyze)"


def figure_cell(row: pd.Series | None) -> str:
    """'± 1.02 %' for a figure's instrument term, 'n/a (modelled)' where it has none."""
    if row is None or "instrument_u_pct" not in row.index:
        return "not recorded"
    u = row["instrument_u_pct"]
    if isinstance(u, (int, float)) and math.isfinite(u):
        return f"± {u:.3g} %"
    basis = row.get("instrument_u_basis")
    return str(basis) if isinstance(basis, str) and basis else "n/a"


def qualification(rd: ReportData) -> dict[str, JSON] | None:
    """results.json's `instrument.qualification`, or None when the analysis has none."""
    inst = rd.doc.get("instrument")
    q = inst.get("qualification") if isinstance(inst, dict) else None
    return q if isinstance(q, dict) else None


def measured_figures(rd: ReportData) -> bool:
    """Whether any headline figure has an instrument term (a measured, metered chain)."""
    h = rd.headline()
    if "instrument_u_pct" not in h.columns:
        return False
    return bool(pd.to_numeric(h["instrument_u_pct"], errors="coerce").notna().any())


def method_text(rd: ReportData) -> str:
    """The 'instrument' entry of the "how these figures were measured" block."""
    h = rd.headline()
    if "instrument_u_pct" not in h.columns:
        return NOT_RECORDED
    inst = rd.doc.get("instrument")
    bound = inst.get("max_instrument_u_pct") if isinstance(inst, dict) else None
    cells = [f"{cfg}: {figure_cell(r)}" for cfg, r in h.iterrows()]
    basis = next((str(b) for b in h.get("instrument_u_basis", pd.Series(dtype=object))
                  if isinstance(b, str) and b), "")
    q = qualification(rd)
    qual = str(q.get("detail")) if q is not None else "board qualification " + NOT_RECORDED
    return ("the meter chain's own uncertainty (k = 1), a separate term beside each repeat "
            "interval, not inside it — " + "; ".join(cells)
            + (f"; e.g. {basis}" if basis else "")
            + (f"; bound {bound:g} % (figures above it say so)"
               if isinstance(bound, (int, float)) else "")
            + f"; board: {qual}")


def limit_lines(rd: ReportData) -> list[str]:
    """What the answer block's limits say about the instrument and the board, from data."""
    out = []
    q = qualification(rd)
    measured = measured_figures(rd)
    if rd.labels.power_source == MODELLED and not measured:
        out.append("No instrument uncertainty applies: the power is modelled, so there is no "
                   "meter chain to qualify; the intervals cover repeat-to-repeat variation "
                   "only.")
    elif "instrument_u_pct" not in rd.headline().columns:
        out.append("No instrument uncertainty is in these figures (" + NOT_RECORDED + "): the "
                   "intervals cover repeat-to-repeat variation only.")
    else:
        h = rd.headline()
        u = pd.to_numeric(h["instrument_u_pct"], errors="coerce").dropna()
        if len(u):
            out.append(f"The meter chain adds up to ± {float(u.max()):.3g} % (instrument "
                       "uncertainty, k = 1) on top of the repeat intervals: differences "
                       "smaller than that are not resolved by the instrument.")
    if measured:
        if q is None:
            out.append("Whether the board was qualified is " + NOT_RECORDED + ".")
        elif not q.get("qualified"):
            out.append("The board that made these measurements is NOT qualified (no "
                       "`epi meter qualify` result found): its accuracy against a reference "
                       f"is unverified. {q.get('detail')}.")
        elif q.get("passed") is not True:
            out.append(f"The board's qualification did not pass: {q.get('detail')}.")
    return out
