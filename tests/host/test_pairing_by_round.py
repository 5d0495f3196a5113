"""Pairing two configurations by campaign round.

Adaptive rounds give configurations different numbers of rounds (after the minimum only the
undecided ones are measured again) and an invalid run removes one configuration's round. The
runs still pair by the campaign's round index, over the rounds both have; time interleaving
is only the fallback for ad-hoc runs without one, and Welch only when nothing pairs. The
expected figures below are worked out by hand (per-round means, t quantiles from tables), not
by the code under test.
"""

from __future__ import annotations

import math
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from host.analysis import paired
from host.analysis import sequential as sq
from host.campaign import adaptive as ad

T975_DF2 = 4.302652729911275  # Student t, 0.975 quantile, 2 degrees of freedom (tables)
ROUND_EFFECT = (1.00, 1.10, 0.95, 1.05, 1.20, 0.90)  # shared by both configs in a round
TRUE_DELTA = -0.006  # B − A, J/token, in every round (before the per-round noise below)
NOISE_B = {1: +0.0004, 3: -0.0003, 4: +0.0001}  # B's per-round noise in its valid rounds


def _uneven_study() -> dict[str, tuple[np.ndarray, ...]]:
    """A measured in rounds 1–6, B in rounds 1–4 with round 2 invalid (left out, as the
    analysis leaves invalid runs out): 6 valid rounds against 3. Two repeats per run at
    ±0.001 around the run's value; each round's runs start 100 s apart, B 10 s after A."""
    def runs(rounds: list[int], value: dict[int, float]) -> tuple[np.ndarray, ...]:
        v, t, block, k = [], [], [], []
        for r in rounds:
            for rep, off in enumerate((-0.001, +0.001)):
                v.append(value[r] + off)
                t.append(100.0 * r + rep)
                block.append(f"run{r}")
                k.append(r)
        return (np.array(v), np.array(t), np.array(block, dtype=object),
                np.array(k, dtype=np.float64))

    a_val = {r: 0.30 * f for r, f in enumerate(ROUND_EFFECT, start=1)}
    b_val = {r: a_val[r] + TRUE_DELTA + NOISE_B[r] for r in NOISE_B}
    va, ta, ra, ka = runs([1, 2, 3, 4, 5, 6], a_val)
    vb, tb, rb, kb = runs([1, 3, 4], b_val)
    return {"A": (va, ta, ra, ka), "B": (vb, tb + 10.0, rb, kb)}


def test_uneven_rounds_pair_over_the_common_rounds_and_cover_the_truth() -> None:
    s = _uneven_study()
    (va, ta, ra, ka), (vb, tb, rb, kb) = s["A"], s["B"]
    d = paired.energy_difference(va, ta, vb, tb, block_a=ra, block_b=rb, round_a=ka,
                                 round_b=kb)
    # paired by campaign round, n = the 3 rounds both have (1, 3, 4) — not Welch
    assert d["method"] == paired.PAIRED_CAMPAIGN and d["n_pairs"] == 3
    # by hand: per-round B − A = TRUE_DELTA + noise of rounds 1, 3, 4
    diffs = np.array([TRUE_DELTA + NOISE_B[r] for r in (1, 3, 4)])
    mean, sd = float(diffs.mean()), float(np.std(diffs, ddof=1))
    half = T975_DF2 * sd / math.sqrt(3)
    assert d["delta"] == pytest.approx(mean, rel=1e-9)
    assert d["delta_ci_lo"] == pytest.approx(mean - half, rel=1e-6)
    assert d["delta_ci_hi"] == pytest.approx(mean + half, rel=1e-6)
    assert d["delta_ci_lo"] <= TRUE_DELTA <= d["delta_ci_hi"]
    assert d["distinguishable"] is True  # the round effect cancels in the pairs
    # the saving's interval is over the same rounds: (A_r − B_r)/A_r, by hand
    a_r = np.array([0.30 * ROUND_EFFECT[r - 1] for r in (1, 3, 4)])
    sav = -diffs / a_r * 100.0
    assert d["saving_pct"] == pytest.approx(float(sav.mean()), rel=1e-9)


