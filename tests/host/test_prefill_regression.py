"""Prefill J per prompt token by regression when every request generates the same number of
tokens — what real runs produce (the runner suppresses EOS and generates exactly `--tokens`).

Files are written per docs/formats.md by the test fixtures (tests/host/conftest.py); the
expected slope is closed form: prefill power × seconds per prompt token.
"""

from __future__ import annotations

import sys

import numpy as np
import pytest

from epi import cli as epi_cli
from host.analysis.intervals import student_t_ppf
from host.analysis.pipeline import analyze
from host.analysis.prefill_regression import METHOD_PROMPT_ONLY, ols_hc3

NS = 1_000_000_000
PREFILL_W, DECODE_W, IDLE_W = 8.0, 6.0, 3.0
S_PER_PROMPT_TOKEN, S_PER_GEN_TOKEN, N_GEN = 0.0015, 0.05, 16
LENGTHS = [32, 64, 96, 128, 160, 192, 224, 256]


def _constant_gen_run(tmp_path, synth_tools, period_s: float = 0.05):
    """Prompts of 32–256 tokens, every request N_GEN generated tokens (as `epi run` does)."""
    idle = (500 * NS, 503 * NS)
    t = idle[1] + NS // 2
    reqs, rid = [], 0
    for rep in [-1, 0, 1, 2]:
        for p, n_prompt in enumerate(LENGTHS):
            pf = int(n_prompt * S_PER_PROMPT_TOKEN * NS)
            dc = int((N_GEN - 1) * S_PER_GEN_TOKEN * NS)
            reqs.append({"request_id": rid, "repeat": rep, "warmup": int(rep < 0),
                         "prompt_id": f"p{p}", "start": t, "first": t + pf, "end": t + pf + dc,
                         "n_prompt": n_prompt, "n_gen": N_GEN})
            rid += 1
            t += pf + dc + int(0.3 * NS)
    sched = synth_tools.Schedule(idle, reqs)
    prof = sched.profile(idle_w=IDLE_W, prefill_w=PREFILL_W, decode_w=DECODE_W)
    tdir = synth_tools.write_trace(tmp_path / "trace", {0: prof}, 498 * NS,
                                   reqs[-1]["end"] + 3 * NS, period_s=period_s, jitter_ns=0)
    return tdir, synth_tools.write_run(tmp_path / "run", sched), sched


def test_constant_generated_tokens_at_20_hz_gives_a_prompt_only_fit(tmp_path, synth_tools):
    tdir, rdir, _sched = _constant_gen_run(tmp_path, synth_tools)
    a = analyze([rdir], tdir)
    res = a.results.set_index(["scope", "phase", "unit", "basis"])
    # the direct figure is null at 20 Hz (prefills of 0.05–0.38 s) ...
    assert np.isnan(res.loc[("all", "prefill", "prompt", "gross"), "j_per_token_median"])
    reg = a.prefill_regression.set_index("config").loc["q4_k_m"]
    # ... the regression is not: closed form b = prefill power × s per prompt token
    truth = PREFILL_W * S_PER_PROMPT_TOKEN
    assert reg["j_per_prompt_token"] == pytest.approx(truth, rel=0.02)
    assert reg["ci_lo"] <= reg["j_per_prompt_token"] <= reg["ci_hi"]
    assert reg["method"] == METHOD_PROMPT_ONLY and "t(n − 2)" in reg["method"]
    assert "dropped" in reg["method"] and reg["reason"] == ""
    assert reg["n_requests"] == 3 * len(LENGTHS)
    assert np.isnan(reg["j_per_generated_token"])  # no spread: no per-generated-token slope
    # the intercept holds the constant decode energy: decode power × decode seconds
    assert reg["intercept_j"] == pytest.approx(DECODE_W * (N_GEN - 1) * S_PER_GEN_TOKEN,
                                               rel=0.02)
    row = res.loc[("all", "prefill", "prompt", "gross")]
    assert row["prefill_regression_j_per_token"] == reg["j_per_prompt_token"]
    assert row["prefill_regression_method"] == METHOD_PROMPT_ONLY


def test_prompt_only_fit_uses_n_minus_2_degrees_of_freedom() -> None:
    """Two coefficients: the interval's t quantile has n − 2 df (hand-checked at n = 6)."""
    x = np.column_stack([np.ones(6), [1.0, 2, 3, 4, 5, 6]])
    y = np.array([1.1, 1.9, 3.2, 3.9, 5.1, 6.0])
    beta, _lo, hi, _ = ols_hc3(x, y)
    # HC3 by hand
    xtx_inv = np.linalg.inv(x.T @ x)
    resid = y - x @ beta
    h = np.einsum("ij,jk,ik->i", x, xtx_inv, x)
    cov = xtx_inv @ (x.T * (resid ** 2 / (1 - h) ** 2)) @ x @ xtx_inv
    half = 2.7764451051977987 * np.sqrt(cov[1, 1])  # t(0.975, 4) from tables
    assert student_t_ppf(0.975, 4) == pytest.approx(2.7764451051977987, rel=1e-9)
    assert hi[1] - beta[1] == pytest.approx(half, rel=1e-9)


def test_demo_like_run_prints_the_regression_figure(tmp_path, synth_tools, monkeypatch,
                                                    capsys):
    """End to end through `epi analyze`: the prefill column has a value, marked (regr.)."""
    tdir, rdir, _ = _constant_gen_run(tmp_path, synth_tools)
    monkeypatch.setattr(sys, "argv", ["epi", "analyze", str(rdir), "--trace", str(tdir),
                                      "--out", str(tmp_path / "out")])
    code = 0
    try:
        epi_cli.main()
    except SystemExit as exc:
        code = int(exc.code or 0)
    out = capsys.readouterr().out
    assert code == 0, out
    row = next(ln for ln in out.splitlines() if ln.startswith("q4_k_m"))
    assert "(regr.)" in row and "~0.012" in row
    reg_line = next(ln for ln in out.splitlines() if ln.startswith("q4_k_m") and "24" in ln
                    and "32–256" in ln)
    assert "null" not in reg_line.split("32–256")[1].split()[0]
