"""The report's figures (matplotlib, Agg backend). Each returns a `Figure` record: the
matplotlib figure, its title, a short caption (what it shows, what differs from the report's
"how these figures were measured" block, and the power tag) and alt text that states the
figure's content in words.

Colours are the Okabe–Ito palette (distinguishable with the common colour-vision
deficiencies), and the frontier also differs by marker shape. Point labels are placed so that
none overlaps another (host.report.label_layout). The EPI figure uses a log axis, so one wide
interval cannot squash the others (docs/report.md says why).

Invalid runs are drawn (hollow grey markers, labelled invalid) but never enter a median, an
interval or the Pareto frontier: those come from the analysis, which uses valid runs only.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from cycler import cycler
from matplotlib.artist import Artist
from matplotlib.ticker import FuncFormatter
from matplotlib.transforms import blended_transform_factory

from epi.core.errors import UserError
from epi.core.text import format_number
from epi.formats.tokenlog import TokenEvent, parse_events
from host.analysis import split_compare
from host.analysis.headline import headline_rows
from host.analysis.intervals import finite as _finite
from host.analysis.intervals import number, pct
from host.analysis.paired import pairing_label
from host.analysis.power_source import COMPONENT, MODELLED
from host.analysis.vocabulary import SCOPE_ALL, WindowKind
from host.report.data import ReportData, interval_text
from host.report.label_layout import PointLabel, place_labels

# Okabe & Ito, "Color Universal Design" (2008): safe for deuteranopia, protanopia, tritanopia.
OKABE_ITO = ("#0072B2", "#D55E00", "#009E73", "#E69F00", "#56B4E9", "#CC79A7", "#F0E442",
             "#000000")
VALID_COLOR = "#0072B2"  # blue
FRONT_COLOR = "#D55E00"  # vermillion (and square markers)
INVALID_COLOR = "#999999"
MODELLED_COLOR = "#D55E00"
PHASE_COLORS = {"prefill": "#E69F00", "decode": "#009E73", "idle": "#999999"}
TOKEN_COLOR = "#56B4E9"
# Applied while the figures are built: the palette, and no mathtext, so a "$" in a
# configuration name from the analysis files is drawn as a character, never parsed.
PALETTE_CYCLE = cycler(color=list(OKABE_ITO))


@dataclass
class Figure:
    key: str
    title: str
    caption: str
    fig: plt.Figure
    alt: str = ""


def _stamp(ax: plt.Axes, rd: ReportData, basis: str | None = None) -> None:
    """A corner label on the plot itself: modelled power can never be mistaken for measured.
    `basis`: the figure's own energy basis where it is not the analysis's (one basis a
    figure)."""
    text = ("MODELLED POWER (emulator)" if rd.labels.power_source == MODELLED
            else "measured power")
    if COMPONENT in rd.labels.power_detail:
        text += f" · {COMPONENT.upper()}"
    ax.text(0.99, 0.01, f"{text} · {basis or rd.basis}", transform=ax.transAxes, ha="right",
            va="bottom", fontsize=7, color=MODELLED_COLOR
            if rd.labels.power_source == MODELLED else "#333333", alpha=0.85, zorder=10,
            bbox={"facecolor": "white", "edgecolor": "none", "alpha": 0.8, "pad": 1.5})


def _caption(rd: ReportData, what: str, differs: str = "", basis: str | None = None) -> str:
    """A figure's short caption: what it shows, what differs from the measurement block,
    and the power tag (with the figure's own energy basis where it is not the analysis's)."""
    tag = rd.labels.tag()
    if basis is not None:
        tag = tag.replace(f"{rd.labels.energy_basis} energy", f"{basis} energy")
    return what + (f" Differs from the block above: {differs}." if differs else "") + \
        f" [{tag}]"


def _run_points(rd: ReportData, phase: str = "request") -> pd.DataFrame:
    pr = rd.per_run
    return pr[pr["phase"] == phase] if len(pr) else pr


_g = format_number  # ".4g", "null" where there is no number


def _obstacles(ax: plt.Axes) -> list[Artist]:
    """What point labels must not cover: the texts already drawn and the legend."""
    legend = ax.get_legend()
    return [*ax.texts, *([legend] if legend is not None else [])]


def accuracy_vs_energy(rd: ReportData) -> Figure:
    h = rd.headline()
    fig, ax = plt.subplots(figsize=(7.5, 5))
    pts = []
    front_set = set(rd.doc.get("pareto") or [])
    for cfg, r in h.iterrows():
        x, y = r["j_per_token_median"], r["accuracy"]
        if not (_finite(x) and _finite(y)):
            continue
        xerr = [[x - r["j_per_token_ci_lo"]], [r["j_per_token_ci_hi"] - x]] if _finite(
            r["j_per_token_ci_lo"]) else None
        yerr = [[y - r["accuracy_ci_lo"]], [r["accuracy_ci_hi"] - y]] if _finite(
            r["accuracy_ci_lo"]) else None
        on_front = cfg in front_set
        ax.errorbar(x, y, xerr=xerr, yerr=yerr, fmt="s" if on_front else "o", capsize=3,
                    color=FRONT_COLOR if on_front else VALID_COLOR, zorder=3)
        pts.append((x, y, str(cfg), on_front))
    front = sorted((p for p in pts if p[3]), key=lambda p: p[0])
    if len(front) >= 1:
        ax.step([p[0] for p in front], [p[1] for p in front], where="post", color=FRONT_COLOR,
                lw=1.2, ls="--", label="Pareto frontier (valid runs; squares)")
    acc = h["accuracy"]
    inv = _run_points(rd)
    inv = inv[~inv["valid"]] if len(inv) else inv
    inv_pts: list[tuple[float, float, str]] = []
    for _, r in inv.iterrows():
        y = acc.get(r["config"], np.nan)
        if _finite(r["j_per_token"]) and _finite(y):
            ax.plot(r["j_per_token"], y, "o", mfc="none", color=INVALID_COLOR, zorder=2,
                    label=None if inv_pts else "invalid run (shown, not in medians)")
            inv_pts.append((float(r["j_per_token"]), float(y), f"{r['config']} (invalid)"))
    ax.set_xlabel(f"{rd.basis} J per generated token (whole request)")
    ax.set_ylabel("accuracy (composite)")
    ax.set_title("Accuracy vs energy per token")
    if front or inv_pts:
        ax.legend(fontsize=8, loc="best")
    if not pts and not inv_pts:
        ax.text(0.5, 0.5, "no configuration has both a valid J/token and an accuracy",
                ha="center", va="center", transform=ax.transAxes)
    ax.grid(alpha=0.3)
    _stamp(ax, rd)
    place_labels(ax, [PointLabel(x, y, c) for x, y, c, _ in pts]
                 + [PointLabel(x, y, c, 6, INVALID_COLOR) for x, y, c in inv_pts],
                 obstacles=_obstacles(ax))
    cap = _caption(rd, "Medians over the repeats of valid runs with their intervals on both "
                   "axes; vermillion squares = on the Pareto frontier (no other configuration "
                   "is both cheaper and more accurate); hollow grey = an invalid run's own "
                   "measured figure.")
    alt = (f"Scatter plot of composite accuracy (vertical) against {rd.basis} J per generated "
           f"token (horizontal) for {len(pts)} configuration(s) with valid runs. "
           + ("On the Pareto frontier, cheapest first: " + "; ".join(
               f"{c} at {_g(x)} J/token, accuracy {_g(y)}" for x, y, c, _ in front) + ". "
               if front else "No Pareto frontier. ")
           + ("Off the frontier: " + "; ".join(f"{c} at {_g(x)} J/token, accuracy {_g(y)}"
                                               for x, y, c, f in pts if not f) + ". "
              if any(not f for *_, f in pts) else "")
           + (f"{len(inv_pts)} invalid run(s) drawn hollow. " if inv_pts else "")
           + f"Power: {rd.labels.tag()}.")
    return Figure("accuracy_vs_energy", "Accuracy vs J per generated token", cap, fig, alt)


def epi_sorted(rd: ReportData) -> Figure:
    """EPI with its interval per configuration, best first, on a log axis when every value
    and bound is positive (a ratio's interval is multiplicatively asymmetric; on a linear
    axis one wide upper bound squashes every other point), else on a linear one."""
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
    inv_x: dict[str, list[float]] = {}
    for cfg, *_ in rows:
        for _, r in inv[inv["config"] == cfg].iterrows():
            a = acc.get(cfg, np.nan)
            if _finite(r["j_per_token"]) and _finite(a) and a > 0:
                inv_x.setdefault(str(cfg), []).append(float(r["j_per_token"]) / float(a))
    values = [float(v) for _, e, lo, hi, _ in rows for v in (e, lo, hi) if _finite(v)]
    values += [v for vs in inv_x.values() for v in vs]
    log = bool(values) and min(values) > 0
    shown_inv = False
    for y, (cfg, e, lo, hi, why) in zip(ys, rows, strict=True):
        if _finite(e):
            ax.plot([e], [y], "o", color=VALID_COLOR, ms=7, zorder=3)
            if _finite(lo) and _finite(hi):
                ax.errorbar(e, y, xerr=[[e - lo], [hi - e]], fmt="none", color="k", capsize=3)
                ax.annotate(f"{_g(e)} [{_g(lo)}, {_g(hi)}]", (e, y), textcoords="offset points",
                            xytext=(0, 7), ha="center", va="bottom", fontsize=7)
        else:
            ax.text(0.01, float(y), f"null: {str(why)[:70]}", va="center", fontsize=7,
                    color=MODELLED_COLOR,
                    transform=blended_transform_factory(ax.transAxes, ax.transData))
        for v in inv_x.get(str(cfg), []):
            ax.plot(v, y, "o", mfc="none", color=INVALID_COLOR,
                    label=None if shown_inv else "invalid run (shown, not in medians)")
            shown_inv = True
    if log:
        ax.set_xscale("log")
        lo_v, hi_v = min(values), max(values)
        ax.set_xlim(lo_v / 1.5, hi_v * 1.5)
        plain = FuncFormatter(lambda v, _pos: f"{v:g}")
        ax.xaxis.set_major_formatter(plain)
        if hi_v / lo_v < 30:  # few decades: label the minor ticks too
            ax.xaxis.set_minor_formatter(plain)
            ax.tick_params(axis="x", which="minor", labelsize=7)
    ax.set_yticks(ys, [r[0] for r in rows], fontsize=8)
    ax.set_ylim(len(rows) - 0.4, -0.8)
    ax.set_xlabel(f"EPI = {rd.basis} J per generated token / accuracy"
                  + (" (log scale)" if log else "") + "; lower is better")
    ax.set_title("Energy per intelligence, sorted")
    if shown_inv:
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(0.0, -0.22), frameon=False)
    ax.grid(axis="x", alpha=0.3, which="both" if log else "major")
    _stamp(ax, rd)
    cap = _caption(rd, "EPI per configuration, best first, with its interval (the J/token "
                   "interval divided by the accuracy interval) written above each point; "
                   "null EPIs say why.",
                   "log horizontal axis, so a wide interval leaves the others readable"
                   if log else "linear axis (a value or bound is not positive)")
    finite = [(c, e, lo, hi) for c, e, lo, hi, _ in rows if _finite(e)]
    alt = (f"Dot plot of EPI per configuration, best first{', on a log axis' if log else ''}: "
           + "; ".join(f"{c} {_g(e)} [{_g(lo)}, {_g(hi)}]" for c, e, lo, hi in finite)
           + ". " + "".join(f"{c}: null ({w[:60]}). " for c, e, _, _, w in rows
                            if not _finite(e))
           + f"Power: {rd.labels.tag()}.")
    return Figure("epi_sorted", "EPI per configuration", cap, fig, alt)


def _phase_means(rd: ReportData) -> pd.DataFrame:
    """Per configuration, per request, J: prefill, decode and the idle share (idle power ×
    request time), from the analysis' breakdown (valid runs; it stores mJ); where that is
    null, from the configuration's invalid runs (flagged)."""
    bd = pd.DataFrame(rd.doc.get("phase_breakdown") or [])
    pr = rd.per_run
    rows = []
    idle_w: dict[str, list[float]] = {}
    for run in rd.doc["runs"]:
        p = (run.get("idle_power_w") or {}).get("all")
        if p is not None:
            idle_w.setdefault(run["config"], []).append(p)
    for cfg in rd.configs:
        b = bd[bd["config"] == cfg].iloc[0] if len(bd) and (bd["config"] == cfg).any() else None
        if b is not None and _finite(b["prefill_mj"]) and _finite(b["decode_mj"]):
            rows.append({"config": cfg, "prefill": b["prefill_mj"] / 1e3,
                         "decode": b["decode_mj"] / 1e3, "idle": b["idle_mj"] / 1e3,
                         "from_invalid": False})
            continue
        vals = {}
        for phase in ("prefill", "decode", "request"):
            sel = pr[(pr["config"] == cfg) & (pr["phase"] == phase)] if len(pr) else pr
            e = (sel["energy_j"] / sel["n_windows_measured"].where(sel["n_windows_measured"] > 0)
                 ) if len(sel) else pd.Series(dtype=float)
            d = sel["duration_s"] / sel["n_windows"] if len(sel) else pd.Series(dtype=float)
            vals[phase] = (float(np.nanmedian(e)) if e.notna().any() else np.nan,
                           float(np.nanmedian(d)) if d.notna().any() else np.nan)
        pw = float(np.median(idle_w[cfg])) if cfg in idle_w else np.nan
        rows.append({"config": cfg, "prefill": vals["prefill"][0], "decode": vals["decode"][0],
                     "idle": pw * vals["request"][1], "from_invalid": True})
    return pd.DataFrame(rows)