def test_without_a_round_index_the_same_runs_fall_back_to_welch() -> None:
    """What the analysis did before: 6 runs against 3 do not interleave one for one, so the
    difference went unpaired, and the round effect swamped it."""
    s = _uneven_study()
    (va, ta, ra, _), (vb, tb, rb, _) = s["A"], s["B"]
    d = paired.energy_difference(va, ta, vb, tb, block_a=ra, block_b=rb)
    assert d["method"] == paired.UNPAIRED and d["n_pairs"] == 0
    assert d["delta_ci_lo"] < 0 < d["delta_ci_hi"]  # cannot tell them apart unpaired


def test_a_round_index_missing_on_some_repeats_falls_back_to_time() -> None:
    """Campaign rounds only when every repeat has one; otherwise the ad-hoc rule."""
    t = np.arange(4) * 100.0
    a = np.array([0.30, 0.33, 0.29, 0.31])
    b = a - 0.01
    k = np.array([1.0, 2.0, np.nan, 4.0])
    d = paired.energy_difference(a, t, b, t + 10, round_a=k, round_b=k)
    assert d["method"] == paired.PAIRED_ROUNDS and d["n_pairs"] == 4


def test_fewer_than_two_common_rounds_is_welch_not_a_time_pairing() -> None:
    """A in rounds 1, 2 and B in rounds 3, 4 interleave in time but share no round."""
    a, b = np.array([0.30, 0.31]), np.array([0.29, 0.28])
    d = paired.energy_difference(a, np.array([0.0, 100]), b, np.array([10.0, 110]),
                                 round_a=np.array([1, 2]), round_b=np.array([3, 4]))
    assert d["method"] == paired.UNPAIRED


@pytest.mark.long
def test_coverage_with_drift_uneven_rounds_and_invalid_runs() -> None:
    """2,000 simulated studies: a strong drift over rounds (the room warms), A measured in 8
    rounds, B in 3–8, each run invalid with probability 0.15. The paired 95 % interval over
    the common rounds covers the true difference 95 % of the time (binomial sd 0.5 %). Pairing
    the k-th valid run of each (by position) or falling back to Welch misses this band."""
    rng = np.random.default_rng(28)
    truth = -0.003
    hits = n = 0
    for _ in range(2000):
        drift = 0.30 * (1 + 0.05 * np.arange(1, 9) + rng.normal(0, 0.02, 8))
        ka = np.array([r for r in range(1, 9) if rng.random() > 0.15], dtype=np.int64)
        kb = np.array([r for r in range(1, int(rng.integers(3, 9)) + 1)
                       if rng.random() > 0.15], dtype=np.int64)
        va = drift[ka - 1] + rng.normal(0, 0.001, len(ka))
        vb = drift[kb - 1] + truth + rng.normal(0, 0.001, len(kb))
        if len(set(ka) & set(kb)) < 2:
            continue
        d = paired.energy_difference(va, ka * 100.0, vb, kb * 100.0 + 10, round_a=ka,
                                     round_b=kb)
        assert d["method"] == paired.PAIRED_CAMPAIGN
        assert d["n_pairs"] == len(set(ka) & set(kb))
        n += 1
        hits += d["delta_ci_lo"] <= truth <= d["delta_ci_hi"]
    assert n > 1800
    assert 0.93 <= hits / n <= 0.97


