"""The report's figures (matplotlib, Agg backend). Each returns a `Figure` record: the
matplotlib figure, its title and a caption that says what power it shows (measured or
modelled), the energy basis, the method and the sample counts.

Invalid runs are drawn (hollow grey markers, labelled invalid) but never enter a median, an
interval or the Pareto frontier: those come from the analysis, which uses valid runs only.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.transforms import blended_transform_factory

from epi.core.errors import UserError
from epi.formats.tokenlog import parse_events
from host.analysis.intervals import pct
from host.analysis.power_source import COMPONENT
from host.report.data import (
    ReportData,
    accuracy_interval_text,
    epi_interval_text,
    interval_text,
)

VALID_COLOR = "#1f77b4"
FRONT_COLOR = "#d62728"
INVALID_COLOR = "#888888"
PHASE_COLORS = {"prefill": "#ff7f0e", "decode": "#2ca02c", "idle": "#bbbbbb"}


@dataclass
class Figure:
    key: str
    title: str
    caption: str
    fig: plt.Figure


def _finite(x: object) -> bool:
    try:
        return bool(np.isfinite(float(x)))  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return False


def _stamp(ax: plt.Axes, rd: ReportData) -> None:
    """A corner label on the plot itself: modelled power can never be mistaken for measured."""
    text = ("MODELLED POWER (emulator)" if rd.labels.power_source == "modelled"
            else "measured power")
    if COMPONENT in rd.labels.power_detail:
        text += f" · {COMPONENT.upper()}"
    ax.text(0.99, 0.01, f"{text} · {rd.basis}", transform=ax.transAxes, ha="right",
            va="bottom", fontsize=7, color="#a00" if rd.labels.power_source == "modelled"
            else "#333", alpha=0.85)


def _counts(rd: ReportData, phase: str = "request") -> str:
    return rd.counts(phase)


def _run_points(rd: ReportData, phase: str = "request") -> pd.DataFrame:
    pr = rd.per_run
    return pr[pr["phase"] == phase] if len(pr) else pr


def accuracy_vs_energy(rd: ReportData) -> Figure:
    h = rd.headline()
    fig, ax = plt.subplots(figsize=(7.5, 5))
    pts = []
    for cfg, r in h.iterrows():
        x, y = r["j_per_token_median"], r["accuracy"]
        if not (_finite(x) and _finite(y)):
            continue
        xerr = [[x - r["j_per_token_ci_lo"]], [r["j_per_token_ci_hi"] - x]] if _finite(
            r["j_per_token_ci_lo"]) else None
        yerr = [[y - r["accuracy_ci_lo"]], [r["accuracy_ci_hi"] - y]] if _finite(
            r["accuracy_ci_lo"]) else None
        on_front = cfg in set(rd.doc.get("pareto") or [])
        ax.errorbar(x, y, xerr=xerr, yerr=yerr, fmt="o", capsize=3,
                    color=FRONT_COLOR if on_front else VALID_COLOR, zorder=3)
        ax.annotate(str(cfg), (x, y), textcoords="offset points", xytext=(5, 5), fontsize=8)
        pts.append((x, y, cfg, on_front))
    front = sorted((p for p in pts if p[3]), key=lambda p: p[0])
    if len(front) >= 1:
        fx = [p[0] for p in front]
        fy = [p[1] for p in front]
        ax.step(fx, fy, where="post", color=FRONT_COLOR, lw=1.2, ls="--",
                label="Pareto frontier (valid runs)")
    acc = h["accuracy"]
    inv = _run_points(rd)
    inv = inv[~inv["valid"]] if len(inv) else inv
    shown_inv = False
    for _, r in inv.iterrows():
        y = acc.get(r["config"], np.nan)
        if _finite(r["j_per_token"]) and _finite(y):
            ax.plot(r["j_per_token"], y, "o", mfc="none", color=INVALID_COLOR, zorder=2,
                    label=None if shown_inv else "invalid run (shown, not in medians)")
            ax.annotate(f"{r['config']} (invalid)", (r["j_per_token"], y), fontsize=6,
                        color=INVALID_COLOR, textcoords="offset points", xytext=(4, -9))
            shown_inv = True
    ax.set_xlabel(f"{rd.basis} J per generated token (whole request)")
    ax.set_ylabel("accuracy (composite)")
    ax.set_title("Accuracy vs energy per token")
    if front or shown_inv:
        ax.legend(fontsize=8, loc="best")
    if not pts and not shown_inv:
        ax.text(0.5, 0.5, "no configuration has both a valid J/token and an accuracy",
                ha="center", va="center", transform=ax.transAxes)
    ax.grid(alpha=0.3)
    _stamp(ax, rd)
    cap = ("Medians over the repeats of valid runs with their intervals (both axes); red = on "
           "the Pareto frontier (no other configuration is both cheaper and more accurate); "
           "hollow grey = an invalid run's own measured figure. "
           + rd.labels.line(_counts(rd), ci=f"{interval_text(h)}; {accuracy_interval_text(h)}"))
    return Figure("accuracy_vs_energy", "Accuracy vs J per generated token", cap, fig)


def epi_sorted(rd: ReportData) -> Figure:
    h = rd.headline()
    rows = []
    for cfg, r in h.iterrows():
        why = r.get("reason") if isinstance(r.get("reason"), str) and r.get("reason") else \
            r.get("epi_reason")
        rows.append((cfg, r["epi"], r["epi_ci_lo"], r["epi_ci_hi"], why if isinstance(why, str)
                     else ""))
    rows.sort(key=lambda t: (not _finite(t[1]), t[1] if _finite(t[1]) else 0))
    fig, ax = plt.subplots(figsize=(7.5, 0.45 * max(len(rows), 3) + 1.5))
    ys = np.arange(len(rows))
    acc = h["accuracy"]
    inv = _run_points(rd)
    inv = inv[~inv["valid"]] if len(inv) else inv
    shown_inv = False
    for y, (cfg, e, lo, hi, why) in zip(ys, rows, strict=True):
        if _finite(e):
            ax.barh(y, e, color=VALID_COLOR, alpha=0.8)
            if _finite(lo) and _finite(hi):
                ax.errorbar(e, y, xerr=[[e - lo], [hi - e]], fmt="none", color="k", capsize=3)
        else:
            ax.text(0.01, y, f"null: {str(why)[:70]}", va="center", fontsize=7, color="#a00",
                    transform=blended_transform_factory(ax.transAxes, ax.transData))
        for _, r in inv[inv["config"] == cfg].iterrows():
            a = acc.get(cfg, np.nan)
            if _finite(r["j_per_token"]) and _finite(a) and a > 0:
                ax.plot(r["j_per_token"] / a, y, "o", mfc="none", color=INVALID_COLOR,
                        label=None if shown_inv else "invalid run (shown, not in medians)")
                shown_inv = True
    ax.set_yticks(ys, [r[0] for r in rows], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel(f"EPI = {rd.basis} J per generated token / accuracy (lower is better)")
    ax.set_title("Energy per intelligence, sorted")
    if shown_inv:
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(0.0, -0.22), frameon=False)
    ax.grid(axis="x", alpha=0.3)
    _stamp(ax, rd)
    cap = ("EPI per configuration, best first, with its interval (J/token interval divided "
           "by the accuracy interval); null EPIs say why. "
           + rd.labels.line(_counts(rd), ci=epi_interval_text(h)))
    return Figure("epi_sorted", "EPI per configuration", cap, fig)


def _phase_means(rd: ReportData) -> pd.DataFrame:
    """Per configuration, per request, mJ: prefill, decode and the idle share (idle power ×
    request time), from the analysis' breakdown (valid runs); where that is null, from the
    configuration's invalid runs (flagged)."""
    bd = pd.DataFrame(rd.doc.get("phase_breakdown") or [])
    pr = rd.per_run
    rows = []
    idle_w = {}
    for run in rd.doc["runs"]:
        p = (run.get("idle_power_w") or {}).get("all")
        if p is not None:
            idle_w.setdefault(run["config"], []).append(p)
    for cfg in rd.configs:
        b = bd[bd["config"] == cfg].iloc[0] if len(bd) and (bd["config"] == cfg).any() else None
        if b is not None and _finite(b["prefill_mj"]) and _finite(b["decode_mj"]):
            rows.append({"config": cfg, "prefill": b["prefill_mj"], "decode": b["decode_mj"],
                         "idle": b["idle_mj"], "from_invalid": False})
            continue
        vals = {}
        for phase in ("prefill", "decode", "request"):
            sel = pr[(pr["config"] == cfg) & (pr["phase"] == phase)] if len(pr) else pr
            e = (sel["energy_j"] / sel["n_windows_measured"].where(sel["n_windows_measured"] > 0)
                 ) if len(sel) else pd.Series(dtype=float)
            d = sel["duration_s"] / sel["n_windows"] if len(sel) else pd.Series(dtype=float)
            vals[phase] = (float(np.nanmedian(e)) * 1e3 if e.notna().any() else np.nan,
                           float(np.nanmedian(d)) if d.notna().any() else np.nan)
        pw = float(np.median(idle_w[cfg])) if cfg in idle_w else np.nan
        rows.append({"config": cfg, "prefill": vals["prefill"][0], "decode": vals["decode"][0],
                     "idle": pw * vals["request"][1] * 1e3, "from_invalid": True})
    return pd.DataFrame(rows)


