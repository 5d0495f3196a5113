"""Per-configuration figures over valid repeats: results table, Pareto frontier, perplexity-matched
pairs, savings and the per-phase breakdown.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from epi.core.errors import UserError
from epi.core.text import ranges_text
from host.analysis import statistics as epimod
from host.analysis.model import UNIT_TEXT, Options, RunInfo
from host.analysis.verdicts import valid_repeats


def config_results(infos: list[RunInfo], rep: pd.DataFrame, verdicts: pd.DataFrame,
             accs: dict[str, epimod.Accuracy], opts: Options) -> pd.DataFrame:
    valid = valid_repeats(rep, verdicts)
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
            "layers": ranges_text(layers.get((cfg, scope)) or ()) if scope != "all" else "",
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


def _headline(results: pd.DataFrame, basis: str) -> pd.DataFrame:
    return results[(results["scope"] == "all") & (results["phase"] == "request")
                   & (results["unit"] == "generated") & (results["basis"] == basis)]


def pareto_configs(results: pd.DataFrame, opts: Options) -> list[str]:
    h = _headline(results, opts.energy_basis)
    mask = epimod.pareto_front(h["accuracy"].to_numpy(), h["j_per_token_median"].to_numpy())
    front = set(h["config"].to_numpy()[mask])
    results["pareto"] = pd.array([pd.NA] * len(results), dtype="boolean")
    known = h.index[np.isfinite(h["accuracy"].to_numpy(np.float64))
                    & np.isfinite(h["j_per_token_median"].to_numpy(np.float64))]
    results.loc[known, "pareto"] = results.loc[known, "config"].isin(front).to_numpy()
    return sorted(front)


def matched_pairs(results: pd.DataFrame, ppl: dict[str, float], opts: Options) -> list[dict]:
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


def savings_table(results: pd.DataFrame, rep: pd.DataFrame, verdicts: pd.DataFrame,
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


def phase_breakdown(infos: list[RunInfo], rep: pd.DataFrame, verdicts: pd.DataFrame,
               opts: Options) -> pd.DataFrame:
    """Per config, per request (scope all, gross): prefill, decode, idle share, in mJ."""
    valid = valid_repeats(rep, verdicts)
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
