"""Fuse token logs with a meter trace: per-window energy, per-run verdicts, per-config figures.

`analyze(run_dirs, trace_dir, options)` is the Python API under `epi analyze`:

1. read and validate the trace (host.analysis.traces) and every run (host.analysis.tokenlog_reader);
2. per run: pick the trace's clock domain, build the clock map (align.ClockMap), map the
   node placement onto meter channels, and refuse runs that do not overlap the trace or overlap
   each other;
3. windows — idle baseline, every request, its prefill and its decode — are integrated for all
   channels of the run at once (align.window_energy), then summed per node and over all the
   run's channels (scope "all");
4. the load lag per run and channel (host.analysis.lag; `--lag auto` shifts the windows by it);
5. verdicts per run and phase (scoped to the windows a fault touches), then median/CV and
   order-statistic intervals with their real coverage over the repeats of valid runs, EPI,
   Pareto, paired comparisons (host.analysis.paired), the prefill regression estimate and
   layer-group figures (host.analysis.statistics, figures, prefill_regression).

Nothing here writes files; host.analysis.output does, atomically.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from epi.core.errors import UserError
from host.analysis import components, instrument, run_notes
from host.analysis.accuracy_file import load_accuracy
from host.analysis.headline import headline_rows
from host.analysis.item_outcomes import load_item_outcomes
from host.analysis.lag import estimate_lag, lag_row, request_edges
from host.analysis.layer_groups import layer_group_figures
from host.analysis.model import NS, Analysis, Options, RunInfo
from host.analysis.multi_trace import join_traces, meter_clock
from host.analysis.paired import campaign_round
from host.analysis.power_source import channel_sources
from host.analysis.prefill_regression import prefill_regression
from host.analysis.results import (
    comparisons,
    config_results,
    matched_pairs,
    pareto_configs,
    phase_breakdown,
    savings_table,
)
from host.analysis.tokenlog_reader import RunLog, read_run
from host.analysis.traces import Trace, read_trace
from host.analysis.verdicts import check_overlaps, run_verdicts
from host.analysis.vocabulary import (
    ClockBasis,
    EnergyBasis,
    EnergyMethod,
    LagMode,
    Phase,
    TokenUnit,
    WindowKind,
)
from host.analysis.windows import (
    channels_of_nodes,
    clock_domain,
    config_ids,
    idle_power,
    measure_run,
    repeat_table,
)
from host.run.cpu_features import run_notes as cpu_feature_notes


# --------------------------------------------------------------------------- main entry
def analyze(run_dirs: Sequence[str | Path], trace_dir: str | Path | Sequence[str | Path],
            opts: Options | None = None, accuracy_file: str | Path | None = None) -> Analysis:
    """Read, align, measure and summarise; raises UserError (one line) on bad input.

    `trace_dir` is one trace, or several: the k-th was written by the k-th meter the runs
    synced with (`epi run --meter` order); they are joined in the first one's clock
    (host.analysis.multi_trace)."""
    opts = opts or Options()
    check_options(opts)
    traces, runs = _read_inputs(run_dirs, trace_dir, opts)
    trace, _, sync_unc_ns = join_traces(traces, runs)
    notes = list(trace.notes)
    notes += _run_notes(runs)
    measurable = _measurable_runs(runs, config_ids(runs), notes)
    infos: list[RunInfo] = []
    frames = []
    for run, cfg in measurable:
        info = _align_run(run, cfg, trace, sync_unc_ns, opts)
        frames.append(measure_run(info, trace, opts))
        infos.append(info)
    check_overlaps(infos)
    win = pd.concat(frames, ignore_index=True)
    _add_net_energy(win, infos)
    rep = repeat_table(win)
    verdicts = run_verdicts(infos, win, rep, opts)
    # campaign round of each run (runs/<config>/round<k>-attempt<j>): pairs by round index
    k_of = {i.run.run_id: campaign_round(i.run.path) for i in infos}
    for t in (rep, verdicts):
        t["campaign_round"] = pd.array([k_of.get(r) for r in t["run_id"]], dtype="Int64")
    return _figures(trace, infos, win, rep, verdicts, opts, accuracy_file, notes)


def check_options(opts: Options) -> None:
    """Refuse an option outside its vocabulary (the library's callers bypass click's choices)."""
    if EnergyBasis.parse(opts.energy_basis) is None:
        raise UserError(f"--energy-basis: {opts.energy_basis!r} is not gross or net")
    if LagMode.parse(opts.lag) is None:
        raise UserError(f"--lag: {opts.lag!r} is not none or auto")
    if EnergyMethod.parse(opts.energy_method) is None:
        raise UserError(f"--energy-method: {opts.energy_method!r} is not counter or trapezoid")


def _read_inputs(run_dirs: Sequence[str | Path], trace_dir: str | Path | Sequence[str | Path],
                 opts: Options) -> tuple[list[Trace], list[RunLog]]:
    """The traces and the runs, read and checked; two runs with one run_id are refused."""
    trace_dirs = [trace_dir] if isinstance(trace_dir, (str, Path)) else list(trace_dir)
    if not trace_dirs:
        raise UserError("give at least one --trace")
    traces = [read_trace(t, max_gap_periods=opts.max_gap_periods) for t in trace_dirs]
    if not run_dirs:
        raise UserError("give at least one RUN_DIR")
    runs = [read_run(d) for d in run_dirs]
    seen: dict[str, Path] = {}
    for r in runs:
        if r.run_id in seen:
            raise UserError(f"{r.path}: run_id {r.run_id} is also the run in {seen[r.run_id]}")
        seen[r.run_id] = r.path
    return traces, runs


def _run_notes(runs: list[RunLog]) -> list[str]:
    """The runs' own notes and their CPU-feature notes, collected (one line per kind)."""
    per_run: list[tuple[str, str]] = []
    for run in runs:
        per_run += [(run.path.name, n) for n in run.notes]
        per_run += [(run.path.name, n) for n in cpu_feature_notes(run.header)]
    return run_notes.collect(per_run)


