"""Fuse token logs with a meter trace: per-window energy, per-run verdicts, per-config figures.

`analyze(run_dirs, trace_dir, options)` is the Python API under `epi analyze`:

1. read and validate the trace (host.traces) and every run (host.tokenlog_reader);
2. per run: pick the trace's clock domain, build the clock map (host.align.ClockMap), map the
   node placement onto meter channels, and refuse runs that do not overlap the trace or overlap
   each other;
3. windows — idle baseline, every request, its prefill and its decode — are integrated for all
   channels of the run at once (host.align.window_energy), then summed per node and over all the
   run's channels (scope "all");
4. verdicts per run and phase, then median/CV/bootstrap CI over the repeats of valid runs, EPI,
   Pareto, perplexity-matched pairs and layer-group figures (host.epi).

Nothing here writes files; host.analyze_cli does, atomically.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from epi.errors import UserError
from host import epi as epimod
from host.align import FEW_SAMPLES, INVALID_DATA, OUTSIDE, REASON_CODES, ClockMap, window_energy
from host.tokenlog_reader import RunLog, read_run
from host.traces import Trace, read_trace

NS = 1_000_000_000
# (phase, token unit) pairs reported per configuration.
FIGURES: tuple[tuple[str, str], ...] = (
    ("prefill", "prompt"),
    ("decode", "generated"),
    ("request", "generated"),
    ("request", "total"),
)
PHASES = ("prefill", "decode", "request")
CODE_NAMES = np.array([REASON_CODES[k] for k in sorted(REASON_CODES)], dtype=object)
UNIT_TEXT = {
    "prompt": "J per prompt token",
    "generated": "J per generated token",
    "total": "J per total (prompt + generated) token",
}


@dataclass
class Options:
    """Analysis settings (CLI flags map one to one)."""

    edge: str = "step"
    min_samples: int = 2
    cv_threshold: float = 0.03
    max_offset_frac: float = 0.01
    single_sync_drift_ppm: float = 100.0
    n_boot: int = 2000
    ci_level: float = 0.95
    seed: int = 0
    channels: dict[str, list[int]] | None = None
    energy_basis: str = "gross"
    energy_method: str = "counter"
    max_resolution_frac: float = 0.005
    max_gap_periods: float = 3.0
    accuracy_metric: str = "composite"
    accuracy_values: dict[str, float] = field(default_factory=dict)
    ppl_tolerance: float = 0.01
    baseline: str | None = None
    time_share: bool = False
    manifest_dir: Path | None = None


@dataclass
class RunInfo:
    """Per-run facts the tables need."""

    run: RunLog
    config: str
    boot_id: str | None
    clock: ClockMap
    node_channels: dict[str, list[int]]
    span_meter_ns: tuple[int, int] | None
    idle_power_w: dict[str, float]
    idle_reason: dict[str, str]
    saturated: int
    offset_uncertainty_ns: float


@dataclass
class Analysis:
    """Everything `epi analyze` reports."""

    trace: Trace
    runs: list[RunInfo]
    windows: pd.DataFrame
    repeats: pd.DataFrame
    verdicts: pd.DataFrame
    results: pd.DataFrame
    savings: pd.DataFrame
    breakdown: pd.DataFrame
    pareto: list[str]
    pairs: list[dict]
    differential: list[dict]
    time_share: list[dict]
    options: Options
    notes: list[str]


# --------------------------------------------------------------------------- runs ↔ trace
def _domain(trace: Trace, run: RunLog) -> str | None:
    """The trace clock domain (boot id) this run was measured in."""
    boots = trace.boot_ids
    if len(boots) == 1:
        return boots[0]
    if not run.clock_sync and run.boot_id in boots:
        return run.boot_id
    lo, hi = run.span_real_ns()
    hits = []
    for b in boots:
        cov = trace.real_coverage_ns(b)
        if cov and cov[0] <= hi and lo <= cov[1]:
            hits.append(b)
    if len(hits) != 1:
        raise UserError(
            f"{run.path}: cannot tell which of the trace's {len(boots)} boots "
            f"({', '.join(str(b) for b in boots)}) measured this run "
            f"({'none' if not hits else 'several'} overlap it in realtime)")
    return hits[0]


def _node_channels(run: RunLog, trace: Trace, override: Mapping[str, list[int]] | None
                   ) -> dict[str, list[int]]:
    """node → meter channels for the run's placement (override from --channels first)."""
    by_node: dict[str, list[int]] = {}
    for ch, info in sorted(trace.channels.items()):
        if info.node is not None:
            by_node.setdefault(info.node, []).append(ch)
    if override:
        for node, chans in override.items():
            bad = [c for c in chans if c not in trace.channels]
            if bad:
                raise UserError(f"--channels: channel {bad[0]} of node {node!r} is not in "
                                f"trace directory {trace.path} (channels "
                                f"{sorted(trace.channels)})")
        by_node = {**by_node, **{k: list(v) for k, v in override.items()}}
    out: dict[str, list[int]] = {}
    for p in run.placement:
        if p.node not in by_node:
            known = ", ".join(sorted(by_node)) or "none"
            raise UserError(
                f"{run.path / 'run.json'}: placement node {p.node!r} has no meter channel in "
                f"{trace.path} (trace nodes: {known}); map it with --channels {p.node}=CHANNEL")
        out[p.node] = by_node[p.node]
    used = [c for chans in out.values() for c in chans]
    if len(used) != len(set(used)):
        raise UserError(f"{run.path / 'run.json'}: two placement nodes share one meter channel "
                        f"({out}); fix --channels")
    return out