def phase_energy(rd: ReportData) -> Figure:
    d = _phase_means(rd)
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    x = np.arange(len(d))
    pre = d["prefill"].fillna(0).to_numpy() if len(d) else np.zeros(0)
    dec = d["decode"].fillna(0).to_numpy() if len(d) else np.zeros(0)
    alpha = np.where(d["from_invalid"], 0.35, 0.9) if len(d) else np.zeros(0)
    for i in range(len(d)):
        ax.bar(x[i], pre[i], color=PHASE_COLORS["prefill"], alpha=alpha[i],
               label="prefill" if i == 0 else None)
        ax.bar(x[i], dec[i], bottom=pre[i], color=PHASE_COLORS["decode"], alpha=alpha[i],
               label="decode" if i == 0 else None)
        idle = d["idle"].iloc[i]
        if _finite(idle):
            ax.bar(x[i], idle, fill=False, hatch="//", edgecolor="#555555", lw=0.6,
                   label="idle share (idle power × request time)" if i == 0 else None)
        if d["from_invalid"].iloc[i]:
            ax.text(x[i], pre[i] + dec[i], "invalid runs", ha="center", va="bottom",
                    fontsize=7, color=MODELLED_COLOR)
    splits = {sp.config: sp for sp in split_compare.read(rd.analysis_dir)[0]}
    names = [f"{c}\n(split: {splits[c].prefill} → {splits[c].decode})" if c in splits else c
             for c in d["config"]] if len(d) else []
    if len(d):
        ax.set_xticks(x, names, rotation=30, ha="right", fontsize=8)
    ax.set_ylabel("energy per request, J (gross)")
    ax.set_title("Per-phase energy per request")
    if len(d):
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    ax.grid(axis="y", alpha=0.3)
    _stamp(ax, rd, basis="gross")  # the stacked phases are gross, whatever the headline's
    cap = _caption(rd, "Median energy per request (J) split into prefill and decode (stacked); "
                   "the hatched bar is the part the idle machine would have drawn anyway "
                   "(idle baseline power × request duration). Faded bars marked 'invalid "
                   "runs' come from invalid runs only.",
                   "always gross energy; no intervals (medians per request)", basis="gross")
    alt = ("Stacked bar chart of energy per request in joules, prefill below decode, with the "
           "idle share hatched: " + "; ".join(
               f"{r['config']}"
               + (f" (split: prefill on {splits[r['config']].prefill}, decode on "
                  f"{splits[r['config']].decode})" if r["config"] in splits else "")
               + f": prefill {_g(r['prefill'])} J, decode {_g(r['decode'])} J, "
               f"idle share {_g(r['idle'])} J" + (" (invalid runs only)" if r["from_invalid"]
                                                  else "")
               for r in d.to_dict("records")) + f". Power: {rd.labels.tag()}.")
    return Figure("phase_energy", "Per-phase energy (prefill / decode / idle share)", cap, fig,
                  alt)


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
        req = w[(w["run_id"] == run["run_id"]) & (w["kind"] == WindowKind.REQUEST)
                & (w["scope"] == SCOPE_ALL)
                & w["t0_meter_ns"].notna()]
        if req.empty:
            continue
        req = req.sort_values("duration_s")
        row = req.iloc[len(req) // 2]
        parts = w[(w["run_id"] == run["run_id"]) & (w["scope"] == SCOPE_ALL)
                  & (w["request_id"] == row["request_id"])]
        return run, parts
    return None


def power_trace(rd: ReportData) -> Figure:
    fig, ax = plt.subplots(figsize=(8, 4.2))
    picked = _pick_request(rd)
    title = "One request's power trace"
    if picked is None:
        ax.text(0.5, 0.5, "no request with meter times", ha="center", transform=ax.transAxes)
        return Figure("power_trace", title, _caption(rd, "No request could be placed on the "
                      "meter clock."), fig, "Empty plot: no request could be placed on the "
                      "meter clock.")
    run, parts = picked
    from host.analysis.traces import read_trace

    req = parts[parts["kind"] == WindowKind.REQUEST].iloc[0]
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
            lab = f"{kind} window" + (f" ({e:.3g} J)" if _finite(e) else " (null)")
            ax.axvspan(a, b, color=PHASE_COLORS[kind], alpha=0.25, label=lab)
    tok = _token_times(Path(run["path"]), int(req["request_id"]))
    for i, t in enumerate(tok):
        ax.axvline((t + offset - t0) / 1e9, color=TOKEN_COLOR, lw=0.6, alpha=0.7,
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
    n_samp = int(parts["n_samples"].fillna(0).sum())
    cap = _caption(rd, f"Run {run['run_id'][:12]} ({run['config']}), the request of median "
                   "duration: the meter's readings around it, the prefill and decode windows "
                   "that were integrated (shaded) and every generated token's time (light "
                   "blue lines, mapped to the meter clock by the run's clock offset).",
                   f"one request, not a median: {len(sweep)} sweeps shown, {n_samp} samples "
                   "inside its windows; no intervals")
    energies = {k: parts[parts["kind"] == k]["energy_j"] for k in ("prefill", "decode")}
    alt = (f"Line plot of summed meter power in watts against time for one request of "
           f"{run['config']} ({'valid' if valid else 'invalid'} run): {len(sweep)} readings "
           f"from {_g(np.min(sweep['p']) if len(sweep) else np.nan)} to "
           f"{_g(np.max(sweep['p']) if len(sweep) else np.nan)} W; "
           + "; ".join(f"{k} window {_g(v.iloc[0]) if len(v) else 'null'} J"
                       for k, v in energies.items())
           + f"; {len(tok)} token times marked. Power: {rd.labels.tag()}.")
    return Figure("power_trace", title, cap, fig, alt)


def _token_times(run_dir: Path, request_id: int) -> list[int]:
    """The request's token times (t_mono_ns) from the run's events.csv, read by the one
    token-log reader; none when the file is gone or refused (the figure then shows none)."""
    try:
        ev, _ = parse_events(run_dir / "events.csv")
    except UserError:
        return []
    rows = zip(ev["event"], ev["request_id"], ev["t_mono_ns"], strict=True)
    return [t for kind, rid, t in rows if kind == TokenEvent.TOKEN and rid == request_id]


def layer_groups(rd: ReportData) -> Figure:
    """Left: J/token per node (each node's own meter channels); right: differential."""
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 4.2))
    r = rd.results
    nodes = headline_rows(r, rd.basis, nodes=True)
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
                a2.text(0.01, yi, f"null: {why}", fontsize=7, va="center", color=MODELLED_COLOR,
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
    cap = _caption(rd, "Left: J per generated token on each node's own meter channels (the "
                   "layers it holds). Right: mean difference B − A of J per generated token "
                   "between two maps that differ only in one group's type (paired-t interval over "
                   "rounds: the campaign rounds both have, else rounds interleaved in time; "
                   "else Welch; valid runs only).",
                   "intervals: " + ("; ".join(ci) or "none"))
    node_txt = "; ".join(f"{c} node {sc}: {_g(v)} J/token" for c, sc, v in zip(
        nodes["config"], nodes["scope"], nodes["j_per_token_median"], strict=True))
    diff_txt = "; ".join(
        f"{row['group']} {str(row['type_a']).split(' ')[0]}→{str(row['type_b']).split(' ')[0]}"
        f" ({row['config_a']} vs {row['config_b']}): Δ {_g(row['delta_j_per_token'])} "
        f"[{_g(row.get('ci_lo'))}, {_g(row.get('ci_hi'))}] J/token"
        for row in diff.to_dict("records"))
    alt = ("Two bar charts. Left, J per generated token per node: " + (node_txt or "none")
           + ". Right, differences between maps differing in one layer group: "
           + (diff_txt or "none (no two maps differ in exactly one group)")
           + f". Power: {rd.labels.tag()}.")
    return Figure("layer_groups", "Per-layer-group energy", cap, fig, alt)


def _diff_interval(row: dict) -> str:
    """'95 % paired by campaign round' / '95 % paired by round' / '95 % Welch (unpaired),
    n=3/3' for one differential row."""
    cov = row.get("ci_coverage")
    if not _finite(cov):
        return f"no interval ({row.get('reason') or 'too few repeats'})"
    method = str(row.get("ci_method") or "")
    kind = ("Welch (unpaired)" if not method.startswith("paired") else pairing_label(method))
    n_a, n_b = row.get("n_a"), row.get("n_b")
    n = (f", n={int(number(n_a))}/{int(number(n_b))} repeats"
         if _finite(n_a) and _finite(n_b) else "")
    return f"{pct(number(cov))} {kind}{n}"


def energy_vs_size(rd: ReportData) -> Figure:
    h = rd.headline()
    m = rd.models
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 4))
    pr = _run_points(rd)
    labels: dict[int, list[PointLabel]] = {0: [], 1: []}
    for k, (ax, col, xl, scale) in enumerate(
            ((a1, "bits_per_weight", "bits per weight (whole file)", 1.0),
             (a2, "size_bytes", "file size, MB", 1e-6))):
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
                labels[k].append(PointLabel(x, float(y), str(cfg), 7))
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
    for k, ax in enumerate((a1, a2)):
        place_labels(ax, labels[k], obstacles=list(ax.texts))
    cap = _caption(rd, "Median J per generated token (valid runs, with interval) against the "
                   "model file's bits per weight and size, read from the quantization "
                   "manifests.")
    facts = [f"{c}: {_g(m.loc[c, 'bits_per_weight'])} bits/weight, "
             f"{_g(pd.to_numeric(m.loc[c, 'size_bytes'], errors='coerce') / 1e6)} MB, "
             f"{_g(h.loc[c, 'j_per_token_median'])} J/token"
             for c in h.index if c in m.index]
    alt = ("Two scatter plots of median J per generated token against bits per weight (left) "
           "and file size in MB (right): " + ("; ".join(facts) or "no model facts") + ". "
           f"Power: {rd.labels.tag()}.")
    return Figure("energy_vs_size", "J/token vs bits per weight and file size", cap, fig, alt)


ALL = (accuracy_vs_energy, epi_sorted, phase_energy, power_trace, layer_groups, energy_vs_size)


def build_all(rd: ReportData, extra: tuple[Callable[[ReportData], Figure], ...] = ()
              ) -> list[Figure]:
    """Every figure of ALL, then `extra` (figures drawn in their own modules with this one's
    parts, passed in by the report builder so that no module imports the other back)."""
    with plt.rc_context():
        plt.rcParams["axes.prop_cycle"] = PALETTE_CYCLE
        plt.rcParams["text.parse_math"] = False
        return [f(rd) for f in (*ALL, *extra)]