def test_the_sequential_verdict_and_the_campaign_pair_the_same_rounds() -> None:
    """energy_verdict (the report/decisions), the campaign's per-round values and the paired
    interval use one pairing: the same n and the same per-round savings."""
    s = _uneven_study()
    (va, ta, ra, ka), (vb, tb, rb, kb) = s["A"], s["B"]
    v = sq.energy_verdict(va, ta, vb, tb, block_a=ra, block_b=rb, round_a=ka, round_b=kb)
    assert v is not None and v.n == 3 and math.isfinite(v.lo)  # not "n=1, no interval"
    a_r = {r: 0.30 * ROUND_EFFECT[r - 1] for r in (1, 3, 4)}
    by_hand = [-(TRUE_DELTA + NOISE_B[r]) / a_r[r] * 100.0 for r in (1, 3, 4)]
    assert v.mean == pytest.approx(float(np.mean(by_hand)), rel=1e-9)
    values: dict[str, dict[int, float | None]] = {
        "A": {r: 0.30 * f for r, f in enumerate(ROUND_EFFECT, start=1)},
        "B": {1: a_r[1] + TRUE_DELTA + NOISE_B[1], 2: None,
              3: a_r[3] + TRUE_DELTA + NOISE_B[3], 4: a_r[4] + TRUE_DELTA + NOISE_B[4]}}
    x = ad.paired_savings_pct(values, "A", "B")
    assert x == pytest.approx(by_hand, rel=1e-9)
    # the repeats' ±0.001 average out per run: the same savings as the run values
    assert sq.decide(x).mean == pytest.approx(v.mean, rel=1e-9)


def test_campaign_round_is_read_from_the_campaign_layout(tmp_path: Path) -> None:
    from host.campaign.layout import Layout
    from host.campaign.plan import Step

    lay = Layout(tmp_path / "out")
    step = Step("run:q4:7", "run", "q4", 7)
    assert paired.campaign_round(lay.run_dir(step, 2)) == 7
    assert paired.campaign_round(tmp_path / "q4_round7") is None  # an ad-hoc run
    assert paired.campaign_round(tmp_path / "x" / "round3-attempt1") is None  # not runs/<c>/


def test_spread_from_analysis_pairs_by_campaign_round(tmp_path: Path) -> None:
    """repeats.csv with campaign_round: A 6 rounds, B 3 valid of 4 (round 2 invalid)."""
    s = _uneven_study()
    rows, runs = [], []
    for cfg, (v, t, block, k) in s.items():
        for x, tt, b, kk in zip(v, t, block, k, strict=True):
            rows.append((cfg, f"{cfg}-{b}", "all", "request", "generated", "gross", x, tt,
                         int(kk)))
        for b, kk in dict(zip(block, k, strict=True)).items():
            runs.append((f"{cfg}-{b}", "request", True, int(kk)))
    rows.append(("B", "B-run2", "all", "request", "generated", "gross", 0.5, 210.0, 2))
    runs.append(("B-run2", "request", False, 2))  # the invalid run: left out
    pd.DataFrame(rows, columns=["config", "run_id", "scope", "phase", "unit", "basis",
                                "j_per_token", "t_start_meter_ns", "campaign_round"]).to_csv(
        tmp_path / "repeats.csv", index=False)
    pd.DataFrame(runs, columns=["run_id", "phase", "valid", "campaign_round"]).to_csv(
        tmp_path / "runs.csv", index=False)
    a_r = {r: 0.30 * ROUND_EFFECT[r - 1] for r in (1, 3, 4)}
    by_hand = [-(TRUE_DELTA + NOISE_B[r]) / a_r[r] * 100.0 for r in (1, 3, 4)]
    sd, n = ad.spread_from_analysis(tmp_path)
    assert n == 3 and sd == pytest.approx(float(np.std(by_hand, ddof=1)), rel=1e-9)


def test_report_labels_say_which_pairing() -> None:
    assert paired.pairing_label(paired.PAIRED_CAMPAIGN) == "paired by campaign round"
    assert paired.pairing_label(paired.PAIRED_ROUNDS) == "paired by round"
    assert paired.pairing_label(paired.UNPAIRED) == "unpaired (Welch)"
    assert paired.pairing_label("") == "-" and paired.pairing_label(float("nan")) == "-"