def _config_ids(runs: Sequence[RunLog]) -> list[str]:
    """Configuration labels; one label with several model files gets a sha256 suffix."""
    base = [r.config_id for r in runs]
    shas: dict[str, set[str]] = {}
    for label, r in zip(base, runs, strict=True):
        shas.setdefault(label, set()).add(str(r.model.get("sha256")))
    return [f"{label}#{str(r.model.get('sha256'))[:8]}" if len(shas[label]) > 1 else label
            for label, r in zip(base, runs, strict=True)]


def _windows_local(run: RunLog) -> pd.DataFrame:
    """All analysed windows of a run in its local clock (warm-ups are not analysed)."""
    rq = run.requests[run.requests["warmup"] == 0]
    parts = [pd.DataFrame({
        "kind": "idle", "request_id": pd.NA, "repeat": pd.NA, "prompt_id": None,
        "t0_local_ns": run.idle["t_start_mono_ns"].to_numpy(np.int64),
        "t1_local_ns": run.idle["t_end_mono_ns"].to_numpy(np.int64),
        "n_prompt_tokens": pd.NA, "n_generated_tokens": pd.NA,
    })]
    spans = {"prefill": ("t_start_mono_ns", "t_first_token_mono_ns"),
             "decode": ("t_first_token_mono_ns", "t_end_mono_ns"),
             "request": ("t_start_mono_ns", "t_end_mono_ns")}
    for kind, (a, b) in spans.items():
        parts.append(pd.DataFrame({
            "kind": kind, "request_id": rq["request_id"].to_numpy(),
            "repeat": rq["repeat"].to_numpy(), "prompt_id": rq["prompt_id"].to_numpy(),
            "t0_local_ns": rq[a].to_numpy(np.int64), "t1_local_ns": rq[b].to_numpy(np.int64),
            "n_prompt_tokens": rq["n_prompt_tokens"].to_numpy(),
            "n_generated_tokens": rq["n_generated_tokens"].to_numpy(),
        }))
    parts = [p for p in parts if len(p)]
    if not parts:
        raise UserError(f"{run.path}: no idle window and no finished non-warm-up request "
                        "(nothing to measure)")
    w = pd.concat(parts, ignore_index=True)
    for c in ("request_id", "repeat", "n_prompt_tokens", "n_generated_tokens"):
        w[c] = w[c].astype("Int64")
    return w


def _combine(per_channel: dict[int, Any], chans: list[int], n: int, method: str,
             resolution: dict[int, float]) -> dict[str, np.ndarray]:
    """Sum the channels of one scope; any null channel makes the sum null (reason kept).

    The primary `energy_j` is the counter figure where the counter covers the window (method
    "counter") and the trapezoid figure otherwise; `energy_method` says which.
    """
    trap = np.zeros(n)
    cnt = np.zeros(n)
    prim = np.zeros(n)
    n_counter = np.zeros(n, dtype=np.int64)
    ns = np.full(n, np.iinfo(np.int64).max, dtype=np.int64)
    reason = np.full(n, "", dtype=object)
    creason = np.full(n, "", dtype=object)
    code = np.zeros(n, dtype=np.int8)
    res = 0.0
    for ch in chans:
        we = per_channel[ch]
        trap += we.energy_j
        cnt += we.energy_counter_j
        use_counter = np.isfinite(we.energy_counter_j) if method == "counter" else np.zeros(
            n, dtype=bool)
        prim += np.where(use_counter, we.energy_counter_j, we.energy_j)
        n_counter += use_counter
        ns = np.minimum(ns, we.n_samples)
        res += resolution.get(ch, float("nan"))
        prefix = f"ch{ch}: " if len(chans) > 1 else ""
        if (we.reason != "").any():
            new = (reason == "") & (we.reason != "")
            reason[new] = prefix + we.reason[new]
            code[new] = we.code[new]
        if (we.counter_reason != "").any():
            cnew = (creason == "") & (we.counter_reason != "")
            creason[cnew] = prefix + we.counter_reason[cnew]
    used = np.where(n_counter == len(chans), "counter",
                    np.where(n_counter == 0, "trapezoid", "mixed")).astype(object)
    used[~np.isfinite(prim)] = ""
    return {"energy_j": prim, "energy_method": used, "energy_trapezoid_j": trap,
            "energy_counter_j": cnt, "counter_resolution_j": np.full(n, res),
            "n_samples": ns, "reason": reason, "counter_reason": creason, "code": code}


