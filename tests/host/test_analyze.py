"""`epi analyze` end to end on synthetic traces and token logs with exact ground truth."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from epi import cli as epi_cli
from host.analysis.pipeline import Options, analyze
from host.analysis.verdicts import worth_measuring_again

NS = 1_000_000_000


def run_cli(monkeypatch, capsys, *args: str) -> tuple[int, str, str]:
    """Run `epi analyze ...` in-process through the real entry point (exit code, out, err)."""
    monkeypatch.setattr(sys, "argv", ["epi", "analyze", *map(str, args)])
    code = 0
    try:
        epi_cli.main()
    except SystemExit as exc:
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


def _truth(sched, prof, kind: str) -> np.ndarray:
    spans = {"prefill": ("start", "first"), "decode": ("first", "end"),
             "request": ("start", "end")}
    a, b = spans[kind]
    return np.array([prof.energy(r[a], r[b]) for r in sched.requests if not r["warmup"]])


def test_exact_energies_with_offset_and_drift_corrected(synth_run):
    """Clock offset (−123 s) and drift (40 ppm) injected; every window matches the profile."""
    tdir, rdir, sched, prof = synth_run(run_kw={"offset_ns": -123 * NS + 456_789, "drift_ppm": 40})
    a = analyze([rdir], tdir)
    assert a.runs[0].clock.basis == "clock_sync"
    w = a.windows[a.windows["scope"] == "all"]
    for kind in ("prefill", "decode", "request"):
        got = w[w["kind"] == kind]["energy_j"].to_numpy()
        np.testing.assert_allclose(got, _truth(sched, prof[0], kind), rtol=1e-6)
        cnt = w[w["kind"] == kind]["energy_counter_j"].to_numpy()
        np.testing.assert_allclose(cnt, _truth(sched, prof[0], kind), rtol=1e-6)
    idle = w[w["kind"] == "idle"]
    assert idle["energy_j"].iloc[0] == pytest.approx(3.0 * 3.0, rel=1e-6)
    assert a.runs[0].idle_power_w["all"] == pytest.approx(3.0, rel=1e-6)
    net = w[w["kind"] == "decode"]
    np.testing.assert_allclose(net["energy_net_j"], net["energy_j"] - 3.0 * net["duration_s"],
                               rtol=1e-9)
    assert a.verdicts["valid"].all(), a.verdicts["reasons"].tolist()
    res = a.results.set_index(["scope", "phase", "unit", "basis"])
    dec = res.loc[("all", "decode", "generated", "gross")]
    # 6 W over ~1.51 s for 15 decode tokens
    assert dec["j_per_token_median"] == pytest.approx(6.0 * 1.51 / 15, rel=0.01)
    assert dec["n_repeats"] == 3 and dec["j_per_token_ci_lo"] <= dec["j_per_token_median"]


def test_uncorrected_offset_would_be_wrong(synth_run):
    """Control: the same run read as if the offset were zero misplaces every window."""
    tdir, rdir, sched, prof = synth_run(run_kw={"offset_ns": 250_000_000})
    a = analyze([rdir], tdir)
    w = a.windows[(a.windows["scope"] == "all") & (a.windows["kind"] == "prefill")]
    truth = _truth(sched, prof[0], "prefill")
    np.testing.assert_allclose(w["energy_j"], truth, rtol=1e-6)
    t0 = w["t0_local_ns"].to_numpy()
    wrong = [prof[0].energy(x, x + (r["first"] - r["start"])) for x, r in
             zip(t0, [r for r in sched.requests if not r["warmup"]], strict=True)]
    assert np.all(np.abs(np.array(wrong) / truth - 1) > 0.05)


def test_no_offset_is_flagged_not_assumed_zero(synth_run):
    tdir, rdir, _, _ = synth_run(run_kw={"sync": "none"})
    a = analyze([rdir], tdir)
    assert a.runs[0].clock.basis == "none"
    assert a.windows["energy_j"].isna().all()
    assert (a.windows["reason_code"] == "no_clock_offset").all()
    assert not a.verdicts["valid"].any()
    assert "no usable clock offset" in a.verdicts["reasons"].iloc[0]


def test_same_host_needs_no_offset_and_says_so(synth_run, synth_tools):
    tdir, rdir, sched, prof = synth_run(run_kw={"sync": "none", "boot_id": synth_tools.METER_BOOT})
    a = analyze([rdir], tdir)
    assert a.runs[0].clock.basis == "same_host" and "same host" in a.runs[0].clock.note
    w = a.windows[(a.windows["scope"] == "all") & (a.windows["kind"] == "request")]
    np.testing.assert_allclose(w["energy_j"], _truth(sched, prof[0], "request"), rtol=1e-6)


def test_two_nodes_measured_per_channel(synth_run):
    tdir, rdir, sched, prof = synth_run(channels=2)
    a = analyze([rdir], tdir)
    w = a.windows[a.windows["kind"] == "decode"]
    for ch, node in ((0, "n0"), (1, "n1")):
        got = w[w["scope"] == node]["energy_j"].to_numpy()
        np.testing.assert_allclose(got, _truth(sched, prof[ch], "decode"), rtol=1e-6)
    total = w[w["scope"] == "all"]["energy_j"].to_numpy()
    np.testing.assert_allclose(total, _truth(sched, prof[0], "decode")
                               + _truth(sched, prof[1], "decode"), rtol=1e-6)
    r = a.results[(a.results["scope"] == "n1") & (a.results["phase"] == "request")]
    assert set(r["layers"]) == {"4-7"}


def test_fault_inside_a_window_invalidates_only_the_phases_it_touches(synth_run, synth_tools):
    sched = synth_tools.make_schedule(500 * NS)
    r = [x for x in sched.requests if not x["warmup"]][2]
    t_fault = (r["first"] + r["end"]) // 2
    tdir, rdir, _, _ = synth_run(trace_kw={"events": [(t_fault, 0, "bus_error", "no answer")]})
    a = analyze([rdir], tdir)
    w = a.windows[(a.windows["scope"] == "all") & (a.windows["request_id"] == r["request_id"])]
    dec = w[w["kind"] == "decode"].iloc[0]
    assert np.isnan(dec["energy_j"]) and dec["reason_code"] == "fault_or_gap"
    assert "bus_error" in dec["reason"]
    assert np.isfinite(w[w["kind"] == "prefill"]["energy_j"].iloc[0])  # before the fault
    v = a.verdicts.set_index("phase")
    # the fault lies in one decode: decode and request are invalid, idle and prefill are not
    assert v.loc["idle", "valid"] and v.loc["prefill", "valid"], v["reasons"].tolist()
    assert not v.loc["decode", "valid"] and not v.loc["request", "valid"]
    where = f"request {r['request_id']} (repeat {r['repeat']})"
    assert "1 of 6 decode window(s) cross faults/gaps" in v.loc["decode", "reasons"]
    assert where in v.loc["decode", "reasons"] and where in v.loc["request", "reasons"]
    # a faults/gaps crossing cannot be told from a dead channel: a campaign does not measure
    # the run again for it (host/campaign/remeasure.py), only for its repeat spread
    assert not worth_measuring_again(v.loc["decode", "reasons"]), v.loc["decode", "reasons"]
    # invalid runs are not averaged in: the configuration's figures are null with the reason
    res = a.results[(a.results["scope"] == "all") & (a.results["phase"] == "decode")]
    assert res["j_per_token_median"].isna().all() and "no valid runs" in res["reason"].iloc[0]


def test_short_phase_gets_null_with_reason_not_zero(synth_run):
    tdir, rdir, _, _ = synth_run(sched_kw={"prefill_s": 0.05})
    a = analyze([rdir], tdir)
    pre = a.windows[(a.windows["scope"] == "all") & (a.windows["kind"] == "prefill")]
    assert pre["energy_j"].isna().all() and (pre["n_samples"] < 2).all()
    assert (pre["reason_code"] == "few_samples").all()
    v = a.verdicts.set_index("phase")
    assert not v.loc["prefill", "valid"] and "fewer than 2 samples" in v.loc["prefill", "reasons"]
    assert v.loc["decode", "valid"] and v.loc["request", "valid"]


@pytest.mark.parametrize("status", ["running", "failed"])
def test_unfinished_runs_are_reported_invalid(synth_run, status):
    tdir, rdir, _, _ = synth_run(run_kw={"status": status, "error": "out of memory"
                                     if status == "failed" else None, "sync": "start"})
    a = analyze([rdir], tdir)
    reasons = a.verdicts["reasons"].iloc[0]
    assert not a.verdicts["valid"].any()
    assert ("still 'running'" in reasons) if status == "running" else (
        "run failed: out of memory" in reasons)
    assert a.windows["energy_j"].notna().any()  # still measured, just not averaged in


def _two_configs(synth_run, tmp_path, synth_tools):
    """Two configurations measured in one trace: q8 draws 1.5× the power of q4."""
    s1 = synth_tools.make_schedule(500 * NS, seed=1)
    s2 = synth_tools.make_schedule(s1.requests[-1]["end"] + 5 * NS, seed=2)
    p1 = s1.profile(**synth_tools.LEVELS)
    p2 = s2.profile(idle_w=3.0, prefill_w=12.0, decode_w=9.0)
    t = np.concatenate([p1.t_ns, p2.t_ns[1:]])
    lv = np.concatenate([p1.level_w, p2.level_w[1:]])
    prof = synth_tools.Steps(t, lv)
    tdir = synth_tools.write_trace(tmp_path / "trace", {0: prof}, 495 * NS,
                             s2.requests[-1]["end"] + 3 * NS)
    r1 = synth_tools.write_run(tmp_path / "r_q4", s1, offset_ns=7 * NS, map_id="q4",
                               sha256="1" * 64)
    r2 = synth_tools.write_run(tmp_path / "r_q8", s2, offset_ns=7 * NS, map_id="q8",
                               sha256="2" * 64)
    return tdir, r1, r2


def test_cli_writes_results_and_prints_three_tables(synth_run, tmp_path, synth_tools, monkeypatch,
                                                     capsys):
    tdir, r1, r2 = _two_configs(synth_run, tmp_path, synth_tools)
    acc = tmp_path / "acc.json"
    acc.write_text(json.dumps({"format": "epi-accuracy", "format_version": 1, "models": [
        {"path": "q4.gguf", "sha256": "1" * 64, "map_id": "q4",
         "perplexity": {"ppl": 20.0, "ppl_se": 0.1}, "benchmarks": {},
         "composite": {"accuracy": 0.40, "ci95": [0.38, 0.42],
                       "weights": {"hellaswag": 1.0}, "metric": "accuracy_norm"}},
        {"path": "q8.gguf", "sha256": "2" * 64, "map_id": "q8",
         "perplexity": {"ppl": 20.1, "ppl_se": 0.1}, "benchmarks": {},
         "composite": {"accuracy": 0.42, "ci95": [0.40, 0.44],
                       "weights": {"hellaswag": 1.0}, "metric": "accuracy_norm"}}]}))
    out = tmp_path / "out"
    code, stdout, err = run_cli(monkeypatch, capsys, r1, r2, "--trace", tdir, "--accuracy", acc,
                                "--baseline", "q8", "--out", out)
    assert code == 0, err
    assert "Per configuration" in stdout and "Savings vs baseline q8" in stdout
    assert "Phase breakdown per request, mJ" in stdout
    res = pd.read_csv(out / "results.csv")
    h = res[(res["scope"] == "all") & (res["phase"] == "request") & (res["unit"] == "generated")
            & (res["basis"] == "gross")].set_index("config")
    assert h.loc["q8", "j_per_token_median"] == pytest.approx(
        1.5 * h.loc["q4", "j_per_token_median"], rel=0.03)
    assert h.loc["q4", "epi"] == pytest.approx(h.loc["q4", "j_per_token_median"] / 0.40)
    assert "composite accuracy_norm" in h.loc["q4", "accuracy_basis"]
    assert h.loc["q4", "epi_energy_basis"].startswith("gross J per generated token")
    doc = json.loads((out / "results.json").read_text())
    assert doc["format"] == "epi-analysis" and doc["pareto"] == ["q4", "q8"]
    assert doc["perplexity_matched_pairs"][0]["cheaper"] == "q4"
    sav = {r["config"]: r for r in doc["savings"]}
    assert sav["q4"]["energy_saving_pct"] == pytest.approx(100 / 3, abs=1.5)
    assert sav["q8"]["energy_saving_pct"] == 0.0
    br = {r["config"]: r for r in doc["phase_breakdown"]}
    assert br["q4"]["idle_mj"] == pytest.approx(3.0 * br["q4"]["request_s"] * 1e3, rel=1e-6)
    runs = pd.read_csv(out / "runs.csv")
    assert runs["valid"].all()
    wins = pd.read_csv(out / "windows.csv")
    assert {"energy_j", "energy_counter_j", "counter_minus_trapezoid_j", "reason"} <= set(wins)


def _expect_error(monkeypatch, capsys, out: Path, *args, match: str) -> None:
    code, stdout, err = run_cli(monkeypatch, capsys, *args, "--out", out)
    assert code == 2, (stdout, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("epi: error: "), err
    assert match in lines[0], lines[0]
    assert not out.exists() and not list(out.parent.glob(f".{out.name}.tmp-*"))


def test_cli_errors_are_one_line_and_write_nothing(synth_run, tmp_path, synth_tools, monkeypatch,
                                                   capsys):
    out = tmp_path / "never"
    tdir, rdir, sched, _ = synth_run()
    # the run is elsewhere in time: no overlap with the trace
    far = synth_tools.write_run(tmp_path / "far", synth_tools.make_schedule(5000 * NS),
                                run_id="far")
    _expect_error(monkeypatch, capsys, out, far, "--trace", tdir, match="does not overlap")
    # two runs over the same time
    twin = synth_tools.write_run(tmp_path / "twin", sched, run_id="twin")
    _expect_error(monkeypatch, capsys, out, rdir, twin, "--trace", tdir,
                  match="overlaps run")
    # the same run twice
    _expect_error(monkeypatch, capsys, out, rdir, rdir, "--trace", tdir, match="run_id")
    # a placement node the trace's channel map does not know
    other = synth_tools.write_run(tmp_path / "other", sched, nodes=["pi9"], run_id="other")
    _expect_error(monkeypatch, capsys, out, other, "--trace", tdir,
                  match="placement node 'pi9' has no meter channel")
    # ... which --channels can map (and an unknown channel cannot)
    _expect_error(monkeypatch, capsys, out, other, "--trace", tdir, "--channels", "pi9=5",
                  match="channel 5 of node 'pi9' is not in trace directory")
    code, _, err = run_cli(monkeypatch, capsys, other, "--trace", tdir, "--channels", "pi9=0",
                           "--out", tmp_path / "mapped")
    assert code == 0, err
    # an unknown format version
    hdr = json.loads((rdir / "run.json").read_text())
    (rdir / "run.json").write_text(json.dumps({**hdr, "format_version": 9}))
    _expect_error(monkeypatch, capsys, out, rdir, "--trace", tdir,
                  match="format_version 9 is newer")
    (rdir / "run.json").write_text(json.dumps(hdr))
    # duplicated token timestamps
    ev = (rdir / "events.csv").read_text().splitlines()
    i = next(k for k, line in enumerate(ev) if ",token,1," in line)
    f_prev, f = ev[i - 1].split(","), ev[i].split(",")
    f[7] = f_prev[7]
    ev[i] = ",".join(f)
    (rdir / "events.csv").write_text("\n".join(ev) + "\n")
    _expect_error(monkeypatch, capsys, out, rdir, "--trace", tdir, match="duplicated or unsorted")


def test_existing_output_is_replaced_whole(synth_run, tmp_path, monkeypatch, capsys):
    tdir, rdir, _, _ = synth_run()
    out = tmp_path / "out"
    out.mkdir()
    (out / "results.csv").write_text("old")
    (out / "keep.txt").write_text("mine")
    code, _, err = run_cli(monkeypatch, capsys, rdir, "--trace", tdir, "--out", out)
    assert code == 0, err
    assert (out / "results.csv").read_text().startswith("config,scope")
    assert (out / "keep.txt").read_text() == "mine"


def test_linear_edge_model_is_labelled_and_biased_on_steps(synth_run):
    tdir, rdir, sched, prof = synth_run()
    a = analyze([rdir], tdir, Options(edge="linear"))
    assert (a.results["edge_model"] == "linear").all()
    pre = a.windows[(a.windows["scope"] == "all") & (a.windows["kind"] == "prefill")]
    err = pre["energy_j"].to_numpy() / _truth(sched, prof[0], "prefill") - 1
    assert np.all(err < 0)  # linear interpolation smears the higher phase into its neighbours


def test_simulated_trace_clock_is_not_the_hosts(synth_run, synth_tools):
    """Equal boot ids do not make a simulated meter clock the host's monotonic clock."""
    tdir, rdir, _, _ = synth_run(run_kw={"sync": "none", "boot_id": synth_tools.METER_BOOT})
    meta = tdir / "seg-000001.meta.json"
    m = json.loads(meta.read_text())
    meta.write_text(json.dumps({**m, "clock": {"kind": "simulated"}}))
    a = analyze([rdir], tdir)
    assert a.runs[0].clock.basis == "none" and "simulated" in a.runs[0].clock.note
    assert a.windows["energy_j"].isna().all()


