"""Tests that catch small, realistic wrong changes a mutation audit found surviving the suite.
Each expected figure is a closed form built into the test's own data."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from epi.formats.trace import infer_period_s
from host.analysis.paired import newcombe_paired_interval
from host.analysis.windows import idle_power


def test_the_inferred_period_is_the_smallest_channel_median() -> None:
    """Two channels at 10 Hz and 2 Hz in one segment: the period is 0.1 s (the fastest
    channel's median spacing), not 0.5 s (the largest median)."""
    rows = [(0, k * 100_000_000) for k in range(21)] + [(1, k * 500_000_000) for k in range(5)]
    columns = {"channel": [c for c, _ in rows], "t_mono_ns": [t for _, t in rows]}
    assert infer_period_s(columns) == pytest.approx(0.1)


def test_idle_power_is_a_ratio_of_sums_not_a_mean_of_ratios() -> None:
    """Two idle windows: 10 J over 10 s and 1 J over 0.1 s. Ratio of sums: 11 J / 10.1 s =
    1.089 W; the mean of ratios would be (1 + 10) / 2 = 5.5 W."""
    win = pd.DataFrame({"kind": ["idle", "idle"], "scope": ["all", "all"],
                        "energy_j": [10.0, 1.0], "duration_s": [10.0, 0.1],
                        "valid": [True, True], "reason": ["", ""]})
    power, _ = idle_power(win)
    assert power["all"] == pytest.approx(11.0 / 10.1)


def _wilson(x: int, n: int, z: float = 1.959963984540054) -> tuple[float, float]:
    p = x / n
    den = 1 + z * z / n
    mid = (p + z * z / (2 * n)) / den
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / den
    return mid - half, mid + half


@pytest.mark.parametrize("table", [(12, 9, 2, 21), (30, 1, 10, 9), (5, 0, 3, 40),
                                   (50, 10, 10, 30)])
def test_newcombe_paired_interval_matches_method_10_written_out(
        table: tuple[int, int, int, int]) -> None:
    """Newcombe (1998), method 10, written out here from the paper for Δ = p_B − p_A: each
    proportion's Wilson limits combined through the phi correlation of the paired table.
    Dropping any of the three terms under the square roots moves a limit."""
    a, b, c, d = table  # both right, A only, B only, both wrong
    n = a + b + c + d
    p_b, p_a = (a + c) / n, (a + b) / n
    lb, ub = _wilson(a + c, n)
    la, ua = _wilson(a + b, n)
    phi = (a * d - b * c) / math.sqrt((a + b) * (c + d) * (a + c) * (b + d))
    theta = p_b - p_a
    lo = theta - math.sqrt((p_b - lb) ** 2 - 2 * phi * (p_b - lb) * (ua - p_a) + (ua - p_a) ** 2)
    hi = theta + math.sqrt((ub - p_b) ** 2 - 2 * phi * (ub - p_b) * (p_a - la) + (p_a - la) ** 2)
    got = newcombe_paired_interval(a, b, c, d)
    assert got == (pytest.approx(theta, abs=1e-12), pytest.approx(max(lo, -1.0), abs=1e-12),
                   pytest.approx(min(hi, 1.0), abs=1e-12))


@pytest.mark.parametrize("ending", ["done", "failed"])
def test_a_step_that_ends_is_no_longer_interrupted(tmp_path, ending: str) -> None:
    """Journal: started → done (or failed) leaves nothing interrupted; a step only started is
    the interrupted one, and its attempt is counted."""
    from host.campaign.journal import Done, Failed, Journal, Session, Started

    j = Journal(tmp_path)
    j.append(Session("s.toml", None, str(tmp_path)))
    j.append(Started("run:a:1", 1))
    j.append(Done("run:a:1", 1, {}) if ending == "done" else Failed("run:a:1", 1, 1, "x"))
    j.append(Started("run:b:1", 1))
    state = j.read()
    assert set(state.interrupted) == {"run:b:1"}
    assert state.attempts == {"run:a:1": 1, "run:b:1": 1}
    assert ("run:a:1" in state.done) == (ending == "done")


# --------------------------------------------------------------------------- results table
def _rep_rows(config: str, run_id: str, basis: str, values: list[float]) -> list[dict]:
    """Repeat rows of one run's headline figure (scope all, whole request, generated tokens),
    one per campaign round 1, 2, ... so two configurations pair by round."""
    return [{"run_id": run_id, "config": config, "scope": "all", "phase": "request",
             "unit": "generated", "basis": basis, "repeat": k, "j_per_token": v,
             "energy_per_request_j": 16 * v, "duration_per_request_s": 2.0,
             "energy_method": "counter", "power_source": "measured",
             "t_start_meter_ns": float(k * 10**9), "campaign_round": k + 1}
            for k, v in enumerate(values)]


def _verdict(config: str, run_id: str, valid: bool) -> dict:
    return {"run_id": run_id, "config": config, "phase": "request", "valid": valid,
            "reasons": "" if valid else "repeat CV too high", "campaign_round": 1}


def test_the_results_table_takes_only_the_valid_runs_repeats() -> None:
    """One configuration, two runs: the valid one's repeats 1.0, 1.1, 1.2 J/token and an
    invalid one's 5, 6, 7. The figure is the valid repeats' median, 1.1 (over all six it
    would be (1.2 + 5) / 2 = 3.1), from 3 repeats of 1 valid run out of 2."""
    from host.analysis.model import Options
    from host.analysis.results import config_results

    rep = pd.DataFrame(_rep_rows("c", "good", "gross", [1.0, 1.1, 1.2])
                       + _rep_rows("c", "bad", "gross", [5.0, 6.0, 7.0]))
    verdicts = pd.DataFrame([_verdict("c", "good", True), _verdict("c", "bad", False)])
    res = config_results([], rep, verdicts, {}, Options()).iloc[0]
    assert res["j_per_token_median"] == pytest.approx(1.1)
    assert (res["n_runs"], res["n_runs_valid"], res["n_repeats"]) == (2, 1, 3)
    assert res["energy_per_request_j_median"] == pytest.approx(16 * 1.1)


def _two_bases() -> tuple[pd.DataFrame, pd.DataFrame]:
    """Two configurations ranked one way on gross J/token and the other way on net:
    gross c1 = 2.0 ± 0.1, c2 = c1 − 1.0; net c1 = 0.5 ± 0.1, c2 = c1 + 0.3 (per round)."""
    g1, n1 = [1.9, 2.0, 2.1], [0.4, 0.5, 0.6]
    rows = (_rep_rows("c1", "r1", "gross", g1) + _rep_rows("c1", "r1", "net", n1)
            + _rep_rows("c2", "r2", "gross", [x - 1.0 for x in g1])
            + _rep_rows("c2", "r2", "net", [x + 0.3 for x in n1]))
    verdicts = pd.DataFrame([_verdict("c1", "r1", True), _verdict("c2", "r2", True)])
    return pd.DataFrame(rows), verdicts


def test_every_headline_follows_the_energy_basis_asked_for() -> None:
    """With energy_basis = net: c1 (net 0.5 J/token) is cheaper than c2 (net 0.8) although
    c2 is cheaper gross (1.0 against 2.0). The savings table, the pairwise difference, the
    Pareto frontier and the perplexity-matched pair must all be on net."""
    from host.analysis.model import Options
    from host.analysis.results import (
        comparisons,
        config_results,
        matched_pairs,
        pareto_configs,
        savings_table,
    )

    rep, verdicts = _two_bases()
    opts = Options(energy_basis="net", baseline="c1")
    res = config_results([], rep, verdicts, {}, opts)
    head = (res["basis"] == "net")
    assert res[head].set_index("config")["j_per_token_median"].to_dict() == pytest.approx(
        {"c1": 0.5, "c2": 0.8})
    # accuracy 0.6 for c1, 0.5 for c2: on net, c1 is cheaper and better, c2 is dominated
    res["accuracy"] = res["config"].map({"c1": 0.6, "c2": 0.5})
    assert pareto_configs(res, opts) == ["c1"]
    sav = savings_table(res, rep, verdicts, opts).set_index("config")
    assert sav.loc["c2", "j_per_token"] == pytest.approx(0.8)
    # paired by round: the mean of the per-round savings (A_r − B_r) / A_r
    per_round = [(a - (a + 0.3)) / a * 100 for a in (0.4, 0.5, 0.6)]
    assert sav.loc["c2", "energy_saving_pct"] == pytest.approx(sum(per_round) / 3)
    pairs = matched_pairs(res, rep, verdicts, {"c1": 10.0, "c2": 10.0}, opts)
    assert [(p.cheaper, p.dearer) for p in pairs] == [("c1", "c2")]
    assert pairs[0].delta_j_per_token == pytest.approx(0.5 - 0.8)  # cheaper − dearer
    comp = comparisons(res, rep, verdicts, opts, ["c1"], [], None, None)
    row = comp[comp["comparison"] == "savings vs baseline"].iloc[0]
    assert (row["config_a"], row["config_b"]) == ("c1", "c2")
    assert row["energy_delta_j_per_token"] == pytest.approx(0.8 - 0.5)


# --------------------------------------------------------------------------- net energy
def test_net_energy_is_the_primary_energy_less_the_idle_floor() -> None:
    """Idle: 30 J over 10 s by the primary method (3 W; the trapezoid says 33 J). A request
    window of 20 J over 2 s (trapezoid 25 J): net = 20 − 3 × 2 = 14 J, from the same energy
    the gross figure uses; the trapezoid column would give 19 J."""
    from types import SimpleNamespace

    from host.analysis.pipeline import _add_net_energy

    win = pd.DataFrame({
        "run_id": ["r", "r"], "scope": ["all", "all"], "kind": ["idle", "request"],
        "energy_j": [30.0, 20.0], "energy_trapezoid_j": [33.0, 25.0],
        "energy_counter_j": [30.0, 20.0], "duration_s": [10.0, 2.0],
        "valid": [True, True], "reason": ["", ""]})
    info = SimpleNamespace(run=SimpleNamespace(run_id="r"), idle_power_w={}, idle_reason={})
    _add_net_energy(win, [info])  # type: ignore[list-item]
    assert info.idle_power_w == {"all": pytest.approx(3.0)}
    assert math.isnan(win.loc[0, "energy_net_j"])
    assert win.loc[1, "energy_net_j"] == pytest.approx(14.0)


# --------------------------------------------------------------------------- multiple choice
class _ByteScorer:
    """One token per UTF-8 byte: the scored continuation can be read off by hand."""

    def tokenize(self, text: str) -> list[int]:
        return list(text.encode())


def test_the_scored_tokens_start_right_after_the_shared_context() -> None:
    """Context "The cat", choices "mat." / "dog" (each after one space): the texts share the
    8 bytes "The cat " (llama.cpp's rule: the longest prefix common to all choices), so the
    first scored token is index 8 and the scored bytes are exactly "mat." and "dog"."""
    from host.accuracy.items import shared_item
    from host.accuracy.multiple_choice import score_starts

    item = shared_item("t", "The cat", ["mat.", "dog"], 0)
    seqs = [list(t.encode()) for t in item.texts()]
    starts = score_starts(_ByteScorer(), item, seqs)  # type: ignore[arg-type]
    assert starts == [len(b"The cat ")] * 2
    assert [bytes(q[s:]).decode() for q, s in zip(seqs, starts, strict=True)] == ["mat.", "dog"]


def test_a_partial_item_scores_only_what_follows_its_own_context() -> None:
    """WinoGrande: each option's context ends at the option; the scored bytes are " ran
    fast." for both (one more context token would drop the space)."""
    from host.accuracy.items import winogrande_item
    from host.accuracy.multiple_choice import score_starts

    item = winogrande_item({"sentence": "Ann beat Bo because _ ran fast.", "option1": "Ann",
                            "option2": "Bo", "answer": "1"}, 0)
    seqs = [list(t.encode()) for t in item.texts()]
    starts = score_starts(_ByteScorer(), item, seqs)  # type: ignore[arg-type]
    assert starts == [len(c.encode()) for c in item.contexts]
    assert {bytes(q[s:]).decode() for q, s in zip(seqs, starts, strict=True)} == {" ran fast."}


# --------------------------------------------------------------------------- whole analysis
def _two_configs(tmp_path, tools):
    """Two runs of two configurations, one after the other in one trace, on different
    power levels: (trace, [run dirs], [(schedule, profile)])."""
    ns = tools.NS
    s1 = tools.make_schedule(500 * ns, seed=0)
    s2 = tools.make_schedule(s1.requests[-1]["end"] + 70 * ns, seed=1)
    p1 = s1.profile(idle_w=3.0, prefill_w=8.0, decode_w=6.0)
    p2 = s2.profile(idle_w=3.0, prefill_w=12.0, decode_w=9.0)
    both = tools.Steps(np.concatenate([p1.t_ns, p2.t_ns]),
                       np.concatenate([p1.level_w, p2.level_w]))
    trace = tools.write_trace(tmp_path / "trace", {0: both}, 498 * ns,
                              s2.requests[-1]["end"] + 3 * ns)
    runs = [tools.write_run(tmp_path / "a", s1, map_id="cfg_a", run_id="a"),
            tools.write_run(tmp_path / "b", s2, map_id="cfg_b", run_id="b")]
    return trace, runs, [(s1, p1), (s2, p2)]


def _truth(sched, prof, idle_w: float) -> dict[str, float]:
    """Median over repeats of J per generated token, gross and net, and of decode J per
    decode token, integrated from the step profile (closed form)."""
    gross, net, dec = [], [], []
    for k in sorted({r["repeat"] for r in sched.requests if not r["warmup"]}):
        rs = [r for r in sched.requests if r["repeat"] == k and not r["warmup"]]
        e = sum(prof.energy(r["start"], r["end"]) for r in rs)
        t = sum((r["end"] - r["start"]) / 1e9 for r in rs)
        gross.append(e / sum(r["n_gen"] for r in rs))
        net.append((e - idle_w * t) / sum(r["n_gen"] for r in rs))
        dec.append(sum(prof.energy(r["first"], r["end"]) for r in rs)
                   / sum(r["n_gen"] - 1 for r in rs))
    return {"gross": float(np.median(gross)), "net": float(np.median(net)),
            "decode": float(np.median(dec))}


def test_the_summary_prints_each_configurations_own_figures(tmp_path, synth_tools) -> None:
    """cfg_b draws 1.5× cfg_a's power in prefill and decode: each summary row must show its
    own configuration's J/token (gross, net, decode), as integrated from the step profiles."""
    from host.analysis.pipeline import analyze
    from host.analysis.summary import summary_text

    trace, runs, truths = _two_configs(tmp_path, synth_tools)
    text = summary_text(analyze(runs, trace))
    header = next(line for line in text.splitlines() if line.startswith("config  "))
    cols = [c.strip() for c in header.split("  ") if c.strip()]
    for cfg, (sched, prof) in zip(["cfg_a", "cfg_b"], truths, strict=True):
        line = next(x for x in text.splitlines() if x.startswith(cfg + " "))
        cells = dict(zip(cols, [c.strip() for c in line.split("  ") if c.strip()],
                         strict=False))
        want = _truth(sched, prof, 3.0)
        assert float(cells["J/gen tok (gross)"].split()[0]) == pytest.approx(want["gross"],
                                                                            rel=0.01)
        assert float(cells["J/gen tok (net)"]) == pytest.approx(want["net"], rel=0.01)
        assert float(cells["decode J/gen tok"]) == pytest.approx(want["decode"], rel=0.01)


def test_an_unknown_clock_offset_uncertainty_invalidates_every_phase(tmp_path, synth_tools,
                                                                    monkeypatch) -> None:
    """A run whose clock offset uncertainty is unknown (NaN: a clock map built from syncs
    without one, as ClockMap.from_run makes for a library caller; the run.json reader refuses
    such a file): the windows' edges cannot be bounded, so no phase is valid and each says
    why. NaN compares false with every bound, so only an explicit check refuses it."""
    from host.analysis import pipeline

    ns = synth_tools.NS
    sched = synth_tools.make_schedule(500 * ns)
    synth_tools.write_trace(tmp_path / "trace", {0: sched.profile(**synth_tools.LEVELS)},
                            498 * ns, sched.requests[-1]["end"] + 3 * ns)
    run = synth_tools.write_run(tmp_path / "r", sched)
    assert pipeline.analyze([run], tmp_path / "trace").verdicts["valid"].all()
    real = pipeline._align_run

    def unknown(*args, **kw):  # the real alignment, its uncertainty then unknown
        info = real(*args, **kw)
        info.offset_uncertainty_ns = float("nan")
        return info

    monkeypatch.setattr(pipeline, "_align_run", unknown)
    v = pipeline.analyze([run], tmp_path / "trace").verdicts
    assert not v["valid"].any()
    assert v["reasons"].str.contains("clock offset uncertainty unknown").all()


def test_the_paired_comparisons_take_only_the_valid_runs_repeats() -> None:
    """Baseline d at 2.0 J/token in rounds 1–3; c's valid run at 1.0, 1.1, 1.2 and an
    invalid run at 5, 6, 7 in the same rounds. Paired by round over the valid repeats, c
    saves the mean of (2 − c_k) / 2: (50 + 45 + 40) / 3 = 45 %, and uses 0.9 J/token less."""
    from host.analysis.model import Options
    from host.analysis.results import comparisons, config_results, savings_table

    rep = pd.DataFrame(_rep_rows("c", "good", "gross", [1.0, 1.1, 1.2])
                       + _rep_rows("c", "bad", "gross", [5.0, 6.0, 7.0])
                       + _rep_rows("d", "base", "gross", [2.0, 2.0, 2.0]))
    verdicts = pd.DataFrame([_verdict("c", "good", True), _verdict("c", "bad", False),
                             _verdict("d", "base", True)])
    opts = Options(baseline="d")
    res = config_results([], rep, verdicts, {}, opts)
    sav = savings_table(res, rep, verdicts, opts).set_index("config")
    assert sav.loc["c", "energy_saving_pct"] == pytest.approx(45.0)
    comp = comparisons(res, rep, verdicts, opts, [], [], None, None).iloc[0]
    assert comp["energy_delta_j_per_token"] == pytest.approx(1.1 - 2.0)
