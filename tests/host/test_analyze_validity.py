"""What `epi analyze` claims: power source labels, idle repeats, interval labels, scoped
verdicts, the prefill regression estimate, paired savings — on files written per
docs/formats.md by the test fixtures (tests/host/conftest.py), not by the project's writers.
"""

from __future__ import annotations

import json
import sys
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from epi import cli as epi_cli
from host.analysis.pipeline import Options, analyze
from tests.host.conftest import LEVELS, Schedule, Steps, make_schedule, write_run, write_trace

NS = 1_000_000_000
# the `synth_tools` namespace of tests/host/conftest.py, for the module-scoped fixtures
SYNTH = SimpleNamespace(NS=NS, Steps=Steps, Schedule=Schedule, make_schedule=make_schedule,
                        write_trace=write_trace, write_run=write_run, LEVELS=LEVELS)


def run_cli(monkeypatch, capsys, *args) -> tuple[int, str, str]:
    monkeypatch.setattr(sys, "argv", ["epi", "analyze", *map(str, args)])
    code = 0
    try:
        epi_cli.main()
    except SystemExit as exc:
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


def _set_meta(tdir, **fields) -> None:
    for meta in tdir.glob("seg-*.meta.json"):
        m = json.loads(meta.read_text())
        meta.write_text(json.dumps({**m, **fields}))


# --------------------------------------------------------------------------- power source
def test_modelled_power_is_labelled_in_summary_and_every_table(synth_run, tmp_path,
                                                               monkeypatch, capsys):
    tdir, rdir, _, _ = synth_run()
    _set_meta(tdir, emulated=True, power_model={"kind": "activity", "modelled": True})
    out = tmp_path / "out"
    code, stdout, err = run_cli(monkeypatch, capsys, rdir, "--trace", tdir, "--out", out,
                                "--baseline", "q4_k_m")
    assert code == 0, err
    assert stdout.splitlines()[0].startswith("POWER IS MODELLED, NOT MEASURED on channel 0")
    table = stdout.split("Per configuration")[1]
    assert "modelled (ActivityModel)" in table
    for name in ("results.csv", "windows.csv", "repeats.csv", "runs.csv", "savings.csv",
                 "prefill_regression.csv"):
        df = pd.read_csv(out / name)
        assert "power_source" in df.columns, name
        assert (df["power_source"] == "modelled (ActivityModel)").all(), name
    doc = json.loads((out / "results.json").read_text())
    assert doc["power_sources"] == {"0": "modelled (ActivityModel)"}


def test_measured_power_says_measured_and_no_banner(synth_run, tmp_path, monkeypatch, capsys):
    tdir, rdir, _, _ = synth_run()
    _set_meta(tdir, emulated=False, power_model=None)
    code, stdout, err = run_cli(monkeypatch, capsys, rdir, "--trace", tdir, "--out",
                                tmp_path / "o")
    assert code == 0, err
    assert "MODELLED" not in stdout and "modelled" not in stdout
    res = pd.read_csv(tmp_path / "o" / "results.csv")
    assert (res["power_source"] == "measured").all()


def test_per_channel_models_label_each_node(synth_run):
    tdir, rdir, _, _ = synth_run(channels=2)
    _set_meta(tdir, emulated=True, power_model={
        "kind": "per_channel", "modelled": True,
        "channels": {"0": {"kind": "scripted", "modelled": True},
                     "1": {"kind": "activity", "modelled": True}}})
    a = analyze([rdir], tdir)
    res = a.results.drop_duplicates("scope").set_index("scope")["power_source"]
    assert res["n0"] == "modelled (scripted profile)"
    assert res["n1"] == "modelled (ActivityModel)"
    assert res["all"] == "modelled (scripted profile) + modelled (ActivityModel)"


# --------------------------------------------------------------------------- idle repeat
def test_idle_windows_carry_their_repeat(synth_run, tmp_path, monkeypatch, capsys):
    tdir, rdir, _, _ = synth_run()
    # a second idle window before repeat 2 (events.csv says which repeat it precedes)
    ev = (rdir / "events.csv").read_text().splitlines()
    a = analyze([rdir], tdir)
    idle = a.windows[(a.windows["kind"] == "idle") & (a.windows["scope"] == "all")]
    assert idle["repeat"].tolist() == [0]
    i = next(k for k, line in enumerate(ev) if line.split(",")[1] == "2"
             and ",request_start," in line)
    t_req = int(ev[i].split(",")[7])
    prev_end = int(ev[i - 2].split(",")[7])  # request_end of the previous request
    s, e = prev_end + 10_000_000, t_req - 10_000_000
    ev[i:i] = [f",2,0,,idle_start,,,{s},{s + 1_700_000_000 * NS}",
               f",2,0,,idle_end,,,{e},{e + 1_700_000_000 * NS}"]
    (rdir / "events.csv").write_text("\n".join(ev) + "\n")
    out = tmp_path / "o"
    code, _, err = run_cli(monkeypatch, capsys, rdir, "--trace", tdir, "--out", out)
    assert code == 0, err
    w = pd.read_csv(out / "windows.csv")
    idle = w[(w["kind"] == "idle") & (w["scope"] == "all")]
    assert idle["repeat"].tolist() == [0, 2]