def test_coarse_counter_is_flagged_and_trapezoid_selectable(synth_run):
    tdir, rdir, _, _ = synth_run(trace_kw={"meter_constant": 1e6})  # 0.36 J per count
    a = analyze([rdir], tdir)
    v = a.verdicts.set_index("phase")
    assert not v.loc["prefill", "valid"]
    assert "energy counter resolution 0.36 J" in v.loc["prefill", "reasons"]
    t = analyze([rdir], tdir, Options(energy_method="trapezoid"))
    assert t.verdicts["valid"].all()
    assert set(t.windows["energy_method"]) == {"trapezoid"}
    assert (t.results["energy_method"] == "trapezoid").all()


def test_layer_groups_differential_and_time_share(synth_run, tmp_path, synth_tools):
    tdir, r1, r2 = _two_configs(synth_run, tmp_path, synth_tools)
    mdir = tmp_path / "manifests"
    mdir.mkdir()
    for map_id, late in (("q4", "Q4_K_M"), ("q8", "Q8_0")):
        (mdir / f"{map_id}.manifest.json").write_text(json.dumps({
            "format": "epi-quant-manifest", "format_version": 1, "map_id": map_id,
            "layer_groups": [
                {"name": "early", "layers": [0, 1, 2, 3], "n_weights": 1000,
                 "bits_per_weight": 4.5, "map_type": "Q4_K_M",
                 "effective_types": {"Q4_K": 28}},
                {"name": "late", "layers": [4, 5, 6, 7], "n_weights": 1000,
                 "bits_per_weight": 4.5 if late == "Q4_K_M" else 8.5, "map_type": late,
                 "effective_types": {late.split("_")[0] + ("_K" if "K" in late else "_0"): 28}},
                {"name": "non_block", "layers": [], "n_weights": 10, "bits_per_weight": 6.0,
                 "map_type": None, "effective_types": {}}]}))
    a = analyze([r1, r2], tdir, Options(time_share=True, manifest_dir=mdir))
    assert len(a.differential) == 1
    d = a.differential[0]
    assert d.group == "late" and (d.config_a, d.config_b) == ("q4", "q8")
    res = a.results[(a.results["scope"] == "all") & (a.results["phase"] == "request")
                    & (a.results["unit"] == "generated") & (a.results["basis"] == "gross")]
    jm = res.set_index("config")["j_per_token_mean"]  # Δ of means (paired or Welch)
    assert d.delta_j_per_token == pytest.approx(jm["q8"] - jm["q4"], rel=1e-9)
    jt = res.set_index("config")["j_per_token_median"]
    assert d.ci_lo <= d.delta_j_per_token <= d.ci_hi
    ts = {(x.config, x.group): x for x in a.time_share}
    assert "estimate" in ts[("q8", "late")].label
    # q8: late layers hold 8.5/(4.5+8.5) of the weight bytes
    assert ts[("q8", "late")].j_per_token == pytest.approx(jt["q8"] * 8.5 / 13.0, rel=1e-9)


