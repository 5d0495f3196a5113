"""Per-configuration figures over valid repeats: results table, Pareto frontier, perplexity-matched
pairs, savings, pairwise comparisons and the per-phase breakdown.

Every per-configuration interval carries its method, achieved coverage and n
(host.analysis.intervals); every figure its power source (measured or modelled,
host.analysis.power_source); every difference between two configurations is paired where the
data allow it (host.analysis.paired).
"""

from __future__ import annotations

from dataclasses import replace
from itertools import pairwise

import numpy as np
import pandas as pd

from epi.core.errors import UserError
from epi.core.text import ranges_text
from host.analysis import paired, statistics
from host.analysis.headline import headline_rows
from host.analysis.instrument import ChannelInstrument, Qualification, figure_term
from host.analysis.model import UNIT_TEXT, Options, RunInfo
from host.analysis.power_source import combined
from host.analysis.records import PerplexityPair
from host.analysis.verdicts import valid_repeats
from host.analysis.vocabulary import SCOPE_ALL, EnergyBasis, Phase, TokenUnit, WindowKind
from host.analysis.windows import methods_used


def scope_channels(infos: list[RunInfo], cfg: str, scope: str) -> list[int]:
    """Meter channels behind one configuration's figures in one scope (all its runs)."""
    chans: list[int] = []
    for i in infos:
        if i.config != cfg:
            continue
        if scope == SCOPE_ALL:
            chans += [c for cs in i.node_channels.values() for c in cs]
        else:
            chans += i.node_channels.get(scope, [])
    return sorted(set(chans))


def lag_correction_text(infos: list[RunInfo], cfg: str) -> str:
    """'none', or 'auto: ch0 +12.3 ms, ...' (the shifts --lag auto applied to this config)."""
    shifts = [f"ch{ch} {ms:+.2f} ms" for i in infos if i.config == cfg
              for ch, ms in sorted(i.lag_applied_ms.items())]
    return "auto: " + ", ".join(shifts) if shifts else "none"