# --------------------------------------------------------------------------- intervals
def test_no_interval_is_labelled_95_percent_unless_it_is_one(synth_run, tmp_path, monkeypatch,
                                                             capsys):
    tdir, rdir, _, _ = synth_run()  # 3 repeats
    out = tmp_path / "o"
    code, stdout, err = run_cli(monkeypatch, capsys, rdir, "--trace", tdir, "--out", out)
    assert code == 0, err
    assert "95% bootstrap" not in stdout and "95 % bootstrap" not in stdout
    assert "no 95 % interval of the median exists from n=3 repeats" in stdout
    row = next(ln for ln in stdout.splitlines() if ln.startswith("q4_k_m"))
    assert "] 75 % n=3" in row  # the J/token interval shows its real coverage and n
    res = pd.read_csv(out / "results.csv")
    h = res[(res["scope"] == "all") & (res["phase"] == "request") & (res["unit"] == "generated")]
    assert (h["ci_coverage"] == 0.75).all() and (~h["ci_level_met"]).all()
    assert (h["n_repeats"] == 3).all() and h["ci_method"].str.contains("order-statistic").all()
    # the t interval of the mean is a real 95 % interval at n = 3, and labelled so
    assert (h["j_per_token_mean_ci_lo"] < h["j_per_token_mean"]).all()


# --------------------------------------------------------------------------- prefill regression
def _varied_schedule(synth_tools, t0_ns: int, *, s_per_prompt_token: float,
                     s_per_gen_token: float, n_repeats: int = 3, seed: int = 4):
    """Prompts of 32–256 tokens; prefill and decode durations proportional to token counts."""
    rng = np.random.default_rng(seed)
    lengths = [32, 64, 96, 128, 160, 192, 224, 256]
    idle = (t0_ns, t0_ns + 3 * NS)
    t = idle[1] + NS // 2
    reqs, rid = [], 0
    for rep in [-1, *range(n_repeats)]:
        for p, n_prompt in enumerate(lengths):
            n_gen = int(rng.integers(12, 24))
            pf = int(n_prompt * s_per_prompt_token * NS)
            dc = int((n_gen - 1) * s_per_gen_token * NS)
            reqs.append({"request_id": rid, "repeat": rep, "warmup": int(rep < 0),
                         "prompt_id": f"p{p}", "start": t, "first": t + pf, "end": t + pf + dc,
                         "n_prompt": n_prompt, "n_gen": n_gen})
            rid += 1
            t += pf + dc + int(0.3 * NS)
    return synth_tools.Schedule(idle, reqs)


def _regression_run(tmp_path, synth_tools, period_s: float):
    sched = _varied_schedule(synth_tools, 500 * NS, s_per_prompt_token=0.0015,
                             s_per_gen_token=0.05)
    prof = sched.profile(idle_w=3.0, prefill_w=8.0, decode_w=6.0)
    tdir = synth_tools.write_trace(tmp_path / f"trace{period_s}", {0: prof}, 498 * NS,
                                   sched.requests[-1]["end"] + 3 * NS, period_s=period_s,
                                   jitter_ns=0)
    rdir = synth_tools.write_run(tmp_path / f"run{period_s}", sched)
    return tdir, rdir


def test_prefill_j_per_prompt_token_has_a_value_at_20_hz(tmp_path, synth_tools):
    """Prefills of 0.05–0.38 s: the direct figure is null at 20 Hz, the regression is not."""
    tdir, rdir = _regression_run(tmp_path, synth_tools, 0.05)
    a = analyze([rdir], tdir)
    res = a.results.set_index(["scope", "phase", "unit", "basis"])
    assert np.isnan(res.loc[("all", "prefill", "prompt", "gross"), "j_per_token_median"])
    reg = a.prefill_regression.set_index("config").loc["q4_k_m"]
    truth = 8.0 * 0.0015  # prefill power × seconds per prompt token
    assert reg["j_per_prompt_token"] == pytest.approx(truth, rel=0.02)
    assert reg["ci_lo"] <= truth <= reg["ci_hi"]
    assert reg["method"].startswith("estimate: OLS") and reg["n_requests"] == 24
    assert reg["j_per_generated_token"] == pytest.approx(6.0 * 0.05, rel=0.02)
    row = res.loc[("all", "prefill", "prompt", "gross")]
    assert row["prefill_regression_j_per_token"] == reg["j_per_prompt_token"]


