"""The summary tables `epi analyze` prints: per configuration, savings, pairwise differences,
prefill regression, load lag, phase breakdown, per node, verdicts and notes (text only; the
files are host.analysis.output's)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from epi.core.text import format_number, format_table
from host.analysis import components
from host.analysis.headline import headline_rows
from host.analysis.intervals import format_interval, pct
from host.analysis.model import Analysis
from host.analysis.verdicts import worth_measuring_again
from host.analysis.vocabulary import SCOPE_ALL, EnergyMethod, WindowKind

#: what to change when a phase was refused for its repeat spread alone
SPREAD_FIX = ("  what to change (repeat spread): longer repeats (--tokens), more of them "
              "(--repeats), a quieter machine, or measure the run again (a campaign's "
              "[decide] remeasure); when the time per token varied as much, the machine's own "
              "speed did, not the meter")


_num = format_number  # `fmt`-formatted, "null" where there is no number


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


def _short_method(method: object) -> str:
    if not isinstance(method, str) or not method:
        return "-"
    return "paired" if method.startswith("paired") else "unpaired"


def counter_fallback_line(a: Analysis) -> str:
    """With --energy-method counter: how many measured windows fell back to the power integral
    and why (a counter reset or freeze), so a reset is said, not only buried in windows.csv."""
    if a.options.energy_method != EnergyMethod.COUNTER or a.windows.empty:
        return ""
    w = a.windows[(a.windows["scope"] == SCOPE_ALL) & (a.windows["kind"] != WindowKind.IDLE)
                  & (a.windows["energy_method"].fillna("") != "")]
    back = w[w["energy_method"] != EnergyMethod.COUNTER]
    if back.empty:
        return ""
    first = next((r for r in back["counter_reason"].fillna("") if r), "no reason recorded")
    rows = sorted(set(a.results.loc[a.results["energy_method"].isin(["mixed", "trapezoid"]),
                                    "config"]))
    return (f"energy counter: {len(back)} of {len(w)} windows fell back to the power integral "
            f"({first}); energy_method says mixed or trapezoid on the rows they feed"
            + (f" ({', '.join(rows)})" if rows else ""))


def instrument_cell(row: pd.Series) -> str:
    """The instrument term of a figure: '1.02' (%), or 'n/a' where there is none."""
    u = row.get("instrument_u_pct")
    if isinstance(u, (int, float)) and np.isfinite(u):
        return _num(float(u), ".3g")
    return "n/a"


def instrument_lines(a: Analysis) -> list[str]:
    """What the 'instrument ± %' column is, the bound, and the board's qualification."""
    res = a.results
    if "instrument_u_basis" not in res or res.empty:
        return []
    bases = sorted({str(b) for b in res.loc[res["scope"] == SCOPE_ALL, "instrument_u_basis"]
                    if isinstance(b, str) and b})
    out = ["instrument ± %: the meter chain's own uncertainty (k = 1), a separate term "
           "beside the repeat interval, not inside it; bound "
           f"{a.options.max_instrument_u_pct:g} % (--max-instrument-u-pct)"]
    if bases:
        out.append(f"  e.g. {bases[0]}")
    quals = sorted({str(q) for q in res["board_qualification"] if isinstance(q, str) and q})
    out += [f"board: {q}" for q in quals]
    return out


def summary_text(a: Analysis) -> str:
    res = a.results
    basis = a.options.energy_basis
    lvl = _pct(a.options.ci_level)

    def fig(cfg: str, phase: str, unit: str, b: str, scope: str = "all") -> pd.Series:
        """The results row of one figure (all null when the analysis has none)."""
        r = res[(res["config"] == cfg) & (res["scope"] == scope) & (res["phase"] == phase)
                & (res["unit"] == unit) & (res["basis"] == b)]
        return r.iloc[0] if len(r) else pd.Series(np.nan, index=res.columns, dtype=object)

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
            _num(h["j_per_token_cv"] * 100, ".2f"),  # the basis the CV gate checks
            instrument_cell(g),
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
               if a.options.energy_method == EnergyMethod.COUNTER else "")
            + f"; edge model: {a.options.edge}",
            format_table(["config", "power", "valid runs", "J/request", "J/gen tok (gross)",
                          "J/gen tok (net)", "J/total tok", "prefill J/prompt tok",
                          "decode J/gen tok", f"CV % ({basis})", "instrument ± %", "accuracy",
                          f"EPI ({basis})"], rows)]
    out += instrument_lines(a)
    fallback = counter_fallback_line(a)
    if fallback:
        out.append(fallback)
    short = res[(res["scope"] == SCOPE_ALL) & (res["ci_note"].fillna("") != "")]
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
    nodes = headline_rows(res, basis, nodes=True)
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
        if any(worth_measuring_again(str(x)) for x in bad["reasons"]):
            out.append(SPREAD_FIX)
    for note in a.notes:
        out.append(f"note: {note}")
    return "\n".join(out)
