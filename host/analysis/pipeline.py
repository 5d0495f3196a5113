"""Fuse token logs with a meter trace: per-window energy, per-run verdicts, per-config figures.

`analyze(run_dirs, trace_dir, options)` is the Python API under `epi analyze`:

1. read and validate the trace (host.analysis.traces) and every run (host.analysis.tokenlog_reader);
2. per run: pick the trace's clock domain, build the clock map (align.ClockMap), map the
   node placement onto meter channels, and refuse runs that do not overlap the trace or overlap
   each other;
3. windows — idle baseline, every request, its prefill and its decode — are integrated for all
   channels of the run at once (align.window_energy), then summed per node and over all the
   run's channels (scope "all");
4. verdicts per run and phase, then median/CV/bootstrap CI over the repeats of valid runs, EPI,
   Pareto, perplexity-matched pairs and layer-group figures (host.analysis.statistics).

Nothing here writes files; epi.commands.analyze does, atomically.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from epi.core.errors import UserError
from host.analysis.accuracy_file import load_accuracy
from host.analysis.align import (
    ClockMap,
)
from host.analysis.figures import (
    config_results,
    matched_pairs,
    pareto_configs,
    phase_breakdown,
    savings_table,
)
from host.analysis.layer_groups import layer_group_figures
from host.analysis.model import NS, Analysis, Options, RunInfo
from host.analysis.tokenlog_reader import read_run
from host.analysis.traces import read_trace
from host.analysis.verdicts import check_overlaps, run_verdicts
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
def analyze(run_dirs: Sequence[str | Path], trace_dir: str | Path, opts: Options | None = None,
            accuracy_file: str | Path | None = None) -> Analysis:
    """Read, align, measure and summarise; raises UserError (one line) on bad input."""
    opts = opts or Options()
    if opts.energy_basis not in ("gross", "net"):
        raise UserError(f"--energy-basis: {opts.energy_basis!r} is not gross or net")
    if opts.energy_method not in ("counter", "trapezoid"):
        raise UserError(f"--energy-method: {opts.energy_method!r} is not counter or trapezoid")
    trace = read_trace(trace_dir, max_gap_periods=opts.max_gap_periods)
    if not run_dirs:
        raise UserError("give at least one RUN_DIR")
    runs = [read_run(d) for d in run_dirs]
    seen: dict[str, Path] = {}
    for r in runs:
        if r.run_id in seen:
            raise UserError(f"{r.path}: run_id {r.run_id} is also the run in {seen[r.run_id]}")
        seen[r.run_id] = r.path
    notes = list(trace.notes)
    configs = config_ids(runs)
    infos: list[RunInfo] = []
    frames = []
    measurable = []
    for run, cfg in zip(runs, configs, strict=True):
        notes += [f"{run.path.name}: {n}" for n in run.notes]
        notes += [f"{run.path.name}: {n}" for n in cpu_feature_notes(run.header)]
        if not run.placement or (run.idle.empty and not (run.requests["warmup"] == 0).any()):
            notes.append(f"{run.path}: nothing to measure (no idle window, no finished "
                         f"non-warm-up request; status {run.status}"
                         + (f": {run.status_problem})" if run.status_problem else ")"))
            continue
        measurable.append((run, cfg))
    if not measurable:
        raise UserError("no run has anything to measure: "
                        + "; ".join(n for n in notes if "nothing to measure" in n))
    for run, cfg in measurable:
        boot = clock_domain(trace, run)
        clock = ClockMap.from_run(run.clock_sync, run.boot_id, boot,
                                  trace_clock_simulated=trace.clock_simulated(boot))
        node_ch = channels_of_nodes(run, trace, opts.channels)
        span = None
        unc = clock.uncertainty_ns
        if clock.usable:
            lo, hi = run.span_local_ns()
            span = tuple(int(x) for x in clock.to_meter(np.array([lo, hi])))
            cov = trace.coverage_ns(boot)
            if cov is None or span[1] < cov[0] or span[0] > cov[1]:
                cov_txt = "no samples" if cov is None else \
                    f"{cov[0] / NS:.3f}–{cov[1] / NS:.3f} s"
                raise UserError(
                    f"{run.path}: run does not overlap the trace {trace.path} (run spans "
                    f"{span[0] / NS:.3f}–{span[1] / NS:.3f} s of meter monotonic time, trace "
                    f"covers {cov_txt})")
            if clock.basis == "clock_sync" and len(clock.sync_local_ns) == 1:
                unc = (unc if np.isfinite(unc) else 0.0) + opts.single_sync_drift_ppm * 1e-6 * (
                    hi - lo)
        chans = sorted({c for cs in node_ch.values() for c in cs})
        sat = sum(trace.saturated(c, boot, *span) for c in chans) if span else 0
        info = RunInfo(run, cfg, boot, clock, node_ch, span, {}, {}, sat, unc)
        frames.append(measure_run(info, trace, opts))
        infos.append(info)
    check_overlaps(infos)
    win = pd.concat(frames, ignore_index=True)
    # Idle baseline and net energy, per run and scope.
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
    win["energy_net_j"] = np.where(win["kind"] == "idle", np.nan, net)
    win["net_reason"] = net_reason
    win["counter_minus_trapezoid_j"] = win["energy_counter_j"] - win["energy_trapezoid_j"]
    win["power_w"] = win["energy_j"] / win["duration_s"].where(win["duration_s"] > 0)
    rep = repeat_table(win)
    verdicts = run_verdicts(infos, win, rep, opts)
    accs, ppl, acc_notes = load_accuracy(Path(accuracy_file) if accuracy_file else None,
                                         infos, opts)
    notes += acc_notes
    results = config_results(infos, rep, verdicts, accs, opts)
    pareto = pareto_configs(results, opts)
    pairs = matched_pairs(results, ppl, opts)
    results["perplexity"] = results["config"].map(ppl).astype(float)
    savings = savings_table(results, rep, verdicts, opts)
    breakdown = phase_breakdown(infos, rep, verdicts, opts)
    diff, tshare, g_notes = layer_group_figures(infos, rep, verdicts, results, opts)
    notes += g_notes
    return Analysis(trace, infos, win, rep, verdicts, results, savings, breakdown, pareto, pairs,
                    diff, tshare, opts, notes)