def test_an_idle_window_of_zero_joules_is_a_verdict_not_a_crash(synth_run, monkeypatch):
    """A node whose idle draw meters 0 J (a coarse counter below a tiny idle floor) used to
    raise ZeroDivisionError in the resolution verdict (counter resolution / median idle J)."""
    levels = sys.modules[synth_run.__module__].LEVELS
    monkeypatch.setitem(levels, "idle_w", 0.0)
    tdir, rdir, _, _ = synth_run(trace_kw={"meter_constant": 1e6})  # 0.36 J per count
    a = analyze([rdir], tdir)
    idle = a.verdicts.set_index("phase").loc["idle"]
    assert not idle["valid"]
    assert "energy counter resolution 0.36 J is more than the median idle window (0 J" \
        in idle["reasons"]


# --------------------------------------------------------------------------- fast paths
def _study(tmp_path: Path, synth_tools) -> tuple[Path, list[Path]]:
    """Three runs on two channels over a trace of three segments, with a `gap` event and a
    `bus_error` inside run windows, a missing power reading and a CalErr status."""
    st = synth_tools
    scheds = [st.make_schedule(t0, seed=k) for k, t0 in enumerate((100 * NS, 160 * NS,
                                                                    230 * NS))]
    t = [np.int64(0)]
    lv = [3.0]
    for s in scheds:
        for r in s.requests:
            t += [r["start"], r["first"], r["end"]]
            lv += [8.0, 6.0, 3.0]
    base = st.Steps(np.array(t, np.int64), np.array(lv))
    prof = {ch: st.Steps(base.t_ns, base.level_w * (1 + 0.5 * ch)) for ch in (0, 1)}
    r1 = scheds[1].requests[5]
    r2 = scheds[2].requests[6]
    gap_at = r1["first"] + 300_000_000
    tdir = st.write_trace(
        tmp_path / "trace", prof, 95 * NS, scheds[2].requests[-1]["end"] + 3 * NS,
        segments=[(95 * NS, 150 * NS), (152 * NS, 220 * NS),
                  (221 * NS, scheds[2].requests[-1]["end"] + 3 * NS)],
        events=[(gap_at, None, "gap", f"end_mono_ns={gap_at + 400_000_000} "
                 f"end_real_ns={gap_at + 400_000_000 + 1_700_000_000 * NS}; bus stalled"),
                (r2["start"] + 100_000_000, 1, "bus_error", "no answer")],
        drop=lambda ch, t: gap_at < t < gap_at + 400_000_000,
        status=lambda ch, t: 0xC000 if ch == 0 and r2["end"] < t < r2["end"] + 300_000_000
        else 0)
    seg = tdir / "seg-000001.samples.csv"
    lines = seg.read_text().splitlines()
    f = lines[40].split(",")
    f[4] = ""  # one missing power reading
    lines[40] = ",".join(f)
    seg.write_text("\n".join(lines) + "\n")
    runs = [st.write_run(tmp_path / f"run{k}", s, nodes=["n0", "n1"], run_id=f"run{k}",
                         offset_ns=-7 * NS, drift_ppm=20)
            for k, s in enumerate(scheds)]
    return tdir, runs