def _measure_run(info: RunInfo, trace: Trace, opts: Options) -> pd.DataFrame:
    run = info.run
    w = _windows_local(run)
    w.insert(0, "run_id", run.run_id)
    w.insert(1, "config", info.config)
    w["duration_s"] = (w["t1_local_ns"] - w["t0_local_ns"]) / NS
    n = len(w)
    if not info.clock.usable:
        w["t0_meter_ns"] = pd.array([pd.NA] * n, dtype="Int64")
        w["t1_meter_ns"] = pd.array([pd.NA] * n, dtype="Int64")
        frames = []
        for scope in ["all", *info.node_channels]:
            f = w.copy()
            f["scope"] = scope
            f["energy_j"] = np.nan
            f["energy_method"] = ""
            f["energy_trapezoid_j"] = np.nan
            f["energy_counter_j"] = np.nan
            f["counter_resolution_j"] = np.nan
            f["n_samples"] = pd.array([pd.NA] * n, dtype="Int64")
            f["reason"] = f"no clock offset: {info.clock.note}"
            f["counter_reason"] = f["reason"]
            f["reason_code"] = "no_clock_offset"
            frames.append(f)
        return pd.concat(frames, ignore_index=True)
    t0 = info.clock.to_meter(w["t0_local_ns"].to_numpy(np.int64))
    t1 = info.clock.to_meter(w["t1_local_ns"].to_numpy(np.int64))
    w["t0_meter_ns"] = t0
    w["t1_meter_ns"] = t1
    w["duration_s"] = (t1 - t0) / NS  # one clock per figure: the meter's
    chans = sorted({c for cs in info.node_channels.values() for c in cs})
    per_channel = {ch: window_energy(trace.series(ch, info.boot_id), t0, t1, edge=opts.edge,
                                     min_samples=opts.min_samples) for ch in chans}
    resolution = {ch: trace.channels[ch].counter_resolution_j for ch in chans}
    frames = []
    for scope, scope_chans in [("all", chans), *info.node_channels.items()]:
        comb = _combine(per_channel, scope_chans, n, opts.energy_method, resolution)
        f = w.copy()
        f["scope"] = scope
        for col in ("energy_j", "energy_method", "energy_trapezoid_j", "energy_counter_j",
                    "counter_resolution_j"):
            f[col] = comb[col]
        f["n_samples"] = comb["n_samples"]
        f["reason"] = comb["reason"]
        f["counter_reason"] = comb["counter_reason"]
        f["reason_code"] = CODE_NAMES[comb["code"]]
        frames.append(_request_from_phases(f))
    return pd.concat(frames, ignore_index=True)


def _request_from_phases(f: pd.DataFrame) -> pd.DataFrame:
    """Request energy = prefill + decode where both are measured, else the direct integral.

    The first token is a load change like the window edges; splitting there keeps the edge
    model's exactness and makes the phases add up to the request. `request_method` says which.
    """
    f = f.copy()
    f["request_method"] = np.where(f["kind"] == "request", "direct", "")
    req = f["kind"] == "request"
    if not req.any():
        return f
    ph = f[f["kind"].isin(["prefill", "decode"])]
    ids = f.loc[req, "request_id"]
    idx = f.index[req]

    def part(col: str, kind: str) -> np.ndarray:
        sel = ph[ph["kind"] == kind].set_index("request_id")[col]
        return ids.map(sel).to_numpy(dtype=object if col == "energy_method" else np.float64,
                                     na_value=None if col == "energy_method" else np.nan)

    both = np.isfinite(part("energy_j", "prefill")) & np.isfinite(part("energy_j", "decode"))
    for col in ("energy_j", "energy_trapezoid_j", "energy_counter_j"):
        total = part(col, "prefill") + part(col, "decode")
        ok = both & np.isfinite(total)
        f.loc[idx[ok], col] = total[ok]
        f.loc[idx[both & ~ok], col] = np.nan
    m_pre, m_dec = part("energy_method", "prefill"), part("energy_method", "decode")
    f.loc[idx[both], "energy_method"] = np.where(m_pre == m_dec, m_pre, "mixed")[both]
    f.loc[idx[both], "request_method"] = "prefill+decode"
    return f


def _idle_power(win: pd.DataFrame) -> tuple[dict[str, float], dict[str, str]]:
    power, why = {}, {}
    for scope, g in win[win["kind"] == "idle"].groupby("scope", sort=False):
        ok = g[g["energy_j"].notna()]
        if ok.empty:
            power[scope] = float("nan")
            why[scope] = ("no idle window in the run" if g.empty else
                          f"no valid idle window: {g['reason'].iloc[0]}")
        else:
            power[scope] = float(ok["energy_j"].sum() / ok["duration_s"].sum())
            why[scope] = ""
    for scope in win["scope"].unique():
        if scope not in power:
            power[scope], why[scope] = float("nan"), "no idle window in the run"
    return power, why