def repeat_values(valid: pd.DataFrame, cfg: str, basis: str, *, scope: str = "all",
                  phase: str = "request", unit: str = "generated"
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(J/token per valid repeat, repeat start in meter ns, run id, campaign round) of one
    configuration's figure, for pairing (host.analysis.paired.round_pairs): the campaign round
    pairs by round index, the run and start time pair ad-hoc runs by time interleaving. The
    round is NaN for a run a campaign did not lay out (or a table without the column)."""
    v = valid[(valid["config"] == cfg) & (valid["scope"] == scope) & (valid["phase"] == phase)
              & (valid["unit"] == unit) & (valid["basis"] == basis)]
    rounds = (pd.to_numeric(v["campaign_round"], errors="coerce").to_numpy(np.float64,
                                                                          na_value=np.nan)
              if "campaign_round" in v.columns else np.full(len(v), np.nan))
    return (v["j_per_token"].to_numpy(np.float64),
            v["t_start_meter_ns"].to_numpy(np.float64), v["run_id"].to_numpy(object), rounds)


def config_results(infos: list[RunInfo], rep: pd.DataFrame, verdicts: pd.DataFrame,
                   accs: dict[str, statistics.Accuracy], opts: Options,
                   sources: dict[int, str] | None = None,
                   instrument: dict[int, ChannelInstrument] | None = None,
                   qual: Qualification | None = None) -> pd.DataFrame:
    """One row per (config, scope, phase, unit, basis): the repeat interval and, beside it,
    the instrument uncertainty (host.analysis.instrument) as a separate term; a figure whose
    instrument term exceeds `opts.max_instrument_u_pct` says so in its `reason`."""
    valid = valid_repeats(rep, verdicts)
    layers = {(i.config, p.node): p.layers for i in infos for p in i.run.placement}
    rows = []
    keys = rep[["config", "scope", "phase", "unit", "basis"]].drop_duplicates()
    for cfg, scope, phase, unit, basis in keys.itertuples(index=False):
        v = valid[(valid["config"] == cfg) & (valid["scope"] == scope) & (valid["phase"] == phase)
                  & (valid["unit"] == unit) & (valid["basis"] == basis)]
        cfg_runs = verdicts[(verdicts["config"] == cfg) & (verdicts["phase"] == phase)]
        st = statistics.repeat_stats(v["j_per_token"].to_numpy(np.float64), level=opts.ci_level)
        reason = st.reason
        if v.empty:
            bad = cfg_runs[~cfg_runs["valid"]]
            reason = "no valid runs" + (f": {bad['reasons'].iloc[0]}" if len(bad) else "")
        e_req = v["energy_per_request_j"].to_numpy(np.float64)
        d_req = v["duration_per_request_s"].to_numpy(np.float64)
        row = {
            "config": cfg, "scope": scope,
            "layers": ranges_text(layers.get((cfg, scope)) or ()) if scope != SCOPE_ALL else "",
            "phase": phase, "unit": unit, "basis": basis,
            "figure": f"{basis} {UNIT_TEXT[unit]}" + (" (whole request)" if phase == Phase.REQUEST
                                                      else f" ({phase})"),
            "n_runs": int(cfg_runs["run_id"].nunique()),
            "n_runs_valid": int(v["run_id"].nunique()),
            "n_repeats": st.n,
            "power_source": combined((sources or {}).get(c, "") for c in
                                     scope_channels(infos, cfg, scope)),
            "j_per_token_median": st.median, "j_per_token_cv": st.cv,
            "j_per_token_ci_lo": st.ci_lo, "j_per_token_ci_hi": st.ci_hi,
            "ci_method": st.ci_method if np.isfinite(st.ci_coverage) else "",
            "ci_coverage": st.ci_coverage, "ci_level_met": bool(st.ci_level_met),
            "ci_note": st.ci_note,
            "j_per_token_mean": st.mean, "j_per_token_mean_ci_lo": st.mean_ci_lo,
            "j_per_token_mean_ci_hi": st.mean_ci_hi,
            "energy_per_request_j_median": float(np.median(e_req)) if len(e_req) and not
            np.isnan(e_req).any() else float("nan"),
            "duration_per_request_s_median": float(np.median(d_req)) if len(d_req) else
            float("nan"),
            "reason": reason,
            # what the valid repeats' windows used (a counter reset: "mixed"), not the option
            "energy_method": methods_used(v["energy_method"]),
            "accuracy": float("nan"), "accuracy_ci_lo": float("nan"),
            "accuracy_ci_hi": float("nan"), "accuracy_basis": "",
            "epi": float("nan"), "epi_ci_lo": float("nan"), "epi_ci_hi": float("nan"),
            "epi_ci_coverage": float("nan"), "epi_energy_basis": "", "epi_reason": "",
        }
        if scope == SCOPE_ALL and phase == Phase.REQUEST and unit == TokenUnit.GENERATED:
            acc = accs.get(cfg)
            e, lo, hi, why = statistics.epi(st.median, st.ci_lo, st.ci_hi, acc)
            row.update(epi=e, epi_ci_lo=lo, epi_ci_hi=hi, epi_reason=why,
                       epi_ci_coverage=statistics.epi_coverage(st.ci_coverage, acc)
                       if np.isfinite(lo) else float("nan"),
                       epi_energy_basis=f"{basis} J per generated token (whole request)")
            if acc is not None:
                row.update(accuracy=acc.value, accuracy_ci_lo=acc.ci_lo,
                           accuracy_ci_hi=acc.ci_hi, accuracy_basis=acc.basis)
        inst = figure_term(scope_channels(infos, cfg, scope), instrument or {},
                           row["energy_per_request_j_median"])
        row.update(instrument_u_pct=inst.u_pct, instrument_u_basis=inst.basis,
                   board_qualification=qual.detail if qual is not None else "")
        if np.isfinite(inst.u_pct) and inst.u_pct > opts.max_instrument_u_pct:
            row["reason"] = "; ".join(x for x in (
                row["reason"], f"instrument uncertainty {inst.u_pct:.3g} % above the bound "
                f"{opts.max_instrument_u_pct:g} % (--max-instrument-u-pct)") if x)
        rows.append(row)
    res = pd.DataFrame(rows)
    res["ci_level_wanted"] = opts.ci_level
    res["lag_correction"] = res["config"].map(
        {c: lag_correction_text(infos, c) for c in res["config"].unique()})
    res["edge_model"] = opts.edge
    return res


def pareto_configs(results: pd.DataFrame, opts: Options) -> list[str]:
    h = headline_rows(results, opts.energy_basis)
    mask = statistics.pareto_front(h["accuracy"].to_numpy(), h["j_per_token_median"].to_numpy())
    front = set(h["config"].to_numpy()[mask])
    results["pareto"] = pd.array([pd.NA] * len(results), dtype="boolean")
    known = h.index[np.isfinite(h["accuracy"].to_numpy(np.float64))
                    & np.isfinite(h["j_per_token_median"].to_numpy(np.float64))]
    results.loc[known, "pareto"] = results.loc[known, "config"].isin(front).to_numpy()
    return sorted(front)


def matched_pairs(results: pd.DataFrame, rep: pd.DataFrame, verdicts: pd.DataFrame,
                  ppl: dict[str, float], opts: Options) -> list[PerplexityPair]:
    h = headline_rows(results, opts.energy_basis)
    if h.empty:
        return []
    valid = valid_repeats(rep, verdicts)
    configs = list(h["config"])
    out = statistics.perplexity_pairs(
        configs, np.array([ppl.get(c, np.nan) for c in configs]),
        {c: repeat_values(valid, c, opts.energy_basis) for c in configs},
        rel_tol=opts.ppl_tolerance, level=opts.ci_level)
    basis = f"{opts.energy_basis} J per generated token (whole request)"
    return [replace(p, energy_basis=basis) for p in out]


SAVINGS_COLUMNS = [
    "config", "j_per_token", "latency_s", "energy_saving_pct", "energy_saving_pct_ci_lo",
    "energy_saving_pct_ci_hi", "energy_ci_method", "energy_ci_coverage", "n_pairs",
    "energy_distinguishable", "latency_saving_pct", "accuracy_delta", "accuracy_delta_ci_lo",
    "accuracy_delta_ci_hi", "accuracy_mcnemar_p", "accuracy_distinguishable",
    "accuracy_method", "power_source", "baseline", "basis", "reason",
]


def savings_table(results: pd.DataFrame, rep: pd.DataFrame, verdicts: pd.DataFrame,
                  opts: Options, items: dict | None = None,
                  weights: dict[str, float] | None = None) -> pd.DataFrame:
    """Each configuration against the baseline: paired energy saving and accuracy change.

    `energy_saving_pct` = (A − B)/A of the baseline A and configuration B (J/token), from
    per-round pairs when repeats are interleaved, else from the means (Welch, labelled);
    `accuracy_delta` = B − A over the items both were scored on (paired).
    """
    h = headline_rows(results, opts.energy_basis).set_index("config")
    if opts.baseline is None or h.empty:
        return pd.DataFrame(columns=SAVINGS_COLUMNS)
    if opts.baseline not in h.index:
        raise UserError(f"--baseline: configuration {opts.baseline!r} is not among the analysed "
                        f"runs ({', '.join(sorted(h.index))})")
    valid = valid_repeats(rep, verdicts)
    base = opts.baseline
    base_t = h.loc[base, "duration_per_request_s_median"]
    va, ta, ra, ka = repeat_values(valid, base, opts.energy_basis)
    rows = []
    for cfg in h.index:
        vb, tb, rb, kb = repeat_values(valid, cfg, opts.energy_basis)
        d = paired.energy_difference(va, ta, vb, tb, level=opts.ci_level, block_a=ra,
                                     block_b=rb, round_a=ka, round_b=kb)
        acc = comparison_accuracy(items, weights, base, cfg)
        lat = h.loc[cfg, "duration_per_request_s_median"]
        rows.append({
            "config": cfg, "j_per_token": h.loc[cfg, "j_per_token_median"], "latency_s": lat,
            "energy_saving_pct": d["saving_pct"], "energy_saving_pct_ci_lo":
            d["saving_pct_ci_lo"], "energy_saving_pct_ci_hi": d["saving_pct_ci_hi"],
            "energy_ci_method": d["method"], "energy_ci_coverage": d["ci_coverage"],
            "n_pairs": d["n_pairs"], "energy_distinguishable": d["distinguishable"],
            "latency_saving_pct": (base_t - lat) / base_t * 100.0,
            "accuracy_delta": acc["delta"], "accuracy_delta_ci_lo": acc["ci_lo"],
            "accuracy_delta_ci_hi": acc["ci_hi"], "accuracy_mcnemar_p": acc["mcnemar_p"],
            "accuracy_distinguishable": acc["distinguishable"], "accuracy_method":
            acc["method"] or acc["reason"], "power_source": h.loc[cfg, "power_source"],
            "baseline": base,
            "basis": (f"{opts.energy_basis} J per generated token (whole request); latency = "
                      "median request duration"),
            "reason": d["reason"],
        })
    return pd.DataFrame(rows, columns=SAVINGS_COLUMNS)


def comparison_accuracy(items: dict | None, weights: dict[str, float] | None, a: str,
                        b: str) -> paired.AccuracyDifference:
    """Paired accuracy difference B − A, or a row saying why there is none."""
    if not items or a not in items or b not in items:
        nan = float("nan")
        return {"delta": nan, "ci_lo": nan, "ci_hi": nan, "n_items": 0, "discordant": 0,
                "mcnemar_p": nan, "distinguishable": None, "method": "",
                "reason": "no per-item accuracy outcomes for both (accuracy file without "
                          "`items`, or none given)"}
    return paired.accuracy_difference(items[a], items[b], weights or {})


COMPARISON_COLUMNS = [
    "comparison", "config_a", "config_b", "energy_delta_j_per_token", "energy_delta_ci_lo",
    "energy_delta_ci_hi", "energy_saving_pct", "energy_saving_pct_ci_lo",
    "energy_saving_pct_ci_hi", "energy_ci_method", "energy_ci_coverage", "n_pairs",
    "energy_distinguishable", "accuracy_delta", "accuracy_delta_ci_lo", "accuracy_delta_ci_hi",
    "accuracy_mcnemar_p", "accuracy_method", "accuracy_distinguishable",
    "accuracy_n_items", "accuracy_discordant", "verdict", "power_source",
]


def _verdict(d: paired.EnergyDifference, acc: paired.AccuracyDifference, a: str, b: str
             ) -> str:
    parts = []
    if d["distinguishable"] is None:
        parts.append(f"energy: no interval ({d['reason'] or 'too few repeats'})")
    elif d["distinguishable"]:
        word = "uses less" if d["delta"] < 0 else "uses more"
        parts.append(f"{b} {word} energy than {a}")
    else:
        parts.append(f"{a} and {b} cannot be told apart on energy")
    if acc["distinguishable"] is None:
        parts.append("accuracy: not compared per item")
    elif acc["distinguishable"]:
        word = "more" if acc["delta"] > 0 else "less"
        parts.append(f"{b} is {word} accurate")
    else:
        parts.append("cannot be told apart on accuracy")
    return "; ".join(parts)


def comparisons(results: pd.DataFrame, rep: pd.DataFrame, verdicts: pd.DataFrame,
                opts: Options, pareto: list[str], pairs: list[PerplexityPair], items: dict | None,
                weights: dict[str, float] | None) -> pd.DataFrame:
    """Every pairwise difference the summary reports, paired, with a plain verdict.

    Savings vs the baseline (baseline = A), perplexity-matched pairs (dearer = A) and
    neighbours on the Pareto frontier (ordered by J/token, the cheaper = A).
    """
    h = headline_rows(results, opts.energy_basis).set_index("config")
    valid = valid_repeats(rep, verdicts)
    wanted: list[tuple[str, str, str]] = []
    if opts.baseline is not None and opts.baseline in h.index:
        wanted += [("savings vs baseline", opts.baseline, c) for c in h.index
                   if c != opts.baseline]
    wanted += [("perplexity-matched pair", p.dearer, p.cheaper) for p in pairs]
    front = sorted((c for c in pareto if c in h.index),
                   key=lambda c: h.loc[c, "j_per_token_median"])
    wanted += [("frontier neighbours", x, y) for x, y in pairwise(front)]
    rows = []
    for kind, a, b in wanted:
        va, ta, ra, ka = repeat_values(valid, a, opts.energy_basis)
        vb, tb, rb, kb = repeat_values(valid, b, opts.energy_basis)
        d = paired.energy_difference(va, ta, vb, tb, level=opts.ci_level, block_a=ra,
                                     block_b=rb, round_a=ka, round_b=kb)
        acc = comparison_accuracy(items, weights, a, b)
        rows.append({
            "comparison": kind, "config_a": a, "config_b": b,
            "energy_delta_j_per_token": d["delta"], "energy_delta_ci_lo": d["delta_ci_lo"],
            "energy_delta_ci_hi": d["delta_ci_hi"], "energy_saving_pct": d["saving_pct"],
            "energy_saving_pct_ci_lo": d["saving_pct_ci_lo"],
            "energy_saving_pct_ci_hi": d["saving_pct_ci_hi"], "energy_ci_method": d["method"],
            "energy_ci_coverage": d["ci_coverage"], "n_pairs": d["n_pairs"],
            "energy_distinguishable": d["distinguishable"], "accuracy_delta": acc["delta"],
            "accuracy_delta_ci_lo": acc["ci_lo"], "accuracy_delta_ci_hi": acc["ci_hi"],
            "accuracy_mcnemar_p": acc["mcnemar_p"],
            "accuracy_method": acc["method"] or acc["reason"],
            "accuracy_distinguishable": acc["distinguishable"],
            "accuracy_n_items": acc["n_items"], "accuracy_discordant": acc["discordant"],
            "verdict": _verdict(d, acc, a, b),
            "power_source": combined([h.loc[a, "power_source"], h.loc[b, "power_source"]]),
        })
    return pd.DataFrame(rows, columns=COMPARISON_COLUMNS)


def phase_breakdown(infos: list[RunInfo], rep: pd.DataFrame, verdicts: pd.DataFrame,
               opts: Options) -> pd.DataFrame:
    """Per config, per request (scope all, gross): prefill, decode, idle share, in mJ."""
    valid = valid_repeats(rep, verdicts)
    rows = []
    for cfg in dict.fromkeys(i.config for i in infos):
        def med(phase: str, unit: str, col: str, cfg: str = cfg) -> float:
            rows_cu = headline_rows(valid, EnergyBasis.GROSS, phase=phase, unit=unit)
            v = rows_cu[rows_cu["config"] == cfg][col].to_numpy(np.float64)
            return float(np.median(v)) if len(v) and not np.isnan(v).any() else float("nan")

        idle_p = [i.idle_power_w.get(SCOPE_ALL, np.nan) for i in infos if i.config == cfg]
        idle = verdicts[verdicts["phase"] == WindowKind.IDLE]
        ok = [idle[idle["run_id"] == i.run.run_id]["valid"].all() for i in infos
              if i.config == cfg]
        idle_p = [p for p, v in zip(idle_p, ok, strict=True) if v and np.isfinite(p)]
        p_idle = float(np.median(idle_p)) if idle_p else float("nan")
        pre = med(Phase.PREFILL, TokenUnit.PROMPT, "energy_per_request_j")
        dec = med(Phase.DECODE, TokenUnit.GENERATED, "energy_per_request_j")
        req = med(Phase.REQUEST, TokenUnit.GENERATED, "energy_per_request_j")
        dur = med(Phase.REQUEST, TokenUnit.GENERATED, "duration_per_request_s")
        idle_mj = p_idle * dur * 1e3
        src = valid[(valid["config"] == cfg) & (valid["scope"] == SCOPE_ALL)]["power_source"]
        rows.append({"config": cfg, "power_source": combined(src.unique()),
                     "prefill_mj": pre * 1e3, "decode_mj": dec * 1e3,
                     "request_mj": req * 1e3, "idle_mj": idle_mj,
                     "net_request_mj": req * 1e3 - idle_mj, "idle_power_w": p_idle,
                     "request_s": dur})
    return pd.DataFrame(rows)