def test_prefill_regression_agrees_with_the_direct_figure_where_both_exist(tmp_path,
                                                                           synth_tools):
    tdir, rdir = _regression_run(tmp_path, synth_tools, 0.005)  # 200 Hz: direct exists
    a = analyze([rdir], tdir)
    reg = a.prefill_regression.set_index("config").loc["q4_k_m"]
    assert np.isfinite(reg["direct_j_per_prompt_token"])
    assert reg["direct_j_per_prompt_token"] == pytest.approx(8.0 * 0.0015, rel=0.01)
    assert abs(reg["direct_minus_regression_rel"]) < 0.01
    assert reg["agrees_with_direct"] in (True, False)  # reported, with the interval


def test_prefill_regression_refuses_a_fixed_prompt_length(synth_run):
    tdir, rdir, _, _ = synth_run()  # every prompt has 20 tokens
    a = analyze([rdir], tdir)
    reg = a.prefill_regression.iloc[0]
    assert np.isnan(reg["j_per_prompt_token"]) and "same prompt length" in reg["reason"]


# --------------------------------------------------------------------------- load lag
def _lagged_run(tmp_path, synth_tools, lag_ms: float):
    """Power edges `lag_ms` after the token stamps (a meter or supply that trails the load)."""
    sched = synth_tools.make_schedule(500 * NS, n_repeats=3, prompts=3)
    sh = round(lag_ms * 1e6)
    late = synth_tools.Schedule(sched.idle, [
        {**r, "start": r["start"] + sh, "first": r["first"] + sh, "end": r["end"] + sh}
        for r in sched.requests])
    prof = late.profile(idle_w=3.0, prefill_w=8.0, decode_w=6.0)
    tdir = synth_tools.write_trace(tmp_path / f"trace{lag_ms}", {0: prof}, 498 * NS,
                                   sched.requests[-1]["end"] + 3 * NS, period_s=0.05)
    rdir = synth_tools.write_run(tmp_path / f"run{lag_ms}", sched)
    return tdir, rdir, sched, prof


@pytest.fixture(scope="module")
def lagged_40ms(tmp_path_factory):
    """`_lagged_run` at 40 ms and its analysis with the default options, once for the tests
    that read them, not once per test; nothing may write into its files."""
    tdir, rdir, sched, prof = _lagged_run(tmp_path_factory.mktemp("lag40"), SYNTH, 40.0)
    return SimpleNamespace(tdir=tdir, rdir=rdir, sched=sched, prof=prof,
                           plain=analyze([rdir], tdir))


def test_load_lag_is_estimated_from_the_trace_and_flagged(lagged_40ms):
    a = lagged_40ms.plain
    lag = a.lag.iloc[0]
    assert lag["lag_ms"] == pytest.approx(40.0, abs=1.0)
    assert lag["lag_ci_lo_ms"] <= 40.0 <= lag["lag_ci_hi_ms"] and lag["resolved"]
    assert lag["step_prefill_w"] == pytest.approx(5.0, rel=0.02)
    assert lag["correction_applied_ms"] == 0.0
    v = a.verdicts.set_index("phase")
    # 40 ms × (5 W + 2 W) = 0.28 J of a 4.8 J prefill: over the 1 % budget
    assert not v.loc["prefill", "valid"] and "load lag (ch0 +40" in v.loc["prefill", "reasons"]
    assert "--lag auto" in v.loc["prefill", "reasons"]
    assert v.loc["idle", "valid"]


def test_lag_auto_corrects_and_labels(lagged_40ms):
    tdir, rdir, sched, prof = (lagged_40ms.tdir, lagged_40ms.rdir, lagged_40ms.sched,
                               lagged_40ms.prof)
    a = analyze([rdir], tdir, Options(lag="auto"))
    assert a.verdicts["valid"].all(), a.verdicts["reasons"].tolist()
    w = a.windows[(a.windows["scope"] == "all") & (a.windows["kind"] == "prefill")]
    truth = [prof.energy(r["start"] + 40_000_000, r["first"] + 40_000_000)
             for r in sched.requests if not r["warmup"]]
    np.testing.assert_allclose(w["energy_j"], truth, rtol=2e-3)
    np.testing.assert_allclose(w["lag_correction_ms"], 40.0, atol=1.0)
    assert a.results["lag_correction"].str.startswith("auto: ch0 +").all()
    plain = lagged_40ms.plain
    wp = plain.windows[(plain.windows["scope"] == "all") & (plain.windows["kind"] == "prefill")]
    assert np.max(np.abs(wp["energy_j"].to_numpy() / truth - 1)) > 0.02  # uncorrected: off


