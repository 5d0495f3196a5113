"""Validity verdicts per run and phase, with the reasons a figure is or is not used.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from epi.core.errors import UserError
from host.analysis import statistics
from host.analysis.align import (
    FEW_SAMPLES,
    INVALID_DATA,
    OUTSIDE,
    REASON_CODES,
)
from host.analysis.model import NS, PHASES, Options, RunInfo
from host.analysis.vocabulary import SCOPE_ALL, EnergyBasis, EnergyMethod, TokenUnit, WindowKind


# --------------------------------------------------------------------------- verdicts
def which_windows(w: pd.DataFrame, limit: int = 4) -> str:
    """'request 3 (repeat 1), request 4 (repeat 1)' / 'idle window of repeat 0' for a reason."""
    out = []
    for _, r in w.head(limit).iterrows():
        rep = "?" if pd.isna(r["repeat"]) else int(r["repeat"])
        if r["kind"] == WindowKind.IDLE:
            out.append(f"idle window of repeat {rep}")
        else:
            out.append(f"request {int(r['request_id'])} (repeat {rep})")
    more = len(w) - limit
    return ", ".join(out) + (f", +{more} more" if more > 0 else "")


def lag_problem(info: RunInfo, phase: str, pw: pd.DataFrame, opts: Options) -> str:
    """A reason when the load lag moves more energy across this phase's edges than allowed.

    Only a resolved lag (its interval excludes 0) that `--lag auto` has not corrected counts:
    |L| × the steps at the phase's two edges, summed over the run's channels, against
    `max_lag_error_frac` of the phase's median window energy.
    """
    ests = [e for ch, e in sorted(info.lag.items())
            if e.resolved and not e.reason and ch not in info.lag_applied_ms]
    if not ests:
        return ""
    err = sum(e.phase_error_j(phase) for e in ests)
    med = float(np.nanmedian(pw["energy_j"].to_numpy(np.float64))) if len(pw) and \
        pw["energy_j"].notna().any() else float("nan")
    if not np.isfinite(med) or med <= 0 or err <= opts.max_lag_error_frac * med:
        return ""
    lags = ", ".join(f"ch{e.channel} {e.lag_ms:+.1f} ms [{e.ci_lo_ms:+.1f}, {e.ci_hi_ms:+.1f}]"
                     for e in ests)
    why_not = "; ".join(f"ch{ch}: --lag auto not applied ({why})"
                        for ch, why in sorted(info.lag_not_applied.items()))
    fix = (why_not + "; sample faster (epi meter run --rate) or check the meter timing"
           if why_not else "rerun with --lag auto or check the meter timing")
    return (f"load lag ({lags}) × the power steps moves ~{err:.3g} J across each {phase} "
            f"window's edges, {err / med:.1%} of its median energy (budget "
            f"{opts.max_lag_error_frac:.1%}): {fix}")


def time_cv_note(r: pd.DataFrame) -> str:
    """The same repeats' CV of wall seconds per token, for the CV reason: energy per token that
    varies as much as the time per token points at the machine's speed (a VM's host, DVFS,
    contention: the work took longer, and a CPU-time power model or a real CPU drew power for
    longer), not at the meter chain; a time CV far below the energy CV points at the meter."""
    need = {"duration_per_request_s", "n_requests", "tokens"}
    if not need <= set(r.columns):
        return ""
    s_per_token = (r["duration_per_request_s"].to_numpy(np.float64)
                   * r["n_requests"].to_numpy(np.float64) / r["tokens"].to_numpy(np.float64))
    cv_t = statistics.cv(s_per_token)
    return f" (time per token varied {cv_t:.1%})" if np.isfinite(cv_t) else ""


SPREAD_REASON_HEAD = "repeat CV "  # the repeat-spread reason: "repeat CV 4.1% of net J/token
SPREAD_REASON_MID = " above "      # above 3.0% (time per token varied 4.0%)"
REASON_SEP = "; "                  # how a phase's reasons are joined in runs.csv `reasons`


def worth_measuring_again(reasons: str) -> bool:
    """Whether a refused phase's `reasons` (runs.csv) are its repeat spread and nothing else.

    Such a refusal is a matter of when the run happened — on a machine whose speed wanders,
    whether its repeats agree — so measuring the run again can give a valid one
    (host/campaign/remeasure.py). Every other reason would refuse the next run the same way
    (too few samples, saturation, clock, lag, counter resolution, a failed run, null repeats)
    or cannot be told from one that would: a window crossing faults/gaps may be a passing bus
    glitch, a dead channel or a daemon that keeps skipping sweeps, and re-measuring the last
    two would spend the budget on runs refused the same way.
    """
    parts = [p for p in reasons.split(REASON_SEP) if p]
    return bool(parts) and all(p.startswith(SPREAD_REASON_HEAD) and SPREAD_REASON_MID in p
                               for p in parts)


def repeat_cv_problem(rep: pd.DataFrame, run_id: str, phase: str, opts: Options,
                      reasons: list[str]) -> float:
    """The repeat CV of a phase's J/token on the basis the analysis reports; appends a reason.

    The rule is "CV on every reported figure": with `energy_basis = "net"` the figures are
    net J/token (gross minus the idle floor over each window), so the gate checks the net
    repeats. Gross J/token carries the idle floor × wall time, which a busy machine that
    stretches the run inflates although the inference's energy did not change; gating gross
    while reporting net refused figures for a spread they do not have. The reason names the
    basis it measured.
    """
    unit = TokenUnit.PROMPT if phase == WindowKind.PREFILL else TokenUnit.GENERATED
    basis = opts.energy_basis
    r = rep[(rep["run_id"] == run_id) & (rep["scope"] == SCOPE_ALL) & (rep["phase"] == phase)
            & (rep["unit"] == unit) & (rep["basis"] == basis)]
    vals = r["j_per_token"].to_numpy(dtype=np.float64)
    cv_val = statistics.cv(vals)
    if len(vals) < 2:
        reasons.append("fewer than 2 repeats: CV cannot be checked")
    elif np.isfinite(cv_val) and cv_val > opts.cv_threshold:
        reasons.append(f"{SPREAD_REASON_HEAD}{cv_val:.1%} of {basis} J/token{SPREAD_REASON_MID}"
                       f"{opts.cv_threshold:.1%}" + time_cv_note(r))
    elif not np.isfinite(cv_val) and not reasons:
        reasons.append(f"repeat CV of {basis} J/token unknown (null repeats)")
    return cv_val


def run_verdicts(infos: list[RunInfo], win: pd.DataFrame, rep: pd.DataFrame,
              opts: Options) -> pd.DataFrame:
    rows = []
    for info in infos:
        run = info.run
        rid = run.run_id
        w = win[(win["run_id"] == rid) & (win["scope"] == SCOPE_ALL)]
        common: list[str] = []
        if run.status_problem:
            common.append(run.status_problem)
        if not info.clock.usable:
            common.append(f"no usable clock offset ({info.clock.note})")
        if info.saturated:
            common.append(f"meter saturated: {info.saturated} reading(s) at full scale")
        for phase in ("idle", *PHASES):
            reasons = list(common)
            pw = w[w["kind"] == phase]
            # faults and trace edges invalidate only the phases whose windows they touch
            faults = pw[pw["reason_code"] == REASON_CODES[INVALID_DATA]]
            if len(faults):
                reasons.append(f"{len(faults)} of {len(pw)} {phase} window(s) cross faults/gaps "
                               f"({which_windows(faults)}; first: {faults['reason'].iloc[0]})")
            outside = pw[pw["reason_code"] == REASON_CODES[OUTSIDE]]
            if len(outside):
                reasons.append(f"{len(outside)} of {len(pw)} {phase} window(s) reach outside "
                               f"the trace ({which_windows(outside)})")
            few = pw[pw["reason_code"] == REASON_CODES[FEW_SAMPLES]]
            if phase == WindowKind.IDLE and pw.empty:
                reasons.append("no idle window in the run")
            if len(few):
                reasons.append(f"{len(few)} of {len(pw)} {phase} window(s) have fewer than "
                               f"{opts.min_samples} samples (sample faster or make the phase "
                               "longer)")
            if opts.energy_method == EnergyMethod.COUNTER:
                if phase == WindowKind.IDLE:
                    vals = pw["energy_j"].to_numpy(np.float64)
                    what = "idle window"
                else:
                    r = rep[(rep["run_id"] == rid) & (rep["scope"] == SCOPE_ALL)
                            & (rep["phase"] == phase) & (rep["basis"] == EnergyBasis.GROSS)]
                    vals = r["energy_sum_j"].to_numpy(np.float64)
                    what = f"{phase} energy of a repeat"
                e_rep = float(np.nanmedian(vals)) if np.isfinite(vals).any() else float("nan")
                res = float(w["counter_resolution_j"].iloc[0]) if len(w) else float("nan")
                if np.isfinite(res) and np.isfinite(e_rep) and \
                        res > opts.max_resolution_frac * e_rep:
                    share = (f"{res / e_rep:.1%} of" if e_rep > 0 else
                             "more than")  # a median of 0 J: the counter saw nothing
                    reasons.append(
                        f"energy counter resolution {res:.3g} J is {share} the "
                        f"median {what} ({e_rep:.3g} J; limit {opts.max_resolution_frac:.1%}): "
                        "raise the board's meter constant")
            if phase != WindowKind.IDLE:
                lag_reason = lag_problem(info, phase, pw, opts)
                if lag_reason:
                    reasons.append(lag_reason)
            med_dur = float(pw["duration_s"].median()) if len(pw) else float("nan")
            unc = info.offset_uncertainty_ns
            if info.clock.usable and np.isfinite(med_dur) and med_dur > 0:
                if not np.isfinite(unc):
                    reasons.append("clock offset uncertainty unknown")
                elif unc / NS > opts.max_offset_frac * med_dur:
                    reasons.append(f"clock offset uncertainty {unc / 1e6:.3g} ms is more than "
                                   f"{opts.max_offset_frac:.0%} of the median {phase} "
                                   f"({med_dur:.3g} s)")
            cv_val = float("nan")
            if phase != WindowKind.IDLE:
                cv_val = repeat_cv_problem(rep, rid, phase, opts, reasons)
            src = w["power_source"].iloc[0] if len(w) and "power_source" in w else ""
            rows.append({"run_id": rid, "config": info.config, "phase": phase,
                         "power_source": src,
                         "valid": not reasons, "cv": cv_val, "n_windows": len(pw),
                         "median_duration_s": med_dur, "reasons": REASON_SEP.join(reasons)})
    return pd.DataFrame(rows)


def valid_repeats(rep: pd.DataFrame, verdicts: pd.DataFrame) -> pd.DataFrame:
    ok = verdicts[verdicts["valid"]][["run_id", "phase"]]
    return rep.merge(ok, on=["run_id", "phase"], how="inner")


def check_overlaps(infos: list[RunInfo]) -> None:
    """Two runs measured by one trace clock must not overlap in time."""
    spans = sorted(((str(i.boot_id), i.span_meter_ns, i.run.path) for i in infos
                    if i.span_meter_ns is not None), key=lambda x: (x[0], x[1]))
    prev: tuple | None = None
    for cur in spans:
        if prev is not None and prev[0] == cur[0] and cur[1][0] <= prev[1][1]:
            raise UserError(f"{cur[2]}: run overlaps run {prev[2]} in meter time (one trace "
                            "cannot attribute the same energy to both)")
        if prev is None or prev[0] != cur[0] or cur[1][1] > prev[1][1]:
            prev = cur