def _measurable_runs(runs: list[RunLog], configs: list[str],
                     notes: list[str]) -> list[tuple[RunLog, str]]:
    """(run, config) of every run with a finished non-warm-up request; a note for each other
    run; refuses when none is left."""
    measurable = []
    for run, cfg in zip(runs, configs, strict=True):
        if not run.placement or not (run.requests["warmup"] == 0).any():
            # No finished non-warm-up request (zero requests, or none generated a token):
            # no J/token to compute, whatever the idle windows hold.
            notes.append(f"{run.path}: nothing to measure (no finished non-warm-up request "
                         f"with tokens; status {run.status}"
                         + (f": {run.status_problem})" if run.status_problem else ")"))
            continue
        measurable.append((run, cfg))
    if not measurable:
        raise UserError("no run has anything to measure: "
                        + "; ".join(n for n in notes if "nothing to measure" in n))
    return measurable


def _align_run(run: RunLog, cfg: str, trace: Trace, sync_unc_ns: float,
               opts: Options) -> RunInfo:
    """One run on the meter's clock: its channels, span, clock uncertainty and load lag."""
    boot = clock_domain(trace, run)
    clock = meter_clock(run, 0, boot, trace)  # meter 1's offsets (the joined clock)
    node_ch = channels_of_nodes(  # wall channels first (host/analysis/components.py)
        run, trace, components.node_channel_override(trace, opts.channels))
    span: tuple[int, int] | None = None
    unc = clock.uncertainty_ns + sync_unc_ns  # a second meter adds its own sync's
    if clock.usable:
        lo, hi = run.span_local_ns()
        m_lo, m_hi = clock.to_meter(np.array([lo, hi]))
        span = (int(m_lo), int(m_hi))
        cov = trace.coverage_ns(boot)
        if cov is None or span[1] < cov[0] or span[0] > cov[1]:
            cov_txt = "no samples" if cov is None else \
                f"{cov[0] / NS:.3f}–{cov[1] / NS:.3f} s"
            raise UserError(
                f"{run.path}: run does not overlap the trace {trace.path} (run spans "
                f"{span[0] / NS:.3f}–{span[1] / NS:.3f} s of meter monotonic time, trace "
                f"covers {cov_txt})")
        if clock.basis == ClockBasis.CLOCK_SYNC and len(clock.sync_local_ns) == 1:
            unc = (unc if np.isfinite(unc) else 0.0) + opts.single_sync_drift_ppm * 1e-6 * (
                hi - lo)
    chans = sorted({c for cs in node_ch.values() for c in cs})
    sat = sum(trace.saturated(c, boot, *span) for c in chans) if span else 0
    info = RunInfo(run, cfg, boot, clock, node_ch, span, {}, {}, sat, unc)
    if clock.usable:
        pre, dec = request_edges(run.requests, clock.to_meter)
        info.lag = {ch: estimate_lag(trace.series(ch, boot), pre, dec) for ch in chans}
        if opts.lag == LagMode.AUTO:
            # only a resolved lag (its interval excludes 0) is a correction to make
            info.lag_applied_ms = {ch: est.lag_ms for ch, est in info.lag.items()
                                   if np.isfinite(est.lag_ms) and not est.reason
                                   and est.resolved}
    return info