def phase_energy(rd: ReportData) -> Figure:
    d = _phase_means(rd)
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    x = np.arange(len(d))
    pre = d["prefill"].fillna(0).to_numpy()
    dec = d["decode"].fillna(0).to_numpy()
    alpha = np.where(d["from_invalid"], 0.35, 0.9)
    for i in range(len(d)):
        ax.bar(x[i], pre[i], color=PHASE_COLORS["prefill"], alpha=alpha[i],
               label="prefill" if i == 0 else None)
        ax.bar(x[i], dec[i], bottom=pre[i], color=PHASE_COLORS["decode"], alpha=alpha[i],
               label="decode" if i == 0 else None)
        idle = d["idle"].iloc[i]
        if _finite(idle):
            ax.bar(x[i], idle, fill=False, hatch="//", edgecolor="#555", lw=0.6,
                   label="idle share (idle power × request time)" if i == 0 else None)
        if d["from_invalid"].iloc[i]:
            ax.text(x[i], pre[i] + dec[i], "invalid runs", ha="center", va="bottom",
                    fontsize=7, color="#a00")
    ax.set_xticks(x, d["config"], rotation=30, ha="right", fontsize=8)
    ax.set_ylabel("energy per request, mJ (gross)")
    ax.set_title("Per-phase energy per request")
    ax.legend(fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    _stamp(ax, rd)
    cap = ("Median energy per request split into prefill and decode (stacked); the hatched "
           "bar is the part of the request's energy the idle machine would have drawn anyway "
           "(idle baseline power × request duration). Faded bars with 'invalid runs' come from "
           "invalid runs only. Gross energy. "
           + rd.labels.line(_counts(rd), ci="none (medians per request)"))
    return Figure("phase_energy", "Per-phase energy (prefill / decode / idle share)", cap, fig)


def _pick_request(rd: ReportData) -> tuple[dict, pd.DataFrame] | None:
    w = rd.windows
    if w.empty:
        return None
    pr = _run_points(rd)
    valid_runs = list(pr[pr["valid"]]["run_id"]) if len(pr) else []
    runs = rd.doc["runs"]
    ordered = [r for r in runs if r["run_id"] in valid_runs] + [
        r for r in runs if r["run_id"] not in valid_runs]
    for run in ordered:
        req = w[(w["run_id"] == run["run_id"]) & (w["kind"] == "request") & (w["scope"] == "all")
                & w["t0_meter_ns"].notna()]
        if req.empty:
            continue
        req = req.sort_values("duration_s")
        row = req.iloc[len(req) // 2]
        parts = w[(w["run_id"] == run["run_id"]) & (w["scope"] == "all")
                  & (w["request_id"] == row["request_id"])]
        return run, parts
    return None


def power_trace(rd: ReportData) -> Figure:
    fig, ax = plt.subplots(figsize=(8, 4.2))
    picked = _pick_request(rd)
    title = "One request's power trace"
    if picked is None:
        ax.text(0.5, 0.5, "no request with meter times", ha="center", transform=ax.transAxes)
        return Figure("power_trace", title, "No request could be placed on the meter clock.",
                      fig)
    run, parts = picked
    from host.analysis.traces import read_trace

    req = parts[parts["kind"] == "request"].iloc[0]
    t0, t1 = int(req["t0_meter_ns"]), int(req["t1_meter_ns"])
    offset = t0 - int(req["t0_local_ns"])
    pad = max(int(0.4 * (t1 - t0)), 300_000_000)
    trace = read_trace(rd.doc["trace"]["path"])
    s = trace.domain_samples(run.get("meter_boot_id"))
    chans = sorted({c for p in run.get("placement") or [] for c in (p.get("channels") or [])})
    if chans:
        s = s[s["channel"].isin(chans)]
    s = s[(s["t_mono_ns"] >= t0 - pad) & (s["t_mono_ns"] <= t1 + pad)]
    sweep = s.groupby(["segment", "seq"]).agg(t=("t_mono_ns", "mean"), p=("power_w", "sum"))
    t_s = (sweep["t"].to_numpy() - t0) / 1e9
    ax.plot(t_s, sweep["p"].to_numpy(), "-o", ms=3, color="k", lw=1,
            label=f"meter readings (channels {', '.join(map(str, chans)) or 'all'}, summed)")
    for kind in ("prefill", "decode"):
        p = parts[parts["kind"] == kind]
        if len(p) and pd.notna(p["t0_meter_ns"].iloc[0]):
            a = (p["t0_meter_ns"].iloc[0] - t0) / 1e9
            b = (p["t1_meter_ns"].iloc[0] - t0) / 1e9
            e = p["energy_j"].iloc[0]
            lab = f"{kind} window" + ((f" ({e:.3g} J)" if e >= 1 else f" ({e * 1e3:.3g} mJ)")
                                      if _finite(e) else " (null)")
            ax.axvspan(a, b, color=PHASE_COLORS[kind], alpha=0.25, label=lab)
    tok = _token_times(Path(run["path"]), int(req["request_id"]))
    for i, t in enumerate(tok):
        ax.axvline((t + offset - t0) / 1e9, color="#1f77b4", lw=0.6, alpha=0.7,
                   label="token times" if i == 0 else None)
    ax.set_xlabel("time since request start, s (meter clock)")
    ax.set_ylabel("power, W")
    pr = _run_points(rd)
    this = pr[pr["run_id"] == run["run_id"]] if len(pr) else pr
    valid = bool(this["valid"].all()) if len(this) else False
    ax.set_title(f"{run['config']} — request {int(req['request_id'])} "
                 f"({'valid run' if valid else 'INVALID run'})")
    ax.legend(fontsize=7, loc="upper right")
    ax.grid(alpha=0.3)
    _stamp(ax, rd)
    cap = (f"Run {run['run_id'][:12]} ({run['config']}), the request of median duration: the "
           f"meter's readings around it, the prefill and decode windows that were integrated "
           f"(shaded) and every generated token's time (blue lines, mapped to the meter clock "
           f"by the run's clock offset). {len(sweep)} sweeps shown; the window integrals use "
           f"{int(parts['n_samples'].fillna(0).sum())} samples. "
           + rd.labels.line(ci="none (one request's readings)"))
    return Figure("power_trace", title, cap, fig)


def _token_times(run_dir: Path, request_id: int) -> list[int]:
    """The request's token times (t_mono_ns) from the run's events.csv, read by the one
    token-log reader; none when the file is gone or refused (the figure then shows none)."""
    try:
        ev, _ = parse_events(run_dir / "events.csv")
    except UserError:
        return []
    return [t for kind, rid, t in zip(ev["event"], ev["request_id"], ev["t_mono_ns"],
                                      strict=True) if kind == "token" and rid == request_id]


def layer_groups(rd: ReportData) -> Figure:
    """Left: J/token per node (each node's own meter channels); right: differential."""
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 4.2))
    r = rd.results
    nodes = r[(r["scope"] != "all") & (r["phase"] == "request") & (r["unit"] == "generated")
              & (r["basis"] == rd.basis)]
    if nodes.empty:
        a1.text(0.5, 0.5, "no per-node figures", ha="center", transform=a1.transAxes)
    else:
        scopes = list(dict.fromkeys(nodes["scope"]))
        cfgs = list(dict.fromkeys(nodes["config"]))
        width = 0.8 / len(scopes)
        for k, sc in enumerate(scopes):
            sub = nodes[nodes["scope"] == sc].set_index("config")
            xs = np.arange(len(cfgs)) + k * width
            vals = [sub["j_per_token_median"].get(c, np.nan) for c in cfgs]
            a1.bar(xs, np.nan_to_num(vals), width, label=f"node {sc}")
            for x, c, v in zip(xs, cfgs, vals, strict=True):
                if not _finite(v):
                    a1.text(x, 0, "null", rotation=90, fontsize=7, ha="center", va="bottom")
                elif _finite(sub["j_per_token_ci_lo"].get(c)):
                    a1.errorbar(x, v, yerr=[[v - sub["j_per_token_ci_lo"][c]],
                                            [sub["j_per_token_ci_hi"][c] - v]], fmt="none",
                                color="k", capsize=2)
        a1.set_xticks(np.arange(len(cfgs)) + 0.4 - width / 2, cfgs, rotation=30, ha="right",
                      fontsize=7)
        a1.legend(fontsize=7)
        if len(scopes) == 1:
            a1.set_title("Measured per node (one node holds every layer)", fontsize=9)
        else:
            a1.set_title("Measured per node (each node's layers)", fontsize=9)
    a1.set_ylabel(f"{rd.basis} J per generated token")
    diff = pd.DataFrame(rd.doc.get("layer_groups", {}).get("differential") or [])
    if diff.empty:
        a2.text(0.5, 0.5, "no two configurations differ in exactly one layer group",
                ha="center", va="center", fontsize=8, transform=a2.transAxes, wrap=True)
    else:
        labels = [f"{g}: {ta.split(' ')[0]}→{tb.split(' ')[0]}\n({a} vs {b})" for g, ta, tb, a, b
                  in zip(diff["group"], diff["type_a"], diff["type_b"], diff["config_a"],
                         diff["config_b"], strict=True)]
        y = np.arange(len(diff))
        d = diff["delta_j_per_token"].astype(float).to_numpy()
        a2.barh(y, np.nan_to_num(d), color=VALID_COLOR)
        lo = diff["ci_lo"].astype(float).to_numpy()
        hi = diff["ci_hi"].astype(float).to_numpy()
        ok = np.isfinite(d) & np.isfinite(lo) & np.isfinite(hi)
        if ok.any():
            a2.errorbar(d[ok], y[ok], xerr=[d[ok] - lo[ok], hi[ok] - d[ok]], fmt="none",
                        color="k", capsize=3)
        for yi, v, why in zip(y, d, diff["reason"], strict=True):
            if not np.isfinite(v):
                a2.text(0.01, yi, f"null: {why}", fontsize=7, va="center", color="#a00",
                        transform=blended_transform_factory(a2.transAxes, a2.transData))
        a2.set_yticks(y, labels, fontsize=7)
        a2.axvline(0, color="k", lw=0.6)
        a2.set_xlabel(f"Δ {rd.basis} J/token (B − A)")
    a2.set_title("Differential: maps differing in one group", fontsize=9)
    for ax in (a1, a2):
        ax.grid(alpha=0.3)
    _stamp(a2, rd)
    fig.tight_layout()
    ci = [interval_text(nodes, "per-node J/token")] if len(nodes) else []
    if len(diff):
        ci.append("differential: " + "; ".join(
            f"{a} vs {b}: {_diff_interval(row)}" for a, b, row in
            zip(diff["config_a"], diff["config_b"], diff.to_dict("records"), strict=True)))
    cap = ("Left: J per generated token measured on each node's own meter channels (the layers "
           "that node holds). Right: the energy attributed to one layer group by two maps that "
           "differ only in that group's type: the mean difference B − A of J per generated "
           "token, with a paired-t interval over rounds when their repeats were interleaved, "
           "else Welch's unpaired interval (valid runs only). "
           + rd.labels.line(_counts(rd), ci="; ".join(ci) or "none"))
    return Figure("layer_groups", "Per-layer-group energy", cap, fig)


