"""The report's tables: the study's results table, savings against the baseline,
perplexity-matched pairs, the paired comparisons (comparisons.csv), component power beside wall
power, and every run's verdict with its measured figures and reasons.

A table is (title, caption, headers, rows of strings); the renderers turn it into HTML and
Markdown. Missing numbers are shown as "null" with the reason, never as 0. Every interval in a
cell carries its own coverage (a percent; "≥" for a lower bound) and n, as the analyze summary
prints it (host.analysis.intervals.format_interval): configurations with 6 and with 3 repeats
sit in one table with different coverages.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from epi.core.text import format_number
from host.analysis.intervals import format_interval, number
from host.analysis.paired import pairing_label
from host.analysis.vocabulary import WindowKind
from host.campaign.study import ThermalRule
from host.report import instrument
from host.report.data import ReportData


@dataclass
class Table:
    key: str
    title: str
    caption: str
    headers: list[str]
    rows: list[list[str]]
    row_classes: list[str] | None = None


def _tail(rd: ReportData, differs: str = "") -> str:
    """What a table caption adds to the report's measurement block: what differs, and the
    power tag."""
    return (f" Differs from the measurement block: {differs}." if differs else "") + \
        f" [{rd.labels.tag()}]"


num = format_number  # a table cell: `fmt`-formatted, "null" where there is no number


def with_ci(v: object, lo: object, hi: object, fmt: str = ".4g", coverage: object = None, *,
            n: object = None, at_least: bool = False) -> str:
    """"v [lo, hi] 75 % n=3": the value with its interval, the interval's coverage and n."""
    return format_interval(v, lo, hi, coverage, at_least=at_least, n=n, fmt=fmt)


def _pairing(method: object) -> str:
    """'paired by campaign round' / 'paired by round' / 'unpaired (Welch)' / '-' from an
    energy_ci_method (host.analysis.paired.pairing_label)."""
    return pairing_label(method)


def _energy_verdict(dist: object, delta: object, a: str, b: str) -> str:
    if dist is None or (isinstance(dist, float) and np.isnan(dist)):
        return "no interval"
    if not dist:
        return "cannot be told apart"
    return f"{b} uses {'less' if number(delta) < 0 else 'more'} than {a}"


def _accuracy_cell(r: dict, prefix: str = "accuracy_") -> str:
    d = r.get(f"{prefix}delta")
    if num(d) == "null":
        return "not compared per item"
    cell = with_ci(d, r.get(f"{prefix}delta_ci_lo"), r.get(f"{prefix}delta_ci_hi"), "+.3f",
                   0.95)
    p = r.get(f"{prefix}mcnemar_p")
    if num(p) != "null":
        cell += f", McNemar p={num(p, '.3g')}"
    dist = r.get(f"{prefix}distinguishable")
    if dist is False:
        cell += " — cannot be told apart"
    return cell


def _invalid_figure(rd: ReportData, cfg: str, col: str = "j_per_token") -> str:
    pr = rd.per_run
    sel = pr[(pr["config"] == cfg) & (pr["phase"] == WindowKind.REQUEST)] if len(pr) else pr
    vals = sel[col].dropna() if len(sel) else pd.Series(dtype=float)
    if vals.empty:
        return "null"
    return f"invalid runs: {num(np.median(vals))}"


def _manifest_problems(rd: ReportData) -> str:
    """'Layer types unknown: <config>: corrupt manifest: <path>: ...' (empty when none)."""
    m = rd.models
    if m.empty or "manifest_problem" not in m.columns:
        return ""
    bad = [f"{c}: {p}" for c, p in zip(m["config"], m["manifest_problem"], strict=True) if p]
    return ("Layer types unknown — " + "; ".join(bad) + ". ") if bad else ""


