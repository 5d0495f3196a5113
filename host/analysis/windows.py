"""Windows of a run (idle baseline, request, prefill, decode) and their energy per channel, node
and repeat.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd

from epi.core.errors import UserError
from epi.formats.tokenlog import TokenEvent
from host.analysis.align import WindowEnergy, window_energy
from host.analysis.model import CODE_NAMES, FIGURES, NS, PHASES, Options, RunInfo
from host.analysis.power_source import channel_sources, combined
from host.analysis.tokenlog_reader import RunLog
from host.analysis.traces import Trace
from host.analysis.vocabulary import (
    EnergyBasis,
    EnergyMethod,
    FigureMethod,
    TokenUnit,
    WindowKind,
)


# --------------------------------------------------------------------------- runs ↔ trace
def clock_domain(trace: Trace, run: RunLog) -> str | None:
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


def channels_of_nodes(run: RunLog, trace: Trace, override: Mapping[str, list[int]] | None
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


def config_ids(runs: Sequence[RunLog]) -> list[str]:
    """Configuration labels; one label with several model files gets a sha256 suffix."""
    base = [r.config_id for r in runs]
    shas: dict[str, set[str]] = {}
    for label, r in zip(base, runs, strict=True):
        shas.setdefault(label, set()).add(str(r.model.get("sha256")))
    return [f"{label}#{str(r.model.get('sha256'))[:8]}" if len(shas[label]) > 1 else label
            for label, r in zip(base, runs, strict=True)]


def idle_repeats(run: RunLog) -> np.ndarray:
    """The repeat each idle window precedes, from its `idle_start` event (NA when unknown).

    events.csv carries `repeat` on idle rows (formats.md §2); the idle table keeps only the
    times, so the repeat is looked up by the window's start time.
    """
    starts = run.idle["t_start_mono_ns"].to_numpy(np.int64)
    ev = run.events
    out = pd.array([pd.NA] * len(starts), dtype="Int64")
    if "repeat" not in ev.columns or not len(starts):
        return out
    ev = ev[ev["event"] == TokenEvent.IDLE_START]
    rep = pd.Series(ev["repeat"].to_numpy(), index=ev["t_mono_ns"].to_numpy(np.int64))
    rep = rep[~rep.index.duplicated()]
    return pd.array(rep.reindex(starts).to_numpy(), dtype="Int64")


def _windows_local(run: RunLog) -> pd.DataFrame:
    """All analysed windows of a run in its local clock (warm-ups are not analysed)."""
    rq = run.requests[run.requests["warmup"] == 0]
    parts = [pd.DataFrame({
        "kind": "idle", "request_id": pd.NA, "repeat": idle_repeats(run), "prompt_id": None,
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


def _combine(per_channel: dict[int, WindowEnergy], chans: list[int], n: int, method: str,
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
        use_counter = (np.isfinite(we.energy_counter_j) if method == EnergyMethod.COUNTER
                       else np.zeros(n, dtype=bool))
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
    used = np.where(n_counter == len(chans), FigureMethod.COUNTER,
                    np.where(n_counter == 0, FigureMethod.TRAPEZOID, FigureMethod.MIXED)
                    ).astype(object)
    used[~np.isfinite(prim)] = ""
    return {"energy_j": prim, "energy_method": used, "energy_trapezoid_j": trap,
            "energy_counter_j": cnt, "counter_resolution_j": np.full(n, res),
            "n_samples": ns, "reason": reason, "counter_reason": creason, "code": code}


def measure_run(info: RunInfo, trace: Trace, opts: Options) -> pd.DataFrame:
    run = info.run
    w = _windows_local(run)
    w.insert(0, "run_id", run.run_id)
    w.insert(1, "config", info.config)
    w["duration_s"] = (w["t1_local_ns"] - w["t0_local_ns"]) / NS
    n = len(w)
    sources = channel_sources(trace)
    all_chans = sorted({c for cs in info.node_channels.values() for c in cs})
    scope_source = {"all": combined(sources.get(c, "") for c in all_chans),
                    **{node: combined(sources.get(c, "") for c in cs)
                       for node, cs in info.node_channels.items()}}
    if not info.clock.usable:
        w["t0_meter_ns"] = pd.array([pd.NA] * n, dtype="Int64")
        w["t1_meter_ns"] = pd.array([pd.NA] * n, dtype="Int64")
        frames = []
        for scope in ["all", *info.node_channels]:
            f = w.copy()
            f["scope"] = scope
            f["power_source"] = scope_source[scope]
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
    shift = {ch: round(info.lag_applied_ms.get(ch, 0.0) * 1e6) for ch in chans}
    per_channel = {ch: window_energy(trace.series(ch, info.boot_id), t0 + shift[ch],
                                     t1 + shift[ch], edge=opts.edge,
                                     min_samples=opts.min_samples) for ch in chans}
    moved = _lag_moved(info, trace, opts, t0, t1, shift, per_channel)
    resolution = {ch: trace.channels[ch].counter_resolution_j for ch in chans}
    phase_rows = _phase_rows(w)
    frames = []
    for scope, scope_chans in [("all", chans), *info.node_channels.items()]:
        comb = _combine(per_channel, scope_chans, n, opts.energy_method, resolution)
        if phase_rows is not None:
            _request_from_phase_rows(comb, *phase_rows)
        f = w.copy()
        f["scope"] = scope
        f["power_source"] = scope_source[scope]
        f["lag_correction_ms"] = float(np.mean([info.lag_applied_ms.get(c, 0.0)
                                                for c in scope_chans]))
        # what the correction moved: this window's energy shifted minus unshifted (0: none)
        f["lag_energy_moved_j"] = np.sum([moved[c] for c in scope_chans if c in moved],
                                         axis=0) if any(c in moved for c in scope_chans) \
            else 0.0
        for col in ("energy_j", "energy_method", "energy_trapezoid_j", "energy_counter_j",
                    "counter_resolution_j"):
            f[col] = comb[col]
        f["n_samples"] = comb["n_samples"]
        f["reason"] = comb["reason"]
        f["counter_reason"] = comb["counter_reason"]
        f["reason_code"] = CODE_NAMES[comb["code"]]
        if phase_rows is None:
            f = _request_from_phases(f)
        else:
            f["request_method"] = comb["request_method"]
        frames.append(f)
    return pd.concat(frames, ignore_index=True)


def _lag_moved(info: RunInfo, trace: Trace, opts: Options, t0: np.ndarray, t1: np.ndarray,
               shift: Mapping[int, int], per_channel: Mapping[int, WindowEnergy]
               ) -> dict[int, np.ndarray]:
    """Per channel with a lag shift, each window's energy with the shift minus without it.

    A shift that moves no window's energy (one that falls between the samples the edge
    model reads) corrects nothing: its channel leaves `info.lag_applied_ms`, so the figure is
    not labelled corrected and the lag gate judges it as uncorrected."""
    out: dict[int, np.ndarray] = {}
    for ch, ns in shift.items():
        if not ns:
            continue
        plain = window_energy(trace.series(ch, info.boot_id), t0, t1, edge=opts.edge,
                              min_samples=opts.min_samples)
        diff = _primary(per_channel[ch], opts) - _primary(plain, opts)
        if not np.any(np.isfinite(diff) & (diff != 0.0)):
            info.lag_applied_ms.pop(ch, None)
            info.lag_not_applied[ch] = ("the shift moves no window's energy at this sample "
                                        "period and edge model")
            continue
        out[ch] = np.where(np.isfinite(diff), diff, 0.0)
    return out


def _primary(e: WindowEnergy, opts: Options) -> np.ndarray:
    """A channel's figure as the analysis takes it: the counter's where it covers the window
    (energy method "counter"), the trapezoid's otherwise."""
    trap = np.asarray(e.energy_j, dtype=np.float64)
    if opts.energy_method != EnergyMethod.COUNTER:
        return trap
    counter = np.asarray(e.energy_counter_j, dtype=np.float64)
    return np.where(np.isfinite(counter), counter, trap)