def _adaptive_campaign(root: Path, synth_tools: SimpleNamespace) -> tuple[Path, list[Path]]:
    """A campaign's runs as it lays them out (runs/<config>/round<k>-attempt<j>): q4 in rounds
    1–6, q8 in rounds 1–4 (adaptive: q8's comparison was settled sooner) with round 2
    failed; q8 draws 3 % more, every round draws differently (×0.90 … ×1.20)."""
    ns = synth_tools.NS
    cursor = 500 * ns
    times, levels, runs = [cursor - 60 * ns], [3.0], []
    for r, factor in enumerate(ROUND_EFFECT, start=1):
        for cfg, extra, sha in (("q4", 1.00, "1" * 64), ("q8", 1.03, "2" * 64)):
            if cfg == "q8" and r > 4:
                continue
            sched = synth_tools.make_schedule(cursor, n_repeats=2, prompts=2, seed=10 * r + 1)
            prof = sched.profile(idle_w=3.0 * factor, prefill_w=8.0 * factor * extra,
                                 decode_w=6.0 * factor * extra)
            times += list(prof.t_ns[1:])
            levels += list(prof.level_w[1:])
            failed = cfg == "q8" and r == 2
            runs.append(synth_tools.write_run(
                root / "runs" / cfg / f"round{r}-attempt1", sched, map_id=cfg, sha256=sha,
                run_id=f"{cfg}-round{r}", status="failed" if failed else "completed",
                error="killed (test)" if failed else None))
            cursor = sched.requests[-1]["end"] + 5 * ns
    prof = synth_tools.Steps(np.array(times, np.int64), np.array(levels))
    return synth_tools.write_trace(root / "trace", {0: prof}, 495 * ns, cursor), runs


@pytest.mark.long
def test_analysis_pairs_an_adaptive_campaign_by_round(tmp_path: Path,
                                                      synth_tools: SimpleNamespace) -> None:
    """Through `analyze`: the round comes from the run directory into repeats.csv / runs.csv
    (`campaign_round`), and every energy comparison pairs over the 3 common valid rounds."""
    from host.analysis.pipeline import Options, analyze

    tdir, runs = _adaptive_campaign(tmp_path / "out", synth_tools)
    a = analyze(runs, tdir, Options(baseline="q4"))
    v = a.verdicts[a.verdicts["phase"] == "request"].set_index("run_id")
    assert int(v.loc["q8-round3", "campaign_round"]) == 3
    assert not v.loc["q8-round2", "valid"] and v.drop("q8-round2")["valid"].all()
    assert set(a.repeats["campaign_round"].dropna().astype(int)) == {1, 2, 3, 4, 5, 6}
    s = a.savings.set_index("config").loc["q8"]
    assert s["energy_ci_method"] == paired.PAIRED_CAMPAIGN and s["n_pairs"] == 3
    assert s["energy_saving_pct"] == pytest.approx(-3.0, abs=0.3)
    assert s["energy_saving_pct_ci_lo"] <= -3.0 + 0.3 and s["energy_saving_pct_ci_hi"] < 0
    c = a.comparisons.set_index("comparison").loc["savings vs baseline"]
    assert c["energy_ci_method"] == paired.PAIRED_CAMPAIGN and c["n_pairs"] == 3
    # the same runs outside a campaign's layout: no round index, 6 runs against 3 → Welch
    import shutil
    adhoc = []
    for r in runs:
        dst = tmp_path / "adhoc" / f"{r.parent.name}_{r.name}"
        shutil.copytree(r, dst)
        adhoc.append(dst)
    b = analyze(adhoc, tdir, Options(baseline="q4"))
    assert b.repeats["campaign_round"].isna().all()
    assert b.savings.set_index("config").loc["q8", "energy_ci_method"] == paired.UNPAIRED