# --------------------------------------------------------------------------- per repeat
def _tokens(w: pd.DataFrame, unit: str) -> np.ndarray:
    npr = w["n_prompt_tokens"].to_numpy(dtype=np.float64, na_value=np.nan)
    ngen = w["n_generated_tokens"].to_numpy(dtype=np.float64, na_value=np.nan)
    kind = w["kind"].to_numpy()
    if unit == "prompt":
        return npr
    if unit == "total":
        return npr + ngen
    # generated: a decode window holds n_generated − 1 tokens (token 0 ends prefill)
    return np.where(kind == "decode", ngen - 1, ngen)


def _repeat_table(win: pd.DataFrame) -> pd.DataFrame:
    """One row per (run, scope, phase, unit, basis, repeat): ratio of sums over its requests."""
    req = win[win["kind"].isin(PHASES)].copy()
    rows = []
    for phase, unit in FIGURES:
        f = req[req["kind"] == phase].copy()
        f["tokens"] = _tokens(f, unit)
        f["bad_tokens"] = ~(f["tokens"] > 0)
        keys = ["run_id", "config", "scope", "repeat"]
        for basis, col in (("gross", "energy_j"), ("net", "energy_net_j")):
            f["is_null"] = f[col].isna()
            agg = f.groupby(keys, sort=True).agg(
                energy_sum=(col, "sum"), n_null=("is_null", "sum"), tokens=("tokens", "sum"),
                n_requests=(col, "size"), duration_s=("duration_s", "sum"),
                bad_tokens=("bad_tokens", "any"))
            # the first reason given in each group (vectorised: no loop over windows)
            for rcol, name in (("reason", "first_reason"), ("net_reason", "net_reason")):
                agg[name] = f[f[rcol] != ""].groupby(keys, sort=True)[rcol].first().reindex(
                    agg.index).fillna("")
            agg = agg.reset_index()
            null = (agg["n_null"] > 0) | agg["bad_tokens"]
            agg["j_per_token"] = np.where(null, np.nan, agg["energy_sum"] / agg["tokens"])
            agg["energy_per_request_j"] = np.where(null, np.nan,
                                                   agg["energy_sum"] / agg["n_requests"])
            agg["duration_per_request_s"] = agg["duration_s"] / agg["n_requests"]
            why = np.where(agg["bad_tokens"], f"no {unit} tokens in a {phase} window", "")
            reason = agg["first_reason"] if basis == "gross" else agg["net_reason"].where(
                agg["net_reason"] != "", agg["first_reason"])
            why = np.where((why == "") & (agg["n_null"] > 0),
                           agg["n_null"].astype(str) + " of " + agg["n_requests"].astype(str)
                           + f" {phase} windows null: " + reason.astype(str), why)
            agg["reason"] = why
            agg["phase"], agg["unit"], agg["basis"] = phase, unit, basis
            agg["energy_sum_j"] = np.where(agg["n_null"] > 0, np.nan, agg["energy_sum"])
            rows.append(agg.drop(columns=["energy_sum", "n_null", "first_reason",
                                          "net_reason", "bad_tokens", "duration_s"]))
    out = pd.concat(rows, ignore_index=True)
    out["repeat"] = out["repeat"].astype("Int64")
    return out