def _phase_rows(w: pd.DataFrame) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """(request, prefill, decode) row positions of each request, when `_windows_local` laid
    them out as it does (one block per kind, the requests in one order, ids unique); None
    otherwise (then `_request_from_phases` matches them by request id)."""
    kind = w["kind"].to_numpy(dtype=object)
    rows = [np.flatnonzero(kind == k) for k in ("request", "prefill", "decode")]
    if not len(rows[0]) or len({len(r) for r in rows}) != 1:
        return None
    ids = [w["request_id"].to_numpy(dtype=np.float64, na_value=np.nan)[r] for r in rows]
    if (np.isnan(ids[0]).any() or len(np.unique(ids[0])) != len(ids[0])
            or not (np.array_equal(ids[0], ids[1]) and np.array_equal(ids[0], ids[2]))):
        return None
    return rows[0], rows[1], rows[2]


def _request_from_phase_rows(comb: dict[str, np.ndarray], req: np.ndarray, pre: np.ndarray,
                             dec: np.ndarray) -> None:
    """`_request_from_phases` on one scope's combined arrays (in place; adds
    `request_method`): the same figures, by row position instead of pandas lookups."""
    method = np.full(len(comb["energy_j"]), "", dtype=object)
    method[req] = "direct"
    e = comb["energy_j"]
    both = np.isfinite(e[pre]) & np.isfinite(e[dec])
    for col in ("energy_j", "energy_trapezoid_j", "energy_counter_j"):
        v = comb[col]
        total = v[pre] + v[dec]
        v[req[both]] = total[both]  # NaN where the sum is (a counter missing on one side)
    m_pre, m_dec = comb["energy_method"][pre], comb["energy_method"][dec]
    em = comb["energy_method"]
    em[req[both]] = np.where(m_pre == m_dec, m_pre, "mixed")[both]
    method[req[both]] = "prefill+decode"
    comb["request_method"] = method