def _add_net_energy(win: pd.DataFrame, infos: list[RunInfo]) -> None:
    """Idle baseline and net energy, per run and scope, and the columns derived from them."""
    net = np.full(len(win), np.nan)
    net_reason = np.full(len(win), "", dtype=object)
    for info in infos:
        sel = (win["run_id"] == info.run.run_id).to_numpy()
        power, why = idle_power(win[sel])
        info.idle_power_w, info.idle_reason = power, why
        scopes = win.loc[sel, "scope"]
        p_idle = scopes.map(power).to_numpy(np.float64, na_value=np.nan)
        net[sel] = win.loc[sel, "energy_j"].to_numpy() - p_idle * win.loc[sel, "duration_s"]
        net_reason[sel] = scopes.map({k: f"net: {v}" if v else "" for k, v in why.items()}
                                     ).fillna("").to_numpy(dtype=object)
    win["energy_net_j"] = np.where(win["kind"] == WindowKind.IDLE, np.nan, net)
    win["net_reason"] = net_reason
    win["counter_minus_trapezoid_j"] = win["energy_counter_j"] - win["energy_trapezoid_j"]
    win["power_w"] = win["energy_j"] / win["duration_s"].where(win["duration_s"] > 0)


def _figures(trace: Trace, infos: list[RunInfo], win: pd.DataFrame, rep: pd.DataFrame,
             verdicts: pd.DataFrame, opts: Options, accuracy_file: str | Path | None,
             notes: list[str]) -> Analysis:
    """Per-configuration figures over the valid repeats, and every comparison between them."""
    accs, ppl, acc_notes = load_accuracy(Path(accuracy_file) if accuracy_file else None,
                                         infos, opts)
    notes += acc_notes
    sources = channel_sources(trace)
    qual = instrument.qualification(trace)
    results = config_results(infos, rep, verdicts, accs, opts, sources,
                             instrument.channel_terms(trace, sources), qual)
    reg = prefill_regression(win, verdicts, results, level=opts.ci_level)
    _attach_regression(results, reg)
    pareto = pareto_configs(results, opts)
    pairs = matched_pairs(results, rep, verdicts, ppl, opts)
    results["perplexity"] = results["config"].map(ppl).astype(float)
    items, weights = load_item_outcomes(Path(accuracy_file) if accuracy_file else None,
                                        infos, opts)
    savings = savings_table(results, rep, verdicts, opts, items, weights)
    comps = comparisons(results, rep, verdicts, opts, pareto, pairs, items, weights)
    breakdown = phase_breakdown(infos, rep, verdicts, opts)
    diff, tshare, g_notes = layer_group_figures(infos, rep, verdicts, results, opts)
    notes += g_notes
    return Analysis(trace, infos, win, rep, verdicts, results, savings, breakdown, pareto, pairs,
                    comps, diff, tshare, opts, notes, power_sources=sources,
                    prefill_regression=reg, lag=lag_table(infos))


def lag_table(infos: list[RunInfo]) -> pd.DataFrame:
    rows = [lag_row(i.run.run_id, i.config, est, i.lag_applied_ms.get(ch, 0.0))
            for i in infos for ch, est in sorted(i.lag.items())]
    return pd.DataFrame(rows)


def _attach_regression(results: pd.DataFrame, reg: pd.DataFrame) -> None:
    """Put the regression estimate on the prefill J/prompt-token rows (scope all, gross)."""
    for col in ("prefill_regression_j_per_token", "prefill_regression_ci_lo",
                "prefill_regression_ci_hi"):
        results[col] = np.nan
    results["prefill_regression_method"] = ""
    sel = headline_rows(results, EnergyBasis.GROSS, phase=Phase.PREFILL,
                        unit=TokenUnit.PROMPT).index
    by = reg.set_index("config")
    for i in sel:
        cfg = results.at[i, "config"]
        if cfg not in by.index or not np.isfinite(by.at[cfg, "j_per_prompt_token"]):
            continue
        results.at[i, "prefill_regression_j_per_token"] = by.at[cfg, "j_per_prompt_token"]
        results.at[i, "prefill_regression_ci_lo"] = by.at[cfg, "ci_lo"]
        results.at[i, "prefill_regression_ci_hi"] = by.at[cfg, "ci_hi"]
        results.at[i, "prefill_regression_method"] = by.at[cfg, "method"]