# --------------------------------------------------------------------------- verdicts
def _verdicts(infos: list[RunInfo], win: pd.DataFrame, rep: pd.DataFrame,
              opts: Options) -> pd.DataFrame:
    rows = []
    for info in infos:
        run = info.run
        rid = run.run_id
        w = win[(win["run_id"] == rid) & (win["scope"] == "all")]
        common: list[str] = []
        if run.status_problem:
            common.append(run.status_problem)
        if not info.clock.usable:
            common.append(f"no usable clock offset ({info.clock.note})")
        faults = w[w["reason_code"] == REASON_CODES[INVALID_DATA]]
        if len(faults):
            common.append(f"{len(faults)} measured window(s) cross faults/gaps "
                          f"(first: {faults['reason'].iloc[0]})")
        outside = w[w["reason_code"] == REASON_CODES[OUTSIDE]]
        if len(outside):
            common.append(f"{len(outside)} window(s) reach outside the trace")
        if info.saturated:
            common.append(f"meter saturated: {info.saturated} reading(s) at full scale")
        for phase in ("idle", *PHASES):
            reasons = list(common)
            pw = w[w["kind"] == phase]
            few = pw[pw["reason_code"] == REASON_CODES[FEW_SAMPLES]]
            if phase == "idle" and pw.empty:
                reasons.append("no idle window in the run")
            if len(few):
                reasons.append(f"{len(few)} of {len(pw)} {phase} window(s) have fewer than "
                               f"{opts.min_samples} samples (sample faster or make the phase "
                               "longer)")
            if opts.energy_method == "counter":
                if phase == "idle":
                    vals = pw["energy_j"].to_numpy(np.float64)
                    what = "idle window"
                else:
                    r = rep[(rep["run_id"] == rid) & (rep["scope"] == "all")
                            & (rep["phase"] == phase) & (rep["basis"] == "gross")]
                    vals = r["energy_sum_j"].to_numpy(np.float64)
                    what = f"{phase} energy of a repeat"
                e_rep = float(np.nanmedian(vals)) if np.isfinite(vals).any() else float("nan")
                res = float(w["counter_resolution_j"].iloc[0]) if len(w) else float("nan")
                if np.isfinite(res) and np.isfinite(e_rep) and \
                        res > opts.max_resolution_frac * e_rep:
                    reasons.append(
                        f"energy counter resolution {res:.3g} J is {res / e_rep:.1%} of the "
                        f"median {what} ({e_rep:.3g} J; limit {opts.max_resolution_frac:.1%}): "
                        "raise the board's meter constant")
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
            if phase != "idle":
                unit = "prompt" if phase == "prefill" else "generated"
                r = rep[(rep["run_id"] == rid) & (rep["scope"] == "all") & (rep["phase"] == phase)
                        & (rep["unit"] == unit) & (rep["basis"] == "gross")]
                vals = r["j_per_token"].to_numpy(dtype=np.float64)
                cv_val = epimod.cv(vals)
                if len(vals) < 2:
                    reasons.append("fewer than 2 repeats: CV cannot be checked")
                elif np.isfinite(cv_val) and cv_val > opts.cv_threshold:
                    reasons.append(f"repeat CV {cv_val:.1%} above {opts.cv_threshold:.1%}")
                elif not np.isfinite(cv_val) and not reasons:
                    reasons.append("repeat CV unknown (null repeats)")
            rows.append({"run_id": rid, "config": info.config, "phase": phase,
                         "valid": not reasons, "cv": cv_val, "n_windows": len(pw),
                         "median_duration_s": med_dur, "reasons": "; ".join(reasons)})
    return pd.DataFrame(rows)


# --------------------------------------------------------------------------- accuracy
def load_accuracy(path: Path | None, runs: Sequence[RunInfo], opts: Options
                  ) -> tuple[dict[str, epimod.Accuracy], dict[str, float], list[str]]:
    """Accuracy and perplexity per configuration (file joined on model sha256, CLI overrides)."""
    accs: dict[str, epimod.Accuracy] = {}
    ppl: dict[str, float] = {}
    notes: list[str] = []
    if path is not None:
        from host.accuracy.results import accuracy_by_sha256, read_results

        by_sha = accuracy_by_sha256(read_results(path))
        for info in runs:
            entry = by_sha.get(str(info.run.model.get("sha256")))
            if entry is None or info.config in accs:
                continue
            p = entry.get("perplexity") or {}
            if isinstance(p.get("ppl"), (int, float)):
                ppl[info.config] = float(p["ppl"])
            metric = opts.accuracy_metric
            if metric == "composite":
                block = entry.get("composite") or {}
                val, ci = block.get("accuracy"), block.get("ci95")
                weights = block.get("weights") or {}
                wtxt = ", ".join(f"{k} {v:.2f}" for k, v in weights.items())
                basis = f"composite {block.get('metric', '?')} ({wtxt}) from {path}"
                if val is None:
                    notes.append(f"{info.config}: composite accuracy is null in {path}"
                                 f" ({block.get('reason', 'no reason given')})")
                    continue
            else:
                block = (entry.get("benchmarks") or {}).get(metric)
                if block is None:
                    notes.append(f"{info.config}: benchmark {metric!r} not in {path}")
                    continue
                # length-normalised like the composite's default, when the file has it
                kind = "accuracy_norm" if block.get("accuracy_norm") is not None else "accuracy"
                val = block.get(kind)
                ci = block.get("ci95_norm" if kind == "accuracy_norm" else "ci95")
                basis = f"{metric} {kind} (n={block.get('n')}) from {path}"
            lo, hi = (ci if isinstance(ci, list) and len(ci) == 2 else (None, None))
            accs[info.config] = epimod.Accuracy(
                float(val), float(lo) if lo is not None else float("nan"),
                float(hi) if hi is not None else float("nan"), basis)
    configs = {i.config for i in runs}
    for cfg, val in opts.accuracy_values.items():
        if cfg not in configs:
            raise UserError(f"--accuracy-value: no analysed run has configuration {cfg!r} "
                            f"(configurations: {', '.join(sorted(configs))})")
        if not 0.0 < val <= 1.0:
            raise UserError(f"--accuracy-value: {cfg}={val} is not in (0, 1]")
        accs[cfg] = epimod.Accuracy(val, float("nan"), float("nan"),
                                    "given on the command line (--accuracy-value)")
    return accs, ppl, notes