def _request_from_phases(f: pd.DataFrame) -> pd.DataFrame:
    """Request energy = prefill + decode where both are measured, else the direct integral.

    The first token is a load change like the window edges; splitting there keeps the edge
    model's exactness and makes the phases add up to the request. `request_method` says which.
    """
    f = f.copy()
    f["request_method"] = np.where(f["kind"] == WindowKind.REQUEST, "direct", "")
    req = f["kind"] == WindowKind.REQUEST
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


def idle_power(win: pd.DataFrame) -> tuple[dict[str, float], dict[str, str]]:
    power, why = {}, {}
    for scope, g in win[win["kind"] == WindowKind.IDLE].groupby("scope", sort=False):
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
    if unit == TokenUnit.PROMPT:
        return npr
    if unit == TokenUnit.TOTAL:
        return npr + ngen
    # generated: a decode window holds n_generated − 1 tokens (token 0 ends prefill)
    return np.where(kind == WindowKind.DECODE, ngen - 1, ngen)


def method_of(by_counter: np.ndarray, by_trapezoid: np.ndarray) -> np.ndarray:
    """The energy method a figure over several windows used: "counter" or "trapezoid" when
    every window used that one, "mixed" when some fell back to the power integral (a counter
    reset, a frozen counter), "" when no window has energy."""
    return np.select([by_counter & by_trapezoid, by_counter, by_trapezoid],
                     [FigureMethod.MIXED, FigureMethod.COUNTER, FigureMethod.TRAPEZOID],
                     "").astype(object)


def methods_used(methods: pd.Series) -> str:
    """One method over the repeats (or windows) behind a summary row (see method_of)."""
    m = set(methods.dropna().astype(str)) - {""}
    return str(method_of(np.array([bool(m & {FigureMethod.COUNTER, FigureMethod.MIXED})]),
                         np.array([bool(m & {FigureMethod.TRAPEZOID, FigureMethod.MIXED})]))[0])


def repeat_table(win: pd.DataFrame) -> pd.DataFrame:
    """One row per (run, scope, phase, unit, basis, repeat): ratio of sums over its requests."""
    req = win[win["kind"].isin(PHASES)].copy()
    rows = []
    for phase, unit in FIGURES:
        f = req[req["kind"] == phase].copy()
        f["tokens"] = _tokens(f, unit)
        f["bad_tokens"] = ~(f["tokens"] > 0)
        f["t0_meter_f"] = f["t0_meter_ns"].to_numpy(dtype=np.float64, na_value=np.nan)
        keys = ["run_id", "config", "scope", "power_source", "repeat"]
        f["by_counter"] = f["energy_method"].isin([FigureMethod.COUNTER, FigureMethod.MIXED])
        f["by_trapezoid"] = f["energy_method"].isin([FigureMethod.TRAPEZOID,
                                                      FigureMethod.MIXED])
        for basis, col in (("gross", "energy_j"), ("net", "energy_net_j")):
            f["is_null"] = f[col].isna()
            agg = f.groupby(keys, sort=True).agg(
                energy_sum=(col, "sum"), n_null=("is_null", "sum"), tokens=("tokens", "sum"),
                n_requests=(col, "size"), duration_s=("duration_s", "sum"),
                bad_tokens=("bad_tokens", "any"), t_start_meter_ns=("t0_meter_f", "min"),
                by_counter=("by_counter", "any"), by_trapezoid=("by_trapezoid", "any"))
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
            reason = agg["first_reason"] if basis == EnergyBasis.GROSS else agg["net_reason"].where(
                agg["net_reason"] != "", agg["first_reason"])
            why = np.where((why == "") & (agg["n_null"] > 0),
                           agg["n_null"].astype(str) + " of " + agg["n_requests"].astype(str)
                           + f" {phase} windows null: " + reason.astype(str), why)
            agg["reason"] = why
            agg["phase"], agg["unit"], agg["basis"] = phase, unit, basis
            agg["energy_sum_j"] = np.where(agg["n_null"] > 0, np.nan, agg["energy_sum"])
            agg["energy_method"] = method_of(agg["by_counter"].to_numpy(bool),
                                             agg["by_trapezoid"].to_numpy(bool))
            rows.append(agg.drop(columns=["energy_sum", "n_null", "first_reason",
                                          "net_reason", "bad_tokens", "duration_s",
                                          "by_counter", "by_trapezoid"]))
    out = pd.concat(rows, ignore_index=True)
    out["repeat"] = out["repeat"].astype("Int64")
    return out
