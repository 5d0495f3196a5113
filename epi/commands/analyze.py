"""`epi analyze RUN_DIR... --trace TRACE_DIR`: joules per token, EPI and verdicts.

A thin layer over host.analysis: parse flags, run the analysis, write the results (all files
built in memory first, then written to a temporary directory and renamed into place, so an
error never leaves half an output), and print the three summary tables.
"""

from __future__ import annotations

import json
import math
import os
import shutil
from pathlib import Path
from typing import Any

import click
import numpy as np
import pandas as pd

from epi.commands.params import (
    BoundedInt,
    FiniteFloat,
    check_output_dir,
)
from epi.core.errors import UserError
from epi.core.text import format_table
from host.analysis import components
from host.analysis import pipeline as analysis_mod
from host.analysis.intervals import format_interval, pct
from host.analysis.model import Analysis, Options

RESULT_FORMAT = "epi-analysis"
RESULT_VERSION = 1


def parse_channels(spec: str | None) -> dict[str, list[int]] | None:
    """`node=ch[+ch],node=ch` → {node: [channels]}."""
    if not spec:
        return None
    out: dict[str, list[int]] = {}
    for item in spec.split(","):
        node, sep, chans = item.partition("=")
        if not sep or not node.strip() or not chans.strip():
            raise UserError(f"--channels: {item!r} is not NODE=CHANNEL[+CHANNEL]")
        try:
            numbers = [int(c) for c in chans.split("+")]
        except ValueError:
            raise UserError(f"--channels: {item!r}: channels must be integers") from None
        if any(not 0 <= c <= 255 for c in numbers):
            raise UserError(f"--channels: {item!r}: channels must be in [0, 255]")
        out.setdefault(node.strip(), []).extend(numbers)
    return out


def parse_accuracy_values(items: tuple[str, ...]) -> dict[str, float]:
    out: dict[str, float] = {}
    for item in items:
        cfg, sep, val = item.rpartition("=")
        try:
            out[cfg] = float(val)
        except ValueError:
            cfg = ""
        if not sep or not cfg:
            raise UserError(f"--accuracy-value: {item!r} is not CONFIG=ACCURACY (0..1)")
        if not 0.0 < out[cfg] <= 1.0:  # NaN fails too
            raise UserError(f"--accuracy-value: {item!r}: accuracy must be in (0, 1]")
    return out


