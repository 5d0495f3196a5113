"""The report's tables: the study's results table, savings against the baseline,
perplexity-matched pairs, and every run's verdict with its measured figures and reasons.

A table is (title, caption, headers, rows of strings); the renderers turn it into HTML and
Markdown. Missing numbers are shown as "null" with the reason, never as 0.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from host.report.data import ReportData


@dataclass
class Table:
    key: str
    title: str
    caption: str
    headers: list[str]
    rows: list[list[str]]
    row_classes: list[str] | None = None


def num(x: object, fmt: str = ".4g") -> str:
    try:
        v = float(x)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return "null"
    return format(v, fmt) if np.isfinite(v) else "null"


def with_ci(v: object, lo: object, hi: object, fmt: str = ".4g") -> str:
    s = num(v, fmt)
    if s == "null":
        return s
    if num(lo) == "null" or num(hi) == "null":
        return s
    return f"{s} [{num(lo, fmt)}, {num(hi, fmt)}]"


def _invalid_figure(rd: ReportData, cfg: str, col: str = "j_per_token") -> str:
    pr = rd.per_run
    sel = pr[(pr["config"] == cfg) & (pr["phase"] == "request")] if len(pr) else pr
    vals = sel[col].dropna() if len(sel) else pd.Series(dtype=float)
    if vals.empty:
        return "null"
    return f"invalid runs: {num(np.median(vals))}"


def results_table(rd: ReportData) -> Table:
    h = rd.headline()
    m = rd.models
    pr = rd.per_run
    rows, classes = [], []
    for cfg in rd.configs:
        r = h.loc[cfg] if cfg in h.index else None
        facts = m.loc[cfg] if len(m) and cfg in m.index else None
        req = pr[(pr["config"] == cfg) & (pr["phase"] == "request")] if len(pr) else pr
        valid = req[req["valid"]] if len(req) else req
        use = valid if len(valid) else req
        tok_s = (use["generated_tokens"] / use["measured_duration_s"]).replace(
            [np.inf, -np.inf], np.nan) if len(use) else pd.Series(dtype=float)
        power = use["power_w"] if len(use) else pd.Series(dtype=float)
        mark = "" if len(valid) else " (invalid runs)"
        jpt = with_ci(r["j_per_token_median"], r["j_per_token_ci_lo"],
                      r["j_per_token_ci_hi"]) if r is not None else "null"
        if jpt == "null":
            jpt = f"null — {_invalid_figure(rd, cfg)}"
        size = facts["size_bytes"] if facts is not None else np.nan
        rows.append([
            cfg,
            *(str(facts[k]) if facts is not None else "?" for k in ("early", "middle", "late")),
            num(float(size) / 1e6, ".1f") + " MB" if num(size) != "null" else "null",
            num(r["perplexity"], ".3f") if r is not None else "null",
            jpt,
            with_ci(r["accuracy"], r["accuracy_ci_lo"], r["accuracy_ci_hi"], ".3f")
            if r is not None else "null",
            with_ci(r["epi"], r["epi_ci_lo"], r["epi_ci_hi"]) if r is not None else "null",
            (num(np.nanmedian(tok_s), ".1f") + mark) if tok_s.notna().any() else "null",
            (num(np.nanmedian(power), ".2f") + mark) if power.notna().any() else "null",
            f"{len(valid)}/{len(req)}",
        ])
        classes.append("" if len(valid) else "invalid")
    cap = (f"The study's results table. J/Token: {rd.basis} J per generated token over the "
           "whole request, median over the repeats of valid runs [interval]; where no run is "
           "valid, the invalid runs' own median is shown and marked. Accuracy: composite "
           "(mean of the benchmarks). EPI = J/Token / Accuracy. Size: model file. Perplexity: "
           "from the accuracy file. tok/s and average power: generated tokens per second of "
           "request time and mean power during requests (all of the run's channels). "
           + rd.labels.line(rd.counts()))
    return Table("results", "Results per configuration",
                 cap, ["Config", "Early", "Middle", "Late", "Size", "Perplexity", "J/Token",
                       "Accuracy", "EPI", "tok/s", "Avg power W", "valid runs"], rows, classes)


def savings_table(rd: ReportData) -> Table:
    s = pd.DataFrame(rd.doc.get("savings") or [])
    rows = []
    base = ""
    if not s.empty:
        base = str(s["baseline"].iloc[0])
        for _, r in s.iterrows():
            rows.append([str(r["config"]), num(r["j_per_token"]),
                         num(r["energy_saving_pct"], "+.1f"), num(r["latency_s"], ".3f"),
                         num(r["latency_saving_pct"], "+.1f")])
    cap = (f"Against the baseline {base or '(none given: set study.baseline / --baseline)'}; "
           "positive = saves. Energy: median J per generated token; latency: median request "
           "duration; valid runs only (null where a configuration has none). "
           + rd.labels.line(rd.counts()))
    return Table("savings", "Savings against the baseline", cap,
                 ["Config", "J/Token", "energy saving %", "latency s", "latency saving %"],
                 rows)


def pairs_table(rd: ReportData) -> Table:
    rows = []
    for p in rd.doc.get("perplexity_matched_pairs") or []:
        rows.append([str(p.get("cheaper")), str(p.get("dearer")),
                     num(p.get("ppl_cheaper"), ".3f"), num(p.get("ppl_dearer"), ".3f"),
                     num(p.get("j_per_token_cheaper")), num(p.get("j_per_token_dearer")),
                     num(p.get("saving_pct"), ".1f")])
    tol = (rd.doc.get("options") or {}).get("ppl_tolerance", 0.01)
    cap = (f"Same perplexity (within {tol:.0%} relative), different joules: pairs whose "
           "J/token intervals do not overlap (valid runs only). " + rd.labels.line(rd.counts())
           + ("" if rows else " — no such pair in this study (or no perplexity measured)."))
    return Table("pairs", "Perplexity-matched pairs", cap,
                 ["cheaper", "dearer", "ppl cheaper", "ppl dearer", "J/Token cheaper",
                  "J/Token dearer", "saving %"], rows)


def verdicts_table(rd: ReportData) -> Table:
    pr = rd.per_run
    rows, classes = [], []
    paths = {r["run_id"]: r.get("path", "") for r in rd.doc["runs"]}
    for _, r in pr.iterrows():
        rows.append([str(r["run_id"])[:12], str(r["config"]),
                     str(paths.get(r["run_id"], "")).rsplit("/", 1)[-1], str(r["phase"]),
                     "valid" if r["valid"] else "INVALID", num(r["j_per_token"]),
                     num(r["cv"] * 100, ".2f") if num(r["cv"]) != "null" else "null",
                     f"{int(r['n_windows_measured'])}/{int(r['n_windows'])}",
                     str(int(r["n_samples"])), r["reasons"] or "—"])
        classes.append("" if r["valid"] else "invalid")
    cap = ("Every run and phase with its own measured figure (ratio of sums over its windows "
           "that have an energy; J per prompt token for prefill, per generated token "
           "otherwise), the repeat CV, windows measured, meter samples inside them, and the "
           "verdict's reasons. Invalid runs are shown with their numbers but are not in any "
           "median, interval or frontier. " + rd.labels.line(rd.counts()))
    return Table("verdicts", "Every run's verdict", cap,
                 ["run", "config", "run dir", "phase", "verdict", "J/token", "CV %",
                  "windows", "samples", "reasons"], rows, classes)


def settle_table(rd: ReportData) -> Table:
    rows = []
    for st in rd.settles:
        if st.get("rule") == "fixed":
            rule = f"fixed wait {num(st.get('wait_s'), 'g')} s"
        else:
            rule = (f"stable within ±{num(100 * float(st.get('tolerance', 0)), '.3g')} % for "
                    f"{num(st.get('window_s'), 'g')} s")
        rows.append([str(st.get("step")), str(st["run_id"])[:12], rule,
                     num(st.get("waited_s"), ".1f"), "yes" if st.get("settled") else "NO",
                     num(st.get("mean_power_w"), ".3f"), num(st.get("max_deviation"), ".4f"),
                     str(st.get("reason") or "")])
    cap = ("Thermal settle before each analysed run, as the campaign journal recorded it: the "
           "rule, the seconds waited, and for the stable rule the idle power (all channels "
           "summed) and the largest relative deviation over the window. A run that did not "
           "settle still ran; its verdict is the analysis'. " + rd.labels.line())
    return Table("settle", "Thermal settle before each run", cap,
                 ["step", "run", "rule", "waited s", "settled", "idle W", "max deviation",
                  "reason"], rows, ["" if r[4] == "yes" else "invalid" for r in rows])


def build_all(rd: ReportData) -> list[Table]:
    tables = [results_table(rd), savings_table(rd), pairs_table(rd), verdicts_table(rd)]
    if rd.settles:
        tables.append(settle_table(rd))
    return tables