# --------------------------------------------------------------------------- layer groups
def _manifest(info: RunInfo, opts: Options) -> dict | None:
    m = info.run.model
    map_id = m.get("map_id")
    stem = Path(str(m["path"])).stem if m.get("path") else None
    names = [f"{x}.manifest.json" for x in dict.fromkeys([map_id, stem]) if x]
    cands = []
    if opts.manifest_dir is not None:
        cands += [Path(opts.manifest_dir) / n for n in names]
    if m.get("path"):
        cands += [Path(str(m["path"])).parent / n for n in names]
    for c in cands:
        if c.is_file():
            try:
                data = json.loads(c.read_text())
            except (OSError, ValueError):
                continue
            if data.get("format") == "epi-quant-manifest" and data.get("layer_groups"):
                return data
    return None


def _group_signature(g: dict) -> str:
    eff = g.get("effective_types") or {}
    return f"{g.get('map_type')} [{', '.join(f'{k}×{v}' for k, v in sorted(eff.items()))}]"


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
    configs = _config_ids(runs)
    infos: list[RunInfo] = []
    frames = []
    measurable = []
    for run, cfg in zip(runs, configs, strict=True):
        notes += [f"{run.path.name}: {n}" for n in run.notes]
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
        boot = _domain(trace, run)
        clock = ClockMap.from_run(run.clock_sync, run.boot_id, boot,
                                  trace_clock_simulated=trace.clock_simulated(boot))
        node_ch = _node_channels(run, trace, opts.channels)
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
        frames.append(_measure_run(info, trace, opts))
        infos.append(info)
    _check_overlaps(infos)
    win = pd.concat(frames, ignore_index=True)
    # Idle baseline and net energy, per run and scope.
    net = np.full(len(win), np.nan)
    net_reason = np.full(len(win), "", dtype=object)
    for info in infos:
        sel = (win["run_id"] == info.run.run_id).to_numpy()
        power, why = _idle_power(win[sel])
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
    rep = _repeat_table(win)
    verdicts = _verdicts(infos, win, rep, opts)
    accs, ppl, acc_notes = load_accuracy(Path(accuracy_file) if accuracy_file else None,
                                         infos, opts)
    notes += acc_notes
    results = _results(infos, rep, verdicts, accs, opts)
    pareto = _pareto(results, opts)
    pairs = _pairs(results, ppl, opts)
    results["perplexity"] = results["config"].map(ppl).astype(float)
    savings = _savings(results, rep, verdicts, opts)
    breakdown = _breakdown(infos, rep, verdicts, opts)
    diff, tshare, g_notes = _layer_groups(infos, rep, verdicts, results, opts)
    notes += g_notes
    return Analysis(trace, infos, win, rep, verdicts, results, savings, breakdown, pareto, pairs,
                    diff, tshare, opts, notes)


def _check_overlaps(infos: list[RunInfo]) -> None:
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


def _valid_repeats(rep: pd.DataFrame, verdicts: pd.DataFrame) -> pd.DataFrame:
    ok = verdicts[verdicts["valid"]][["run_id", "phase"]]
    return rep.merge(ok, on=["run_id", "phase"], how="inner")