# --------------------------------------------------------------------------- output files
def _clean(obj: Any) -> Any:
    """JSON-safe: NaN → null, numpy scalars → Python."""
    if isinstance(obj, dict):
        return {str(k): _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    if isinstance(obj, (np.integer,)):
        return int(obj)
    if isinstance(obj, (np.floating, float)):
        return None if not math.isfinite(float(obj)) else float(obj)
    if isinstance(obj, np.bool_):
        return bool(obj)
    if obj is pd.NA:
        return None
    if isinstance(obj, Path):
        return str(obj)
    return obj


def _records(df: pd.DataFrame) -> list[dict]:
    return [_clean(r) for r in df.astype(object).where(df.notna(), None).to_dict("records")]


WINDOW_COLUMNS = [
    "run_id", "config", "kind", "request_id", "repeat", "prompt_id", "scope", "power_source",
    "t0_local_ns",
    "t1_local_ns", "t0_meter_ns", "t1_meter_ns", "duration_s", "n_prompt_tokens",
    "n_generated_tokens", "n_samples", "energy_j", "energy_method", "energy_net_j",
    "energy_trapezoid_j", "energy_counter_j", "counter_minus_trapezoid_j",
    "counter_resolution_j", "power_w", "lag_correction_ms", "request_method", "reason_code",
    "reason",
    "counter_reason", "net_reason",
]
RESULT_COLUMNS = [
    "config", "scope", "layers", "phase", "unit", "basis", "figure", "power_source", "n_runs",
    "n_runs_valid", "n_repeats", "j_per_token_median", "j_per_token_cv", "j_per_token_ci_lo",
    "j_per_token_ci_hi", "ci_method", "ci_coverage", "ci_level_met", "ci_note",
    "ci_level_wanted", "j_per_token_mean", "j_per_token_mean_ci_lo", "j_per_token_mean_ci_hi",
    "energy_per_request_j_median",
    "duration_per_request_s_median", "accuracy", "accuracy_ci_lo", "accuracy_ci_hi",
    "accuracy_basis", "epi", "epi_ci_lo", "epi_ci_hi", "epi_ci_coverage", "epi_energy_basis",
    "epi_reason",
    "perplexity", "pareto", "prefill_regression_j_per_token", "prefill_regression_ci_lo",
    "prefill_regression_ci_hi", "prefill_regression_method", "lag_correction",
    "energy_method", "edge_model", "reason",
]


def build_outputs(a: Analysis, argv: dict[str, Any]) -> dict[str, bytes]:
    """File name → content of every output (nothing is written here)."""
    runs = []
    for i in a.runs:
        runs.append({
            "run_id": i.run.run_id, "path": str(i.run.path), "config": i.config,
            "status": i.run.status, "model": i.run.model,
            "placement": [{"node": p.node, "layers": list(p.layers),
                           "channels": i.node_channels.get(p.node)} for p in i.run.placement],
            "clock": {"basis": i.clock.basis, "note": i.clock.note,
                      "uncertainty_ns": i.offset_uncertainty_ns,
                      "drift_ppm": i.clock.drift_ppm,
                      "sync_points": len(i.clock.sync_local_ns)},
            "meter_boot_id": i.boot_id, "span_meter_ns": i.span_meter_ns,
            "idle_power_w": i.idle_power_w, "idle_reason": i.idle_reason,
            "saturated_readings": i.saturated,
            "verdicts": _records(a.verdicts[a.verdicts["run_id"] == i.run.run_id]),
        })
    doc = {
        "format": RESULT_FORMAT, "format_version": RESULT_VERSION,
        "inputs": argv,
        "trace": {"path": str(a.trace.path), "segments": len(a.trace.segments),
                  "emulated": a.trace.emulated, "power_models": a.trace.power_models,
                  "boot_ids": a.trace.boot_ids},
        "options": {k: (str(v) if isinstance(v, Path) else v)
                    for k, v in vars(a.options).items()},
        "runs": runs,
        "results": _records(a.results.reindex(columns=RESULT_COLUMNS)),
        "power_sources": {str(k): v for k, v in a.power_sources.items()},
        "savings": _records(a.savings),
        "comparisons": _records(a.comparisons),
        "prefill_regression": _records(a.prefill_regression),
        "load_lag": _records(a.lag),
        "phase_breakdown": _records(a.breakdown),
        "pareto": a.pareto,
        "perplexity_matched_pairs": a.pairs,
        "layer_groups": {
            "measured": _records(a.results[(a.results["scope"] != "all")].reindex(
                columns=RESULT_COLUMNS)),
            "differential": a.differential,
            "time_share_estimate": a.time_share,
        },
        "notes": a.notes,
        "components": components.records(a),  # software power sources (docs/sources.md)
    }
    out = {
        "results.json": (json.dumps(_clean(doc), indent=1) + "\n").encode(),
        "results.csv": a.results.reindex(columns=RESULT_COLUMNS).to_csv(index=False).encode(),
        "comparisons.csv": a.comparisons.to_csv(index=False).encode(),
        "prefill_regression.csv": a.prefill_regression.to_csv(index=False).encode(),
        "lag.csv": a.lag.to_csv(index=False).encode(),
        "savings.csv": a.savings.to_csv(index=False).encode(),
        "runs.csv": a.verdicts.to_csv(index=False).encode(),
        "windows.csv": a.windows.reindex(columns=WINDOW_COLUMNS).to_csv(index=False).encode(),
        "repeats.csv": a.repeats.to_csv(index=False).encode(),
        **components.files(a),
    }
    return out


def write_atomically(out_dir: Path, files: dict[str, bytes]) -> None:
    """Write into a temporary sibling directory, then rename into place."""
    out_dir = Path(out_dir)
    if out_dir.exists() and not out_dir.is_dir():
        raise UserError(f"--out: {out_dir} exists and is not a directory")
    parent = out_dir.parent if str(out_dir.parent) else Path(".")
    try:
        parent.mkdir(parents=True, exist_ok=True)
        tmp = parent / f".{out_dir.name}.tmp-{os.getpid()}"
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir()
        for name, data in files.items():
            with open(tmp / name, "wb") as fh:
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
        if not out_dir.exists():
            os.rename(tmp, out_dir)
            return
        for name in files:
            os.replace(tmp / name, out_dir / name)
        tmp.rmdir()
    except OSError as exc:
        raise UserError(f"--out: cannot write {out_dir} ({exc.strerror})") from None


# --------------------------------------------------------------------------- tables
def _num(x: float, fmt: str = ".4g") -> str:
    return "null" if x is None or not np.isfinite(x) else format(x, fmt)


def _pct(x: float) -> str:
    return pct(x)


def _ci(med: float, lo: float, hi: float, coverage: float | None = None,
        at_least: bool = False, n: object = None) -> str:
    """"value [lo, hi] 75 % n=3" (host.analysis.intervals.format_interval)."""
    return format_interval(med, lo, hi, coverage, at_least=at_least, n=n)


def modelled_banner(a: Analysis) -> str | None:
    """One line saying the power is modelled, when any figure's power is (None otherwise)."""
    labels = sorted({v for v in a.power_sources.values() if "modelled" in v})
    if not labels:
        return None
    return ("POWER IS MODELLED, NOT MEASURED on "
            + ", ".join(f"channel {c}" for c, v in sorted(a.power_sources.items())
                        if "modelled" in v)
            + f" ({'; '.join(labels)}): every J, EPI and saving below that uses these channels "
            "is a model's figure (column 'power')")


def _short_method(method: str) -> str:
    if not isinstance(method, str) or not method:
        return "-"
    return "paired" if method.startswith("paired") else "unpaired"


def summary_text(a: Analysis) -> str:
    res = a.results
    basis = a.options.energy_basis
    lvl = _pct(a.options.ci_level)

    def fig(cfg: str, phase: str, unit: str, b: str, scope: str = "all") -> pd.Series | None:
        r = res[(res["config"] == cfg) & (res["scope"] == scope) & (res["phase"] == phase)
                & (res["unit"] == unit) & (res["basis"] == b)]
        return r.iloc[0] if len(r) else None

    reg = a.prefill_regression
    rows = []
    used_regression = False
    for cfg in dict.fromkeys(i.config for i in a.runs):
        g = fig(cfg, "request", "generated", "gross")
        n = fig(cfg, "request", "generated", "net")
        t = fig(cfg, "request", "total", "gross")
        p = fig(cfg, "prefill", "prompt", "gross")
        d = fig(cfg, "decode", "generated", "gross")
        h = fig(cfg, "request", "generated", basis)
        pre = _num(p["j_per_token_median"])
        if not np.isfinite(p["j_per_token_median"]) and len(reg) and "config" in reg:
            r = reg[reg["config"] == cfg]
            if len(r) and np.isfinite(r["j_per_prompt_token"].iloc[0]):
                pre = "~" + _num(r["j_per_prompt_token"].iloc[0]) + " (regr.)"
                used_regression = True
        rows.append([
            cfg, g["power_source"] or "?", f"{g['n_runs_valid']}/{g['n_runs']}",
            _num(g["energy_per_request_j_median"]),
            _ci(g["j_per_token_median"], g["j_per_token_ci_lo"], g["j_per_token_ci_hi"],
                g["ci_coverage"], n=g["n_repeats"]),
            _num(n["j_per_token_median"]), _num(t["j_per_token_median"]),
            pre, _num(d["j_per_token_median"]),
            _num(g["j_per_token_cv"] * 100, ".2f"),
            _num(h["accuracy"], ".3f"),
            _ci(h["epi"], h["epi_ci_lo"], h["epi_ci_hi"], h["epi_ci_coverage"], at_least=True,
                n=h["n_repeats"]),
        ])
    out = []
    banner = modelled_banner(a)
    if banner:
        out.append(banner)
    out += [f"Per configuration — scope: all channels of the run's nodes; median over repeats "
            "[order-statistic interval of the median, with the coverage it achieves]; energy: "
            f"{a.options.energy_method}"
            + (" (trapezoid where the counter does not cover a window)"
               if a.options.energy_method == "counter" else "")
            + f"; edge model: {a.options.edge}",
            format_table(["config", "power", "valid runs", "J/request", "J/gen tok (gross)",
                          "J/gen tok (net)", "J/total tok", "prefill J/prompt tok",
                          "decode J/gen tok", "CV %", "accuracy", f"EPI ({basis})"], rows)]
    short = res[(res["scope"] == "all") & (res["ci_note"].fillna("") != "")]
    for n_rep in sorted({int(x) for x in short["n_repeats"]}):
        note = short[short["n_repeats"] == n_rep]["ci_note"].iloc[0]
        out.append(f"intervals: {note} — shown with that coverage, not as {lvl}")
    if "epi_ci_coverage" in res and np.isfinite(res["epi_ci_coverage"].astype(float)).any():
        out.append("EPI interval: J/token interval ÷ accuracy interval; coverage at least the "
                   "sum of both coverages − 1 (Bonferroni)")
    if used_regression:
        out.append("prefill J/prompt tok marked (regr.): estimate by regression of request "
                   "energy on prompt and generated tokens across requests (section below)")
    out += components.summary_lines(a)
    accs = {r["accuracy_basis"] for _, r in res.iterrows() if r["accuracy_basis"]}
    if accs:
        out.append("accuracy: " + " | ".join(sorted(accs)))
    out.append(f"EPI = {basis} J per generated token (whole request) / accuracy")
    if len(a.savings):
        b = a.savings["baseline"].iloc[0]
        srows = [[r["config"], _num(r["j_per_token"]),
                  _ci(r["energy_saving_pct"], r["energy_saving_pct_ci_lo"],
                      r["energy_saving_pct_ci_hi"], r["energy_ci_coverage"],
                      n=r["n_pairs"] or None),
                  _short_method(r["energy_ci_method"]), _num(r["latency_s"], ".3f"),
                  _num(r["latency_saving_pct"], "+.1f"),
                  _ci(r["accuracy_delta"], r["accuracy_delta_ci_lo"],
                      r["accuracy_delta_ci_hi"], 0.95)]
                 for _, r in a.savings.iterrows() if r["config"] != b]
        out += ["", f"Savings vs baseline {b} ({basis} J per generated token; positive = "
                "saves; latency = median request duration; Δ accuracy paired over items)",
                format_table(["config", "J/gen tok", "energy saving %", "pairing", "latency s",
                              "latency saving %", "Δ accuracy"], srows)]
    else:
        out += ["", "Savings vs baseline: give --baseline CONFIG"]
    if len(a.comparisons):
        crows = [[r["comparison"], r["config_a"], r["config_b"],
                  _ci(r["energy_delta_j_per_token"], r["energy_delta_ci_lo"],
                      r["energy_delta_ci_hi"], r["energy_ci_coverage"],
                      n=r["n_pairs"] or None),
                  _short_method(r["energy_ci_method"]), r["verdict"]]
                 for _, r in a.comparisons.iterrows()]
        out += ["", "Pairwise differences (B − A, J per generated token; paired by round when "
                "repeats are interleaved, else Welch; 'cannot be told apart' = interval holds 0)",
                format_table(["comparison", "A", "B", "Δ J/gen tok", "pairing", "verdict"],
                             crows)]
    if len(reg):
        rrows = [[r["config"], r["power_source"], int(r["n_requests"]),
                  f"{_num(r['prompt_tokens_min'], '.0f')}–{_num(r['prompt_tokens_max'], '.0f')}"
                  if r["n_requests"] else "-",
                  _ci(r["j_per_prompt_token"], r["ci_lo"], r["ci_hi"], 0.95)
                  if np.isfinite(r["j_per_prompt_token"]) else f"null ({r['reason']})",
                  _num(r["direct_j_per_prompt_token"]),
                  {True: "yes", False: "NO"}.get(r["agrees_with_direct"], "-")]
                 for _, r in reg.iterrows()]
        out += ["", "Prefill J per prompt token, estimated by regression across requests "
                "(request energy on prompt and generated tokens; an estimate, not a direct "
                "measurement; direct = the prefill windows' own figure where they hold ≥ 2 "
                "samples)",
                format_table(["config", "power", "requests", "prompt tokens",
                              "J/prompt tok (regression)", "direct", "direct inside interval"],
                             rrows)]
    if len(a.lag):
        lrows = [[r["config"], r["run_id"][:12], f"ch{r['channel']}",
                  f"{r['lag_ms']:+.2f} [{r['lag_ci_lo_ms']:+.2f}, {r['lag_ci_hi_ms']:+.2f}]"
                  if np.isfinite(r["lag_ms"]) else "null",
                  "yes" if r["resolved"] else "no",
                  f"{r['correction_applied_ms']:+.2f}" if r["correction_applied_ms"] else "-",
                  r["reason"] or "-"] for _, r in a.lag.iterrows()]
        out += ["", "Load lag: power edges after the token stamps, ms, from the trace "
                "(approx. 95 % profile interval; resolved = interval excludes 0; corrected "
                "only with --lag auto)",
                format_table(["config", "run", "channel", "lag ms", "resolved",
                              "corrected ms", "note"], lrows)]
    brows = [[r["config"], _num(r["prefill_mj"], ".1f"), _num(r["decode_mj"], ".1f"),
              _num(r["idle_mj"], ".1f"), _num(r["request_mj"], ".1f"),
              _num(r["net_request_mj"], ".1f")] for _, r in a.breakdown.iterrows()]
    out += ["", "Phase breakdown per request, mJ (gross; idle = idle baseline power × request "
            "duration, the part of the request's energy the idle machine would draw anyway)",
            format_table(["config", "prefill mJ", "decode mJ", "idle mJ", "request mJ",
                          "net request mJ"], brows)]
    nodes = res[(res["scope"] != "all") & (res["phase"] == "request")
                & (res["unit"] == "generated") & (res["basis"] == basis)]
    if nodes["scope"].nunique() > 1 or len(nodes) > len(res["config"].unique()):
        nrows = [[r["config"], r["scope"], r["layers"], r["power_source"],
                  _ci(r["j_per_token_median"], r["j_per_token_ci_lo"], r["j_per_token_ci_hi"],
                      r["ci_coverage"], n=r["n_repeats"])]
                 for _, r in nodes.iterrows()]
        out += ["", f"Per node (layer groups on each node's own meter channels; "
                f"{basis} J per generated token)",
                format_table(["config", "node", "layers", "power", "J/gen tok"], nrows)]
    bad = a.verdicts[~a.verdicts["valid"]]
    out.append("")
    if bad.empty:
        out.append("Verdicts: every run and phase valid")
    else:
        out.append("Verdicts (invalid runs are reported, not averaged in):")
        for _, r in bad.iterrows():
            out.append(f"  {r['config']} (run {r['run_id'][:12]}) {r['phase']}: "
                       f"INVALID — {r['reasons']}")
    for note in a.notes:
        out.append(f"note: {note}")
    return "\n".join(out)


FRACTION = FiniteFloat(0.0, 1.0, lo_open=True)  # a threshold fraction: (0, 1]


@click.command("analyze")
@click.argument("run_dirs", nargs=-1, required=True,
                type=click.Path(path_type=Path, file_okay=False))
@click.option("--trace", "trace_dir", required=True, type=click.Path(path_type=Path),
              help="Meter trace directory (epi meter run --out).")
@click.option("--accuracy", "accuracy_file", type=click.Path(path_type=Path),
              help="Accuracy results file (epi accuracy), joined on model sha256.")
@click.option("--accuracy-value", multiple=True, metavar="CONFIG=ACC",
              help="Accuracy in (0, 1] for a configuration, given by hand (repeatable).")
@click.option("--accuracy-metric", default="composite", show_default=True,
              help="'composite' or a benchmark name from the accuracy file.")
@click.option("--baseline", help="Configuration the savings table compares against.")
@click.option("--channels", help="Node → meter channels, e.g. node0=0,node1=1+2 "
              "(default: the trace's channel map).")
@click.option("--out", "out_dir", type=click.Path(path_type=Path), default=Path("analysis"),
              show_default=True, help="Output directory (results.csv/json, runs, windows).")
@click.option("--energy-basis", type=click.Choice(["gross", "net"]), default="gross",
              show_default=True, help="Energy basis of EPI, Pareto and savings.")
@click.option("--edge", type=click.Choice(["step", "linear"]), default="step",
              show_default=True, help="Window-edge model (see docs/analysis.md).")
@click.option("--energy-method", type=click.Choice(["counter", "trapezoid"]), default="counter",
              show_default=True, help="Primary energy: the chip's energy counter (trapezoid "
              "where the counter does not cover a window) or the integral of power readings.")
@click.option("--max-resolution-frac", type=FRACTION, default=0.005, show_default=True,
              help="Largest energy-counter resolution as a fraction of a repeat's phase energy.")
@click.option("--cv-threshold", type=FRACTION, default=0.03, show_default=True,
              help="Largest repeat CV of a valid run.")
@click.option("--max-offset-frac", type=FRACTION, default=0.01, show_default=True,
              help="Largest clock-offset uncertainty as a fraction of the median phase.")
@click.option("--min-samples", type=BoundedInt(2, 1_000_000), default=2, show_default=True,
              help="Fewest meter samples inside a measured window.")
@click.option("--ppl-tolerance", type=FiniteFloat(0.0, 1.0), default=0.01, show_default=True,
              help="Relative perplexity tolerance of matched pairs.")
@click.option("--time-share", is_flag=True,
              help="Also split node energy over its layer groups by weight bytes (estimate).")
@click.option("--lag", type=click.Choice(["none", "auto"]), default="none", show_default=True,
              help="auto: shift each channel's windows by the load lag estimated from the "
              "trace (labelled in the output); none: report the lag and flag it only.")
@click.option("--max-lag-error-frac", type=FRACTION, default=0.01, show_default=True,
              help="Largest energy a resolved load lag may move across a phase's edges, as a "
              "fraction of its median window energy.")
@click.option("--manifest-dir", type=click.Path(path_type=Path),
              help="Where the quantization manifests are (default: next to the model).")
def analyze(run_dirs: tuple[Path, ...], trace_dir: Path, accuracy_file: Path | None,
            accuracy_value: tuple[str, ...], accuracy_metric: str, baseline: str | None,
            channels: str | None, out_dir: Path, energy_basis: str, edge: str,
            energy_method: str, max_resolution_frac: float,
            cv_threshold: float, max_offset_frac: float, min_samples: int, ppl_tolerance: float,
            time_share: bool, lag: str, max_lag_error_frac: float,
            manifest_dir: Path | None) -> None:
    """Joules per token by phase and node, EPI with CIs, and validity verdicts."""
    check_output_dir(out_dir, "--out")
    opts = Options(edge=edge, energy_method=energy_method,
                   max_resolution_frac=max_resolution_frac,
                   min_samples=min_samples, cv_threshold=cv_threshold,
                   max_offset_frac=max_offset_frac,
                   channels=parse_channels(channels), energy_basis=energy_basis,
                   accuracy_metric=accuracy_metric,
                   accuracy_values=parse_accuracy_values(accuracy_value),
                   ppl_tolerance=ppl_tolerance, baseline=baseline, time_share=time_share,
                   lag=lag, max_lag_error_frac=max_lag_error_frac,
                   manifest_dir=manifest_dir)
    a = analyze_runs(list(run_dirs), trace_dir, opts, accuracy_file)
    argv = {"run_dirs": [str(d) for d in run_dirs], "trace": str(trace_dir),
            "accuracy": str(accuracy_file) if accuracy_file else None}
    write_atomically(out_dir, build_outputs(a, argv))
    click.echo(summary_text(a))
    click.echo(f"\nwrote {out_dir}/results.csv, results.json, runs.csv, repeats.csv, windows.csv, "
               "savings.csv, comparisons.csv, prefill_regression.csv, lag.csv")


def analyze_runs(run_dirs: list[Path], trace_dir: Path, opts: Options,
                 accuracy_file: Path | None) -> Analysis:
    """The API call behind the command (kept separate so tests can call it directly)."""
    return analysis_mod.analyze(run_dirs, trace_dir, opts, accuracy_file)
