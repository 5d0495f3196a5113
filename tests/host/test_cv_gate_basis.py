"""The repeat-CV gate checks the basis the analysis reports (DESIGN: "CV on every reported
figure"): with `energy_basis = "net"` a run whose net J/token is steady is valid even when a
busy machine stretched its wall time (gross J/token carries the idle floor × that time).

The synthetic run: every decode draws the same net energy (6 J above a 3 W idle floor), but
repeat 1's windows take 30 % longer than repeat 0's and repeat 2's 15 % less, so the decode
power is idle + 6 J / duration. Closed forms: net J/token is 6 J / 15 tokens in every repeat
(CV 0); gross J/token = (3 W · d + 6 J) / 15, whose CV follows from the durations alone.
"""

from __future__ import annotations

import numpy as np
import pytest

from host.analysis.pipeline import Options, analyze

NS = 1_000_000_000
IDLE_W = 3.0
NET_DECODE_J = 6.0
NET_PREFILL_J = 4.0
STRETCH = {0: 1.0, 1: 1.3, 2: 0.85}  # repeat → wall-time factor (a busy machine's doing)


def _stretched_run(tmp_path, synth_tools):
    sched = synth_tools.make_schedule(500 * NS, n_repeats=3, prompts=2, n_gen=16, n_prompt=20,
                                      seed=3)
    t = sched.idle[1] + int(0.4 * NS)
    times, levels = [sched.idle[0] - 60 * NS], [IDLE_W]
    for r in sched.requests:
        k = STRETCH.get(r["repeat"], 1.0)
        pf, dc = int(0.6 * k * NS), int(1.5 * k * NS)
        r["start"], r["first"], r["end"] = t, t + pf, t + pf + dc
        times += [r["start"], r["first"], r["end"]]
        levels += [IDLE_W + NET_PREFILL_J / (pf / NS), IDLE_W + NET_DECODE_J / (dc / NS), IDLE_W]
        t = r["end"] + int(0.4 * NS)
    prof = synth_tools.Steps(np.array(times, dtype=np.int64), np.array(levels))
    tdir = synth_tools.write_trace(tmp_path / "trace", {0: prof}, 498 * NS, t + 3 * NS,
                                   period_s=0.05)
    rdir = synth_tools.write_run(tmp_path / "run", sched)
    return tdir, rdir, sched


def _gross_cv(sched) -> float:
    """CV over repeats of gross decode J/token, from the schedule (closed form)."""
    per_rep = {}
    for r in sched.requests:
        if r["warmup"]:
            continue
        d = (r["end"] - r["first"]) / NS
        e, n = per_rep.get(r["repeat"], (0.0, 0))
        per_rep[r["repeat"]] = (e + IDLE_W * d + NET_DECODE_J, n + r["n_gen"] - 1)
    v = np.array([e / n for e, n in per_rep.values()])
    return float(np.std(v, ddof=1) / np.mean(v))


def test_net_basis_gates_the_net_repeats(tmp_path, synth_tools):
    tdir, rdir, _ = _stretched_run(tmp_path, synth_tools)
    a = analyze([rdir], tdir, Options(energy_basis="net"))
    v = a.verdicts.set_index("phase")
    for phase in ("prefill", "decode", "request"):
        assert v.loc[phase, "valid"], v.loc[phase, "reasons"]
        assert v.loc[phase, "cv"] < 0.005  # net J/token is the same in every repeat
    net = a.repeats[(a.repeats["scope"] == "all") & (a.repeats["phase"] == "decode")
                    & (a.repeats["unit"] == "generated") & (a.repeats["basis"] == "net")]
    np.testing.assert_allclose(net["j_per_token"], NET_DECODE_J / 15, rtol=5e-3)


def test_gross_basis_still_gates_gross_and_names_it(tmp_path, synth_tools):
    tdir, rdir, sched = _stretched_run(tmp_path, synth_tools)
    want = _gross_cv(sched)
    assert want > 0.05  # the stretch makes gross J/token spread
    a = analyze([rdir], tdir, Options())  # gross, the default
    v = a.verdicts.set_index("phase")
    assert not v.loc["decode", "valid"]
    assert v.loc["decode", "cv"] == pytest.approx(want, rel=0.02)
    assert f"repeat CV {want:.1%} of gross J/token above 3.0%" in v.loc["decode", "reasons"]


def test_the_summary_prints_the_cv_of_the_basis_it_gates(tmp_path, synth_tools):
    """The console table's CV column is the one the gate checked: with net reporting, the
    request's net CV (≈ 0 here), labelled net, not the stretched gross CV."""
    from host.analysis.summary import summary_text

    tdir, rdir, _ = _stretched_run(tmp_path, synth_tools)
    a = analyze([rdir], tdir, Options(energy_basis="net"))
    text = summary_text(a)
    assert "CV % (net)" in text
    head = text.splitlines()
    row = next(line for line in head if line.startswith(a.runs[0].config + " "))
    net = a.results[(a.results["scope"] == "all") & (a.results["phase"] == "request")
                    & (a.results["unit"] == "generated") & (a.results["basis"] == "net")]
    gross = a.results[(a.results["scope"] == "all") & (a.results["phase"] == "request")
                      & (a.results["unit"] == "generated") & (a.results["basis"] == "gross")]
    assert float(gross["j_per_token_cv"].iloc[0]) > 0.05
    assert f"{float(net['j_per_token_cv'].iloc[0]) * 100:.2f}" in row.split()
    assert f"{float(gross['j_per_token_cv'].iloc[0]) * 100:.2f}" not in row.split()


def test_a_refused_run_says_how_much_its_time_per_token_varied(tmp_path, synth_tools):
    """The CV reason carries the same repeats' CV of seconds per token (a machine whose speed
    varies shows the two together); expected from the schedule's decode durations."""
    tdir, rdir, sched = _stretched_run(tmp_path, synth_tools)
    per_rep: dict[int, tuple[float, int]] = {}
    for r in sched.requests:
        if not r["warmup"]:
            d, n = per_rep.get(r["repeat"], (0.0, 0))
            per_rep[r["repeat"]] = (d + (r["end"] - r["first"]) / NS, n + r["n_gen"] - 1)
    s_per_token = np.array([d / n for d, n in per_rep.values()])
    want = float(np.std(s_per_token, ddof=1) / np.mean(s_per_token))
    a = analyze([rdir], tdir, Options())  # gross: refused for its spread
    reason = a.verdicts.set_index("phase").loc["decode", "reasons"]
    assert f"(time per token varied {want:.1%})" in reason