def _outputs(out: Path) -> dict[str, object]:
    """Every output file: CSV as frames, JSON as data, anything else as bytes."""
    got: dict[str, object] = {}
    for p in sorted(out.rglob("*")):
        if not p.is_file():
            continue
        name = str(p.relative_to(out))
        if p.suffix == ".csv":
            got[name] = pd.read_csv(p, keep_default_na=False, na_values=[""])
        elif p.suffix == ".json":
            got[name] = json.loads(p.read_text())
        else:
            got[name] = p.read_bytes()
    return got


def _close(a: object, b: object, where: str) -> None:
    """Equal, floats within rtol 1e-9 / atol 1e-9 (the running integral's base moved)."""
    if isinstance(a, dict) and isinstance(b, dict):
        assert a.keys() == b.keys(), where
        for k in a:
            _close(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, list) and isinstance(b, list):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _close(x, y, f"{where}[{i}]")
    elif isinstance(a, float) and isinstance(b, float):
        assert a == pytest.approx(b, rel=1e-9, abs=1e-9, nan_ok=True), where
    else:
        assert a == b, where


@pytest.mark.long
def test_fast_paths_change_no_output(tmp_path, synth_tools, monkeypatch):
    """The study-scale fast paths give the outputs of the plain ones: samples through the
    columnar cache (built, then read by its stat key without reading the CSV) against the
    checked CSV reader; each window's running integral over the samples it needs against the
    integral from the series' first sample; requests from their phases by row position
    against the pandas lookup by request id. Floats agree to 1e-9 (relative or absolute)."""
    from host.analysis import align, output, pipeline, trace_cache, traces, windows

    tdir, runs = _study(tmp_path, synth_tools)
    opts = Options()
    fast = []
    for k in range(2):  # cache built, then read by its key
        a = output.analyze_to(tmp_path / f"fast{k}", runs, tdir, opts)
        fast.append(_outputs(tmp_path / f"fast{k}"))
        monkeypatch.setattr(trace_cache, "RACY_NS", -10 * NS)  # trust the stat key at once
        monkeypatch.setattr(trace_cache, "read_keyed", None)  # not read: would fail
    assert a.windows["reason"].str.contains("gap event").any()
    assert a.windows["reason"].str.contains("bus_error").any()
    monkeypatch.undo()

    whole = align._running_integral_at

    def from_first_sample(t_ns, power_w, idx_lists, chunk):  # the integral from t[0] to t[-1]
        ends = np.array([0, len(t_ns) - 1], np.int64)
        return whole(t_ns, power_w, [*idx_lists, ends], chunk)[:-1]

    monkeypatch.setattr(align, "_running_integral_at", from_first_sample)
    monkeypatch.setattr(windows, "_phase_rows", lambda w: None)
    monkeypatch.setattr(pipeline, "read_trace",
                        lambda p, **kw: traces.read_trace(p, cache=False, **kw))
    output.analyze_to(tmp_path / "plain", runs, tdir, opts)
    plain = _outputs(tmp_path / "plain")
    for got in fast:
        assert got.keys() == plain.keys()
        for name, ref in plain.items():
            if isinstance(ref, pd.DataFrame):
                pd.testing.assert_frame_equal(got[name], ref, check_exact=False, rtol=1e-9,
                                              atol=1e-9, obj=name)
            else:
                _close(got[name], ref, name)