def test_no_lag_is_not_flagged(tmp_path, synth_tools):
    tdir, rdir, _, _ = _lagged_run(tmp_path, synth_tools, 0.0)
    a = analyze([rdir], tdir)
    lag = a.lag.iloc[0]
    assert lag["lag_ci_lo_ms"] <= 0.0 <= lag["lag_ci_hi_ms"] and not lag["resolved"]
    assert a.verdicts["valid"].all(), a.verdicts["reasons"].tolist()


# --------------------------------------------------------------------------- paired comparisons
def _interleaved_campaign(tmp_path, synth_tools):
    """3 rounds, each one run of q4 then one of q8 (2 repeats each); q8 draws 3 % more, and
    every round draws differently (the room warms and cools: ×1.00, ×1.10, ×0.95)."""
    cursor = 500 * NS
    times, levels, runs = [cursor - 60 * NS], [3.0], []
    for r, factor in enumerate((1.00, 1.10, 0.95)):
        for cfg, extra, sha in (("q4", 1.00, "1" * 64), ("q8", 1.03, "2" * 64)):
            sched = synth_tools.make_schedule(cursor, n_repeats=2, prompts=2, seed=10 * r + 1)
            prof = sched.profile(idle_w=3.0 * factor, prefill_w=8.0 * factor * extra,
                                 decode_w=6.0 * factor * extra)
            times += list(prof.t_ns[1:])
            levels += list(prof.level_w[1:])
            runs.append(synth_tools.write_run(tmp_path / f"{cfg}_round{r}", sched, map_id=cfg,
                                              sha256=sha, run_id=f"{cfg}-round{r}"))
            cursor = sched.requests[-1]["end"] + 5 * NS
    prof = synth_tools.Steps(np.array(times, np.int64), np.array(levels))
    tdir = synth_tools.write_trace(tmp_path / "trace", {0: prof}, 495 * NS, cursor)
    return tdir, runs


def _accuracy_with_items(path, n_items: int = 200, flips: int = 10):
    rng = np.random.default_rng(3)
    a = (rng.random(n_items) < 0.5).astype(int)
    b = a.copy()
    b[np.flatnonzero(a == 0)[:flips]] = 1
    ids = [f"hs{k}" for k in range(n_items)]

    def entry(sha, correct):
        acc = float(np.mean(correct))
        return {"path": f"{sha[0]}.gguf", "sha256": sha, "map_id": None, "perplexity": None,
                "benchmarks": {"hellaswag": {
                    "n": n_items, "accuracy_norm": acc, "ci95_norm": [acc - 0.07, acc + 0.07],
                    "items": {"ids": ids, "accuracy": correct.tolist(),
                              "accuracy_norm": correct.tolist(),
                              "accuracy_token_norm": correct.tolist()}}},
                "composite": {"accuracy": acc, "ci95": [acc - 0.07, acc + 0.07],
                              "weights": {"hellaswag": 1.0}, "metric": "accuracy_norm"}}

    path.write_text(json.dumps({"format": "epi-accuracy", "format_version": 1,
                                "models": [entry("1" * 64, a), entry("2" * 64, b)]}))
    return path


@pytest.fixture(scope="module")
def interleaved(tmp_path_factory):
    """`_interleaved_campaign`'s trace and runs, written once for the two tests below (each
    analyses them with its own accuracy file); nothing may write into them."""
    return _interleaved_campaign(tmp_path_factory.mktemp("interleaved"), SYNTH)