def results_table(rd: ReportData) -> Table:
    h = rd.headline()
    m = rd.models
    pr = rd.per_run
    rows, classes = [], []
    for cfg in rd.configs:
        r = h.loc[cfg] if cfg in h.index else None
        facts = m.loc[cfg] if len(m) and cfg in m.index else None
        req = pr[(pr["config"] == cfg) & (pr["phase"] == WindowKind.REQUEST)] if len(pr) else pr
        valid = req[req["valid"]] if len(req) else req
        use = valid if len(valid) else req
        tok_s = (use["generated_tokens"] / use["measured_duration_s"]).replace(
            [np.inf, -np.inf], np.nan) if len(use) else pd.Series(dtype=float)
        power = use["power_w"] if len(use) else pd.Series(dtype=float)
        mark = "" if len(valid) else " (invalid runs)"
        jpt = with_ci(r["j_per_token_median"], r["j_per_token_ci_lo"],
                      r["j_per_token_ci_hi"], coverage=r.get("ci_coverage"),
                      n=r.get("n_repeats")) if r is not None else "null"
        if jpt == "null":
            jpt = f"null — {_invalid_figure(rd, cfg)}"
        size = facts["size_bytes"] if facts is not None else np.nan
        rows.append([
            cfg,
            *(str(facts[k]) if facts is not None else "?" for k in ("early", "middle", "late")),
            num(float(size) / 1e6, ".1f") + " MB" if num(size) != "null" else "null",
            num(r["perplexity"], ".3f") if r is not None else "null",
            jpt,
            with_ci(r["accuracy"], r["accuracy_ci_lo"], r["accuracy_ci_hi"], ".3f", 0.95)
            if r is not None else "null",
            with_ci(r["epi"], r["epi_ci_lo"], r["epi_ci_hi"], coverage=r.get("epi_ci_coverage"),
                    n=r.get("n_repeats"), at_least=True) if r is not None else "null",
            (num(np.nanmedian(tok_s), ".1f") + mark) if tok_s.notna().any() else "null",
            (num(np.nanmedian(power), ".2f") + mark) if power.notna().any() else "null",
            f"{len(valid)}/{len(req)}",
            instrument.figure_cell(r),  # the instrument term of J/Token
        ])
        classes.append("" if len(valid) else "invalid")
    cap = (f"The study's results table. J/Token: {rd.basis} J per generated token over the "
           "whole request, median over the repeats of valid runs [interval]; where no run is "
           "valid, the invalid runs' own median is shown and marked. Accuracy: composite "
           "(mean of the benchmarks). EPI = J/Token / Accuracy. Size: model file. Perplexity: "
           "from the accuracy file. tok/s and average power: generated tokens per second of "
           "request time and mean power during requests (all of the run's channels). Early, "
           "Middle, Late: the types of the map's own groups of those names with their layers "
           "(the paper's groups for a paper-form map); a map without such groups shows its "
           "groups within each quarter of the depth, by layer range. Each interval shows its "
           "own coverage and n. " + _manifest_problems(rd) + _tail(rd).lstrip())
    return Table("results", "Results per configuration",
                 cap, ["Config", "Early", "Middle", "Late", "Size", "Perplexity", "J/Token",
                       "Accuracy", "EPI", "tok/s", "Avg power W", "valid runs",
                       "J/Token instrument ±"], rows, classes)


def savings_table(rd: ReportData) -> Table:
    """Each configuration against the baseline: the paired energy saving with its interval
    and verdict, latency, and the paired accuracy change (savings.csv)."""
    s = pd.DataFrame(rd.doc.get("savings") or [])
    rows = []
    base = ""
    if not s.empty:
        base = str(s["baseline"].iloc[0])
        for r in s.to_dict("records"):
            if r["config"] == base:
                continue
            n = r.get("n_pairs") or None
            rows.append([str(r["config"]), num(r["j_per_token"]),
                         with_ci(r["energy_saving_pct"], r.get("energy_saving_pct_ci_lo"),
                                 r.get("energy_saving_pct_ci_hi"), "+.2f",
                                 r.get("energy_ci_coverage"), n=n),
                         _pairing(r.get("energy_ci_method")),
                         _energy_verdict(r.get("energy_distinguishable"),
                                         -float(r["energy_saving_pct"])
                                         if num(r["energy_saving_pct"]) != "null" else 0.0,
                                         base, str(r["config"])),
                         num(r["latency_s"], ".3f"), num(r["latency_saving_pct"], "+.1f"),
                         _accuracy_cell(r)])
    cap = (f"Against the baseline {base or '(none given: set study.baseline / --baseline)'}; "
           "positive = saves. Energy saving: mean per-round saving of J per generated token, "
           "paired by campaign round over the rounds in which both have a valid run (n = "
           "common rounds), else by round when ad-hoc runs were interleaved in time (n = "
           "rounds), else Welch's unpaired interval (n blank); 'cannot be told apart' when the "
           "interval holds 0. "
           "Latency: median request duration (point figure). Δ accuracy: B − baseline, paired "
           "over the items both were scored on. Valid runs only." + _tail(rd))
    return Table("savings", "Savings against the baseline", cap,
                 ["Config", "J/Token", "energy saving % [interval]", "pairing",
                  "energy verdict", "latency s", "latency saving %", "Δ accuracy"], rows)


def pairs_table(rd: ReportData) -> Table:
    """Perplexity-matched pairs with their paired J/token difference and verdict."""
    rows = []
    for p in rd.doc.get("perplexity_matched_pairs") or []:
        rows.append([str(p.get("cheaper")), str(p.get("dearer")),
                     num(p.get("ppl_cheaper"), ".3f"), num(p.get("ppl_dearer"), ".3f"),
                     num(p.get("j_per_token_cheaper")), num(p.get("j_per_token_dearer")),
                     with_ci(p.get("saving_pct"), p.get("saving_pct_ci_lo"),
                             p.get("saving_pct_ci_hi"), ".2f", p.get("ci_coverage"),
                             n=p.get("n_pairs") or None),
                     _pairing(p.get("ci_method")),
                     "cannot be told apart" if p.get("distinguishable") is False else
                     "different" if p.get("distinguishable") else
                     f"no interval ({p.get('reason') or 'too few repeats'})"])
    tol = (rd.doc.get("options") or {}).get("ppl_tolerance", 0.01)
    cap = (f"Same perplexity (within {tol:.0%} relative), different joules? Every pair of "
           "configurations whose perplexities agree, with the saving of the cheaper one and "
           "its paired interval (per campaign round both have, else per round when ad-hoc "
           "runs were interleaved in time, else Welch); "
           "'cannot be told apart' when the interval holds 0 (valid runs only)."
           + ("" if rows else " No such pair in this study (or no perplexity measured).")
           + _tail(rd))
    return Table("pairs", "Perplexity-matched pairs", cap,
                 ["cheaper", "dearer", "ppl cheaper", "ppl dearer", "J/Token cheaper",
                  "J/Token dearer", "saving % [interval]", "pairing", "verdict"], rows)


