"""`host.search.measure.campaign_round_values`: each run's campaign round comes from the
analysis' runs.csv `campaign_round` column (the k of runs/<config>/round<k>-attempt<j>), never
from the runs' order, and the per-round values are the campaign's own repeats.

The campaign below is laid out as host.campaign.layout does: q4 in rounds 1–6, q8 in rounds
1–4 (adaptive: q8's comparison settled sooner) with round 2 failed, and q4's round 3 a second
attempt. Every round draws a different level, so a run given the wrong round gives a wrong
value. The runs are analysed in an order that is neither round nor time order, with run ids
that do not name their round. The expected per-round values are read here with the csv module
from repeats.csv, each run's round from the directory this test laid it out in.
"""

from __future__ import annotations

import csv
import json
import statistics
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from epi.core.errors import UserError
from host.search.measure import campaign_round_values

LEVEL = (1.00, 1.10, 0.95, 1.05, 1.20, 0.90)  # every round draws differently


def _campaign(root: Path, t: SimpleNamespace) -> tuple[Path, list[Path], dict[str, int]]:
    """(trace, run directories in a scrambled order, run id → the round it was laid out in)."""
    ns = t.NS
    cursor = 500 * ns
    times, levels = [cursor - 60 * ns], [3.0]
    runs: list[Path] = []
    round_of: dict[str, int] = {}
    n = 0
    for r, factor in enumerate(LEVEL, start=1):
        for cfg, extra, sha in (("q4", 1.00, "1" * 64), ("q8", 1.03, "2" * 64)):
            if cfg == "q8" and r > 4:
                continue
            sched = t.make_schedule(cursor, n_repeats=2, prompts=1, seed=10 * r + 1)
            prof = sched.profile(idle_w=3.0 * factor, prefill_w=8.0 * factor * extra,
                                 decode_w=6.0 * factor * extra)
            times += list(prof.t_ns[1:])
            levels += list(prof.level_w[1:])
            failed = cfg == "q8" and r == 2
            attempt = 2 if (cfg, r) == ("q4", 3) else 1
            run_id = f"run-{(7 * n) % 11:02d}"  # says nothing of its round
            n += 1
            round_of[run_id] = r
            runs.append(t.write_run(
                root / "runs" / cfg / f"round{r}-attempt{attempt}", sched, map_id=cfg,
                sha256=sha, run_id=run_id, status="failed" if failed else "completed",
                error="killed (test)" if failed else None))
            cursor = sched.requests[-1]["end"] + 5 * ns
    trace = t.write_trace(root / "trace", {0: t.Steps(np.array(times, np.int64),
                                                      np.array(levels))}, 495 * ns, cursor)
    order = [runs[i] for i in (5, 0, 9, 2, 7, 1, 8, 3, 6, 4)]  # neither round nor time order
    assert sorted(order) == sorted(runs)
    return trace, order, round_of


def _by_hand(analysis: Path, round_of: dict[str, int]) -> dict[str, dict[int, float | None]]:
    """Config → round → mean gross J per generated token of the run's request repeats, None
    where the run's request phase is invalid (read with the csv module)."""
    with (analysis / "runs.csv").open(newline="") as f:
        valid = {r["run_id"]: r["valid"] == "True" for r in csv.DictReader(f)
                 if r["phase"] == "request"}
    per_run: dict[tuple[str, str], list[float]] = {}
    with (analysis / "repeats.csv").open(newline="") as f:
        for r in csv.DictReader(f):
            if (r["scope"], r["phase"], r["unit"], r["basis"]) == (
                    "all", "request", "generated", "gross"):
                per_run.setdefault((r["config"], r["run_id"]), []).append(
                    float(r["j_per_token"]))
    out: dict[str, dict[int, float | None]] = {}
    for (cfg, run_id), vals in per_run.items():
        out.setdefault(cfg, {})[round_of[run_id]] = (statistics.fmean(vals) if valid[run_id]
                                                     else None)
    return out


