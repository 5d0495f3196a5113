"""Prefill J per prompt token by regression across requests: a figure at any sample rate.

A prefill of 0.1–0.4 s holds fewer than 2 meter samples at 10–20 Hz, so its own energy (and
the direct J/prompt-token figure) is often null. Whole requests are long enough to measure, and
the prompt set varies prompt length (32–256 tokens), so across requests

    E_request = a + b · n_prompt + c · n_generated

separates the two: b is the energy each extra prompt token adds (J per prompt token), c each
extra generated token. Ordinary least squares over the valid runs' requests of a configuration
(scope "all", gross energy); the 95 % interval of b uses HC3 heteroscedasticity-robust standard
errors and Student-t with n − 3 degrees of freedom (long requests vary more than short ones).
Assumptions: energy linear in the token counts (attention cost grows with context, which a
curvature would show in the residuals); requests independent.

b is a marginal figure: equal to the direct prefill J/prompt-token when prefill energy is
proportional to prompt length, smaller when each prefill also carries a fixed cost (then in a).
Where the direct figure exists both are reported and compared.

Real runs suppress end-of-sequence and generate exactly `--tokens` per request, so
n_generated has no spread and the three-term design is singular. Then the generated-token term
is dropped (its constant energy falls into a): E_request = a + b · n_prompt, Student-t with
n − 2 degrees of freedom, and `method` says the term was dropped and why.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from host.analysis.headline import headline_rows
from host.analysis.intervals import student_t_ppf
from host.analysis.vocabulary import SCOPE_ALL, EnergyBasis, Phase, TokenUnit, WindowKind

METHOD = ("estimate: OLS of request energy on prompt and generated tokens across requests "
          "(slope = marginal J per prompt token); 95 % interval from HC3 robust SE, t(n − 3)")
METHOD_PROMPT_ONLY = (
    "estimate: OLS of request energy on prompt tokens across requests (slope = marginal J per "
    "prompt token; every request generated the same number of tokens, so that term is "
    "dropped and its energy is in the intercept); 95 % interval from HC3 robust SE, t(n − 2)")
COLUMNS = ["config", "n_requests", "j_per_prompt_token", "ci_lo", "ci_hi",
           "j_per_generated_token", "gen_ci_lo", "gen_ci_hi", "intercept_j", "r2",
           "prompt_tokens_min", "prompt_tokens_max", "direct_j_per_prompt_token",
           "direct_minus_regression_rel", "agrees_with_direct", "method", "power_source",
           "reason"]


def ols_hc3(x: np.ndarray, y: np.ndarray, level: float = 0.95
            ) -> tuple[np.ndarray, np.ndarray, np.ndarray, float]:
    """(coefficients, lo, hi, r²) of y = X·β with HC3 robust t intervals."""
    n, p = x.shape
    xtx_inv = np.linalg.inv(x.T @ x)
    beta = xtx_inv @ x.T @ y
    resid = y - x @ beta
    h = np.einsum("ij,jk,ik->i", x, xtx_inv, x)
    w = resid ** 2 / np.maximum(1.0 - h, 1e-12) ** 2
    cov = xtx_inv @ (x.T * w) @ x @ xtx_inv
    se = np.sqrt(np.maximum(np.diag(cov), 0.0))
    half = student_t_ppf(0.5 + level / 2.0, n - p) * se
    ss_tot = float(np.sum((y - y.mean()) ** 2))
    r2 = 1.0 - float(np.sum(resid ** 2)) / ss_tot if ss_tot > 0 else float("nan")
    return beta, beta - half, beta + half, r2


def prefill_regression(win: pd.DataFrame, verdicts: pd.DataFrame, results: pd.DataFrame,
                       *, level: float = 0.95) -> pd.DataFrame:
    """One row per configuration: regression J/prompt-token with its interval and cross-check."""
    ok_runs = verdicts[(verdicts["phase"] == WindowKind.REQUEST) & verdicts["valid"]]["run_id"]
    req = win[(win["kind"] == WindowKind.REQUEST) & (win["scope"] == SCOPE_ALL)]
    rows = []
    prefill_rows = headline_rows(results, EnergyBasis.GROSS, phase=Phase.PREFILL,
                                 unit=TokenUnit.PROMPT)
    for cfg in dict.fromkeys(win["config"]):
        g = req[(req["config"] == cfg) & req["run_id"].isin(ok_runs)]
        y = g["energy_j"].to_numpy(np.float64)
        npr = g["n_prompt_tokens"].to_numpy(np.float64, na_value=np.nan)
        ngen = g["n_generated_tokens"].to_numpy(np.float64, na_value=np.nan)
        keep = np.isfinite(y) & np.isfinite(npr) & np.isfinite(ngen)
        y, npr, ngen = y[keep], npr[keep], ngen[keep]
        d = prefill_rows[prefill_rows["config"] == cfg]
        direct = float(d["j_per_token_median"].iloc[0]) if len(d) else float("nan")
        nan = float("nan")
        row: dict[str, object] = dict.fromkeys(COLUMNS, nan)
        row.update(config=cfg, n_requests=len(y), direct_j_per_prompt_token=direct,
                   method=METHOD, reason="", agrees_with_direct=None,
                   power_source=str(req[req["config"] == cfg]["power_source"].iloc[0])
                   if (req["config"] == cfg).any() else "",
                   prompt_tokens_min=float(npr.min()) if len(npr) else nan,
                   prompt_tokens_max=float(npr.max()) if len(npr) else nan)
        gen_varies = len(ngen) > 0 and np.ptp(ngen) > 0
        x = np.column_stack([np.ones(len(y)), npr, ngen] if gen_varies
                            else [np.ones(len(y)), npr])
        p = x.shape[1]
        row["method"] = METHOD if gen_varies else METHOD_PROMPT_ONLY
        if len(y) < p + 2:
            row["reason"] = (f"{len(y)} valid requests: a regression on {p} terms needs at "
                             f"least {p + 2}")
        elif np.ptp(npr) == 0:
            row["reason"] = "every request has the same prompt length: no slope to estimate"
        elif np.linalg.matrix_rank(x) < p:
            row["reason"] = "prompt and generated token counts are collinear"
        else:
            beta, lo, hi, r2 = ols_hc3(x, y, level)
            row.update(j_per_prompt_token=float(beta[1]), ci_lo=float(lo[1]),
                       ci_hi=float(hi[1]), intercept_j=float(beta[0]), r2=r2)
            if gen_varies:
                row.update(j_per_generated_token=float(beta[2]), gen_ci_lo=float(lo[2]),
                           gen_ci_hi=float(hi[2]))
            if np.isfinite(direct):
                row["direct_minus_regression_rel"] = (direct - beta[1]) / beta[1]
                row["agrees_with_direct"] = bool(lo[1] <= direct <= hi[1])
        rows.append(row)
    return pd.DataFrame(rows, columns=COLUMNS)