def test_paired_savings_and_accuracy_resolve_what_separate_intervals_hide(tmp_path,
                                                                          interleaved):
    tdir, runs = interleaved
    acc = _accuracy_with_items(tmp_path / "acc.json")
    a = analyze(runs, tdir, Options(baseline="q4"), accuracy_file=acc)
    assert a.verdicts["valid"].all(), a.verdicts["reasons"].tolist()
    h = a.results[(a.results["scope"] == "all") & (a.results["phase"] == "request")
                  & (a.results["unit"] == "generated") & (a.results["basis"] == "gross")
                  ].set_index("config")
    # the separate intervals (6 repeats each: a real ≥ 95 % interval) overlap ...
    assert (h["n_repeats"] == 6).all() and h["ci_level_met"].all()
    assert h.loc["q8", "j_per_token_ci_lo"] < h.loc["q4", "j_per_token_ci_hi"]
    # ... the per-round pairs resolve q8's 3 % extra energy
    s = a.savings.set_index("config").loc["q8"]
    # 3 rounds of 2 repeats: the rounds are the pairs (df = 2), not the 6 repeats
    assert s["energy_ci_method"].startswith("paired by round") and s["n_pairs"] == 3
    assert s["energy_saving_pct"] == pytest.approx(-3.0, abs=0.3)
    assert s["energy_saving_pct_ci_hi"] < 0 and s["energy_distinguishable"]
    # accuracy per item: 10 more right, all 10 discordant → McNemar p = 2/2¹⁰
    assert s["accuracy_delta"] == pytest.approx(10 / 200)
    assert s["accuracy_mcnemar_p"] == pytest.approx(2 / 1024)
    assert s["accuracy_distinguishable"] and s["accuracy_delta_ci_lo"] > 0
    c = a.comparisons.set_index("comparison").loc["savings vs baseline"]
    assert c["verdict"] == "q8 uses more energy than q4; q8 is more accurate"


def test_configurations_that_cannot_be_told_apart_are_said_to(tmp_path, interleaved):
    tdir, runs = interleaved
    acc = _accuracy_with_items(tmp_path / "acc.json", flips=0)  # identical outcomes
    a = analyze(runs, tdir, Options(baseline="q4"), accuracy_file=acc)
    c = a.comparisons.set_index("comparison").loc["savings vs baseline"]
    assert c["accuracy_delta"] == 0.0 and not c["accuracy_distinguishable"]
    assert "cannot be told apart on accuracy" in c["verdict"]


@pytest.mark.parametrize("period_s", [0.1, 0.05])
@pytest.mark.parametrize("method", ["counter", "trapezoid"])
def test_lag_auto_corrects_a_30ms_lag_to_the_closed_form(tmp_path, synth_tools, period_s,
                                                        method):
    """A load 30 ms behind its token stamps, sampled at 10 and 20 Hz: after --lag auto each
    prefill window's energy is the profile's own over the lagged window (closed form, from
    the profile, not the analysis), within 1 %, labelled corrected, and the windows record
    the energy the shift moved."""
    sched = synth_tools.make_schedule(500 * NS, n_repeats=3, prompts=3)
    sh = 30_000_000
    late = synth_tools.Schedule(sched.idle, [
        {**r, "start": r["start"] + sh, "first": r["first"] + sh, "end": r["end"] + sh}
        for r in sched.requests])
    prof = late.profile(idle_w=3.0, prefill_w=8.0, decode_w=6.0)
    tdir = synth_tools.write_trace(tmp_path / "trace", {0: prof}, 498 * NS,
                                   sched.requests[-1]["end"] + 3 * NS, period_s=period_s)
    rdir = synth_tools.write_run(tmp_path / "run", sched)
    a = analyze([rdir], tdir, Options(lag="auto", energy_method=method))
    w = a.windows[(a.windows["scope"] == "all") & (a.windows["kind"] == "prefill")]
    truth = np.array([prof.energy(r["start"] + sh, r["first"] + sh)
                      for r in sched.requests if not r["warmup"]])
    np.testing.assert_allclose(w["energy_j"], truth, rtol=0.01)
    assert a.results["lag_correction"].str.startswith("auto: ch0 +").all()
    assert (w["lag_energy_moved_j"].abs() > 1e-9).any()  # what the shift moved, recorded
    assert a.verdicts.set_index("phase").loc["prefill", "valid"]


def test_a_shift_that_moves_no_energy_is_not_called_a_correction(monkeypatch, lagged_40ms):
    """Break the shift on purpose (an edge model blind to it): the analysis must not label
    the figures corrected, and the lag gate refuses the prefill as uncorrected, saying why."""
    from host.analysis import windows as win_mod

    real = win_mod.window_energy
    first_edges: dict[int, tuple[object, object]] = {}

    def blind(series, t0, t1, **kw):  # every call measures the first edges it was given
        key = id(series)
        first_edges.setdefault(key, (t0.copy(), t1.copy()))
        return real(series, *first_edges[key], **kw)

    monkeypatch.setattr(win_mod, "window_energy", blind)
    a = analyze([lagged_40ms.rdir], lagged_40ms.tdir, Options(lag="auto"))
    assert not a.results["lag_correction"].str.startswith("auto: ch0 +").any()
    v = a.verdicts.set_index("phase")
    assert not v.loc["prefill", "valid"]
    assert "--lag auto not applied (the shift moves no window's energy" in \
        v.loc["prefill", "reasons"]