def _results(infos: list[RunInfo], rep: pd.DataFrame, verdicts: pd.DataFrame,
             accs: dict[str, epimod.Accuracy], opts: Options) -> pd.DataFrame:
    valid = _valid_repeats(rep, verdicts)
    layers = {(i.config, p.node): p.layers for i in infos for p in i.run.placement}
    rows = []
    keys = rep[["config", "scope", "phase", "unit", "basis"]].drop_duplicates()
    for cfg, scope, phase, unit, basis in keys.itertuples(index=False):
        v = valid[(valid["config"] == cfg) & (valid["scope"] == scope) & (valid["phase"] == phase)
                  & (valid["unit"] == unit) & (valid["basis"] == basis)]
        cfg_runs = verdicts[(verdicts["config"] == cfg) & (verdicts["phase"] == phase)]
        st = epimod.repeat_stats(v["j_per_token"].to_numpy(np.float64), n_boot=opts.n_boot,
                                 level=opts.ci_level, seed=opts.seed)
        reason = st.reason
        if v.empty:
            bad = cfg_runs[~cfg_runs["valid"]]
            reason = "no valid runs" + (f": {bad['reasons'].iloc[0]}" if len(bad) else "")
        e_req = v["energy_per_request_j"].to_numpy(np.float64)
        d_req = v["duration_per_request_s"].to_numpy(np.float64)
        row = {
            "config": cfg, "scope": scope,
            "layers": _layers_text(layers.get((cfg, scope))) if scope != "all" else "",
            "phase": phase, "unit": unit, "basis": basis,
            "figure": f"{basis} {UNIT_TEXT[unit]}" + (" (whole request)" if phase == "request"
                                                      else f" ({phase})"),
            "n_runs": int(cfg_runs["run_id"].nunique()),
            "n_runs_valid": int(v["run_id"].nunique()),
            "n_repeats": st.n,
            "j_per_token_median": st.median, "j_per_token_cv": st.cv,
            "j_per_token_ci_lo": st.ci_lo, "j_per_token_ci_hi": st.ci_hi,
            "energy_per_request_j_median": float(np.median(e_req)) if len(e_req) and not
            np.isnan(e_req).any() else float("nan"),
            "duration_per_request_s_median": float(np.median(d_req)) if len(d_req) else
            float("nan"),
            "reason": reason,
            "accuracy": float("nan"), "accuracy_ci_lo": float("nan"),
            "accuracy_ci_hi": float("nan"), "accuracy_basis": "",
            "epi": float("nan"), "epi_ci_lo": float("nan"), "epi_ci_hi": float("nan"),
            "epi_energy_basis": "", "epi_reason": "",
        }
        if scope == "all" and phase == "request" and unit == "generated":
            acc = accs.get(cfg)
            e, lo, hi, why = epimod.epi(st.median, st.ci_lo, st.ci_hi, acc)
            row.update(epi=e, epi_ci_lo=lo, epi_ci_hi=hi, epi_reason=why,
                       epi_energy_basis=f"{basis} J per generated token (whole request)")
            if acc is not None:
                row.update(accuracy=acc.value, accuracy_ci_lo=acc.ci_lo,
                           accuracy_ci_hi=acc.ci_hi, accuracy_basis=acc.basis)
        rows.append(row)
    res = pd.DataFrame(rows)
    res["ci_level"] = opts.ci_level
    res["edge_model"] = opts.edge
    res["energy_method"] = opts.energy_method
    return res


def _layers_text(layers: tuple[int, ...] | None) -> str:
    if not layers:
        return ""
    out, start, prev = [], layers[0], layers[0]
    for x in [*layers[1:], None]:
        if x is not None and x == prev + 1:
            prev = x
            continue
        out.append(f"{start}-{prev}" if prev != start else f"{start}")
        if x is not None:
            start = prev = x
    return ",".join(out)


def _headline(results: pd.DataFrame, basis: str) -> pd.DataFrame:
    return results[(results["scope"] == "all") & (results["phase"] == "request")
                   & (results["unit"] == "generated") & (results["basis"] == basis)]


def _pareto(results: pd.DataFrame, opts: Options) -> list[str]:
    h = _headline(results, opts.energy_basis)
    mask = epimod.pareto_front(h["accuracy"].to_numpy(), h["j_per_token_median"].to_numpy())
    front = set(h["config"].to_numpy()[mask])
    results["pareto"] = pd.array([pd.NA] * len(results), dtype="boolean")
    known = h.index[np.isfinite(h["accuracy"].to_numpy(np.float64))
                    & np.isfinite(h["j_per_token_median"].to_numpy(np.float64))]
    results.loc[known, "pareto"] = results.loc[known, "config"].isin(front).to_numpy()
    return sorted(front)


def _pairs(results: pd.DataFrame, ppl: dict[str, float], opts: Options) -> list[dict]:
    h = _headline(results, opts.energy_basis)
    if h.empty:
        return []
    out = epimod.perplexity_pairs(
        list(h["config"]), np.array([ppl.get(c, np.nan) for c in h["config"]]),
        h["j_per_token_median"].to_numpy(), h["j_per_token_ci_lo"].to_numpy(),
        h["j_per_token_ci_hi"].to_numpy(), rel_tol=opts.ppl_tolerance)
    for p in out:
        p["energy_basis"] = f"{opts.energy_basis} J per generated token (whole request)"
    return out


def _savings(results: pd.DataFrame, rep: pd.DataFrame, verdicts: pd.DataFrame,
             opts: Options) -> pd.DataFrame:
    h = _headline(results, opts.energy_basis).set_index("config")
    cols = ["config", "j_per_token", "latency_s", "energy_saving_pct", "latency_saving_pct",
            "baseline", "basis"]
    if opts.baseline is None or h.empty:
        return pd.DataFrame(columns=cols)
    if opts.baseline not in h.index:
        raise UserError(f"--baseline: configuration {opts.baseline!r} is not among the analysed "
                        f"runs ({', '.join(sorted(h.index))})")
    base_j = h.loc[opts.baseline, "j_per_token_median"]
    base_t = h.loc[opts.baseline, "duration_per_request_s_median"]
    out = pd.DataFrame({
        "config": h.index,
        "j_per_token": h["j_per_token_median"].to_numpy(),
        "latency_s": h["duration_per_request_s_median"].to_numpy(),
    })
    out["energy_saving_pct"] = (base_j - out["j_per_token"]) / base_j * 100.0
    out["latency_saving_pct"] = (base_t - out["latency_s"]) / base_t * 100.0
    out["baseline"] = opts.baseline
    out["basis"] = (f"{opts.energy_basis} J per generated token (whole request); latency = "
                    "median request duration")
    return out[cols]