def _diff_interval(row: dict) -> str:
    """'95 % paired by round' / '95 % Welch (unpaired), n=3/3' for one differential row."""
    cov = row.get("ci_coverage")
    if not _finite(cov):
        return f"no interval ({row.get('reason') or 'too few repeats'})"
    method = str(row.get("ci_method") or "")
    kind = "paired by round" if method.startswith("paired") else "Welch (unpaired)"
    n = (f", n={int(row['n_a'])}/{int(row['n_b'])} repeats" if _finite(row.get("n_a"))
         and _finite(row.get("n_b")) else "")
    return f"{pct(float(cov))} {kind}{n}"


def energy_vs_size(rd: ReportData) -> Figure:
    h = rd.headline()
    m = rd.models
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 4))
    pr = _run_points(rd)
    for ax, col, xl, scale in ((a1, "bits_per_weight", "bits per weight (whole file)", 1.0),
                               (a2, "size_bytes", "file size, MB", 1e-6)):
        shown = False
        for cfg, r in h.iterrows():
            if cfg not in m.index or not _finite(m.loc[cfg, col]):
                continue
            x = float(m.loc[cfg, col]) * scale
            y = r["j_per_token_median"]
            if _finite(y):
                yerr = [[y - r["j_per_token_ci_lo"]], [r["j_per_token_ci_hi"] - y]] if _finite(
                    r["j_per_token_ci_lo"]) else None
                ax.errorbar(x, y, yerr=yerr, fmt="o", color=VALID_COLOR, capsize=3)
                ax.annotate(str(cfg), (x, y), textcoords="offset points", xytext=(4, 4),
                            fontsize=7)
            inv = pr[(pr["config"] == cfg) & ~pr["valid"]] if len(pr) else pr
            for _, q in inv.iterrows():
                if _finite(q["j_per_token"]):
                    ax.plot(x, q["j_per_token"], "o", mfc="none", color=INVALID_COLOR,
                            label=None if shown else "invalid run (not in medians)")
                    shown = True
        ax.set_xlabel(xl)
        ax.set_ylabel(f"{rd.basis} J per generated token")
        ax.grid(alpha=0.3)
        if shown:
            ax.legend(fontsize=7)
    a1.set_title("J/token vs bits per weight", fontsize=9)
    a2.set_title("J/token vs file size", fontsize=9)
    _stamp(a2, rd)
    fig.tight_layout()
    cap = ("Median J per generated token (valid runs, with interval) against the model file's "
           "bits per weight and size, read from the quantization manifests. "
           + rd.labels.line(_counts(rd)))
    return Figure("energy_vs_size", "J/token vs bits per weight and file size", cap, fig)


ALL = (accuracy_vs_energy, epi_sorted, phase_energy, power_trace, layer_groups, energy_vs_size)


def build_all(rd: ReportData) -> list[Figure]:
    return [f(rd) for f in ALL]