def test_round_values_take_each_runs_round_from_the_analysis(
        tmp_path: Path, synth_tools: SimpleNamespace) -> None:
    from host.analysis.output import analyze_to
    from host.analysis.pipeline import Options

    trace, runs, round_of = _campaign(tmp_path / "campaign", synth_tools)
    analysis = tmp_path / "campaign" / "analysis"
    analyze_to(analysis, runs, trace, Options(baseline="q4"))

    got = campaign_round_values(analysis, "gross")
    want = _by_hand(analysis, round_of)
    assert set(got) == {"q4", "q8"} and set(got["q4"]) == {1, 2, 3, 4, 5, 6}
    assert set(got["q8"]) == {1, 2, 3, 4} and got["q8"][2] is None  # the failed run
    for cfg, rounds in want.items():
        for k, v in rounds.items():
            assert (got[cfg][k] is None) == (v is None), (cfg, k)
            if v is not None:
                assert got[cfg][k] == pytest.approx(v, rel=1e-12), (cfg, k)
    # the rounds' levels differ, so the check above tells every round from every other
    q4 = [want["q4"][k] for k in range(1, 7)]
    assert len({round(float(v or 0), 9) for v in q4}) == 6


def test_an_analysis_without_the_round_column_is_refused(tmp_path: Path) -> None:
    """An older epi's analysis cannot say which round a run was: one line, no guess."""
    adir = tmp_path / "analysis"
    adir.mkdir()
    (adir / "repeats.csv").write_text(
        "run_id,config,scope,phase,unit,basis,j_per_token\nr1,q4,all,request,generated,gross,"
        "0.5\n")
    (adir / "runs.csv").write_text("run_id,config,phase,valid\nr1,q4,request,True\n")
    with pytest.raises(UserError, match=r"runs\.csv: no campaign_round column"):
        campaign_round_values(adir, "gross")


def test_cooldown_and_idle_seconds_reach_the_rounds_study(tmp_path: Path) -> None:
    """--cooldown-s / --idle-s become the round study's [run] cooldown_s / idle_s, read back
    by the campaign's own study reader; left out, the campaign's defaults (1 s, 3 s) hold."""
    from host.campaign.study import load_study
    from host.search.measure import CampaignSettings, study_text

    maps = [Path(__file__).resolve().parents[2] / "quantmaps" / "demo" / "demo_q8_0.json"]
    for given, want in (((0.2, 0.3), (0.2, 0.3)), ((None, None), (1.0, 3.0))):
        settings = CampaignSettings(base=tmp_path / "b.gguf", cooldown_s=given[0],
                                    idle_s=given[1])
        path = tmp_path / "study.toml"
        path.write_text(study_text("r0", settings, maps, tmp_path / "c"))
        run = load_study(path).run
        assert (run.cooldown_s, run.idle_s) == want


def test_cooldown_and_idle_seconds_bind_the_state_only_when_given(tmp_path: Path) -> None:
    """Given, they are measuring options bound to search.json; left out, the identity is the
    one an earlier epi wrote (no key), so such a state still resumes."""
    from host.search.app import SearchRequest, bound_options

    plain = SearchRequest(base=tmp_path / "b.gguf", out=tmp_path / "o", against=())
    assert not {"cooldown_s", "idle_s"} & set(bound_options(plain, ["Q8_0"], 1))
    given = SearchRequest(base=tmp_path / "b.gguf", out=tmp_path / "o", against=(),
                          cooldown_s=0.2, idle_s=0.3)
    opts = bound_options(given, ["Q8_0"], 1)
    assert (opts["cooldown_s"], opts["idle_s"]) == (0.2, 0.3)


def test_the_verdict_reads_the_analysis_that_made_the_campaigns_last_decision(
        tmp_path: Path) -> None:
    """The final analysis re-estimates the lag over the whole trace, so a run's validity can
    differ from the assessment's; the search must judge with the assessment behind the
    campaign's last decision (after round 3 it added round 4, after round 4 it stopped)."""
    from host.search.measure import deciding_analysis

    final = tmp_path / "analysis"
    final.mkdir()
    for k, nxt in ((3, ["a", "b"]), (4, [])):
        d = tmp_path / "assess" / f"round-{k}"
        d.mkdir(parents=True)
        (d / "decisions.json").write_text(json.dumps({"next_configs": nxt}))
        (d / "runs.csv").write_text("run_id\n")
    assert deciding_analysis(tmp_path, final, 3) == tmp_path / "assess" / "round-4"
    assert deciding_analysis(tmp_path, final, None) == final  # no [decide] rounds
    (tmp_path / "assess" / "round-4" / "runs.csv").unlink()
    assert deciding_analysis(tmp_path, final, 3) == final  # no analysis written there