def _breakdown(infos: list[RunInfo], rep: pd.DataFrame, verdicts: pd.DataFrame,
               opts: Options) -> pd.DataFrame:
    """Per config, per request (scope all, gross): prefill, decode, idle share, in mJ."""
    valid = _valid_repeats(rep, verdicts)
    rows = []
    for cfg in dict.fromkeys(i.config for i in infos):
        def med(phase: str, unit: str, col: str, cfg: str = cfg) -> float:
            v = valid[(valid["config"] == cfg) & (valid["scope"] == "all")
                      & (valid["phase"] == phase) & (valid["unit"] == unit)
                      & (valid["basis"] == "gross")][col].to_numpy(np.float64)
            return float(np.median(v)) if len(v) and not np.isnan(v).any() else float("nan")

        idle_p = [i.idle_power_w.get("all", np.nan) for i in infos if i.config == cfg]
        ok = [verdicts[(verdicts["run_id"] == i.run.run_id) & (verdicts["phase"] == "idle")][
            "valid"].all() for i in infos if i.config == cfg]
        idle_p = [p for p, v in zip(idle_p, ok, strict=True) if v and np.isfinite(p)]
        p_idle = float(np.median(idle_p)) if idle_p else float("nan")
        pre = med("prefill", "prompt", "energy_per_request_j")
        dec = med("decode", "generated", "energy_per_request_j")
        req = med("request", "generated", "energy_per_request_j")
        dur = med("request", "generated", "duration_per_request_s")
        idle_mj = p_idle * dur * 1e3
        rows.append({"config": cfg, "prefill_mj": pre * 1e3, "decode_mj": dec * 1e3,
                     "request_mj": req * 1e3, "idle_mj": idle_mj,
                     "net_request_mj": req * 1e3 - idle_mj, "idle_power_w": p_idle,
                     "request_s": dur})
    return pd.DataFrame(rows)


def _layer_groups(infos: list[RunInfo], rep: pd.DataFrame, verdicts: pd.DataFrame,
                  results: pd.DataFrame, opts: Options) -> tuple[list[dict], list[dict],
                                                                 list[str]]:
    notes: list[str] = []
    manifests: dict[str, dict] = {}
    for i in infos:
        if i.config in manifests:
            continue
        m = _manifest(i, opts)
        if m is not None:
            manifests[i.config] = m
    missing = sorted({i.config for i in infos} - set(manifests))
    if missing and (len(infos) > 1 or opts.time_share):
        notes.append("no quantization manifest for " + ", ".join(missing) +
                     " (looked next to run.json model.path and in --manifest-dir): no "
                     "differential or time-share figures for them")
    valid = _valid_repeats(rep, verdicts)
    basis = opts.energy_basis
    sel = valid[(valid["scope"] == "all") & (valid["phase"] == "request")
                & (valid["unit"] == "generated") & (valid["basis"] == basis)]
    values = {c: g["j_per_token"].to_numpy(np.float64) for c, g in sel.groupby("config")}
    sigs = {c: {g["name"]: _group_signature(g) for g in m["layer_groups"]}
            for c, m in manifests.items()}
    diff = epimod.differential_groups(sigs, values, n_boot=opts.n_boot, level=opts.ci_level,
                                      seed=opts.seed)
    for d in diff:
        d["energy_basis"] = f"{basis} J per generated token (whole request)"
        d["method"] = "differential: runs differing only in this group's type"
    tshare: list[dict] = []
    if opts.time_share:
        for cfg, m in manifests.items():
            info = next(i for i in infos if i.config == cfg)
            for p in info.run.placement:
                r = results[(results["config"] == cfg) & (results["scope"] == p.node)
                            & (results["phase"] == "request") & (results["unit"] == "generated")
                            & (results["basis"] == basis)]
                node_val = float(r["j_per_token_median"].iloc[0]) if len(r) else float("nan")
                held = set(p.layers)
                gbytes = {}
                for g in m["layer_groups"]:
                    layers = set(g.get("layers") or [])
                    if not layers or not (layers & held) or g.get("bits_per_weight") is None:
                        continue
                    share = len(layers & held) / len(layers)
                    gbytes[g["name"]] = g["n_weights"] * g["bits_per_weight"] / 8 * share
                for g, val in epimod.time_share_split(node_val, gbytes).items():
                    tshare.append({"config": cfg, "node": p.node, "group": g,
                                   "j_per_token": val, "energy_basis": f"{basis} J per "
                                   "generated token (whole request)",
                                   "label": epimod.TIME_SHARE_LABEL})
    return diff, tshare, notes