def comparisons_table(rd: ReportData) -> Table:
    """comparisons.csv: every pairwise difference the analysis made (savings vs the baseline,
    perplexity-matched pairs, neighbours on the Pareto frontier), paired, with a verdict."""
    rows = []
    for r in rd.doc.get("comparisons") or []:
        a, b = str(r.get("config_a")), str(r.get("config_b"))
        rows.append([str(r.get("comparison")), a, b,
                     with_ci(r.get("energy_delta_j_per_token"), r.get("energy_delta_ci_lo"),
                             r.get("energy_delta_ci_hi"), "+.4g", r.get("energy_ci_coverage"),
                             n=r.get("n_pairs") or None),
                     _pairing(r.get("energy_ci_method")),
                     _energy_verdict(r.get("energy_distinguishable"),
                                     r.get("energy_delta_j_per_token"), a, b),
                     _accuracy_cell(r), str(r.get("verdict") or "")])
    cap = ("Every pairwise difference B − A (comparisons.csv): savings against the baseline, "
           "perplexity-matched pairs and neighbours on the Pareto frontier. Δ energy in J per "
           "generated token, paired by campaign round over the rounds both have a valid run "
           "in (n = common rounds), else by round when ad-hoc runs were interleaved in time, "
           "else Welch's unpaired interval; Δ accuracy paired over items (Newcombe interval, "
           "McNemar exact p). 'cannot be told apart' = the interval holds 0."
           + ("" if rows else " No comparison in this study (give a baseline, or a "
              "frontier of ≥ 2 configurations).") + _tail(rd))
    return Table("comparisons", "Paired comparisons", cap,
                 ["comparison", "A", "B", "Δ J/token (B − A) [interval]", "pairing",
                  "energy verdict", "Δ accuracy (B − A)", "verdict"], rows)


def components_table(rd: ReportData) -> Table | None:
    """Component power (software counters) beside wall power, when the trace has any: each
    row labelled with what it measures — never a component figure read as wall power."""
    comp = rd.doc.get("components")
    if not isinstance(comp, dict):
        return None
    rows = []
    for r in comp.get("side_by_side") or []:
        wall_label = r.get("wall_label") or "no wall channel"
        rows.append([str(r.get("config")), str(r.get("node")), str(r.get("kind")),
                     str(r.get("name")), str(r.get("scope") or "all"),
                     str(r.get("label")), num(r.get("power_w")),
                     num(r.get("j_per_generated_token")), wall_label, num(r.get("wall_power_w")),
                     num(r.get("wall_j_per_generated_token")),
                     num(r.get("wall_over_component"), ".3f"), num(r.get("unseen_power_w"))])
    main = comp.get("main_figures") or {}
    cap = ("Component power (software counters: RAPL, hwmon, NVML, PMIC) beside wall power, "
           "over the same request and idle windows. Component power is not wall power: the "
           "power supply, board, fans and disks are missing; unseen = wall − all components. "
           "The main figures of each node measure: "
           + (", ".join(f"{n}: {lab}" for n, lab in sorted(main.items())) or "?") + "."
           + _tail(rd, "no intervals (point figures)"))
    return Table("components", "Component power beside wall power", cap,
                 ["config", "node", "window", "channel", "scope", "label", "component W",
                  "component J/gen tok", "wall", "wall W", "wall J/gen tok", "wall/component",
                  "unseen W"], rows)


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
           "median, interval or frontier." + _tail(rd, "per-run figures, no intervals"))
    return Table("verdicts", "Every run's verdict", cap,
                 ["run", "config", "run dir", "phase", "verdict", "J/token", "CV %",
                  "windows", "samples", "reasons"], rows, classes)


def settle_table(rd: ReportData) -> Table:
    rows = []
    for st in rd.settles:
        if st.get("rule") == ThermalRule.FIXED:
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
           "settle still ran; its verdict is the analysis'." + _tail(rd, "no intervals"))
    return Table("settle", "Thermal settle before each run", cap,
                 ["step", "run", "rule", "waited s", "settled", "idle W", "max deviation",
                  "reason"], rows, ["" if r[4] == "yes" else "invalid" for r in rows])


def build_all(rd: ReportData) -> list[Table]:
    tables = [results_table(rd), savings_table(rd), comparisons_table(rd), pairs_table(rd),
              verdicts_table(rd)]
    comp = components_table(rd)
    if comp is not None:
        tables.append(comp)
    if rd.settles:
        tables.append(settle_table(rd))
    return tables
