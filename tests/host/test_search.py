"""epi search: search space bytes, fitted models, descent, candidate pick, the measure loop."""

from __future__ import annotations

import itertools
import json
import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from epi.core.errors import UserError
from host.quant.quant_types import bits_per_weight
from host.search.driver import SearchSettings, run_search, summary, verdict
from host.search.measure import Measured, read_campaign_results, study_text
from host.search.models import fit_line, fit_nonincreasing, fit_predictor, spearman
from host.search.optimizer import Budget, descent_path, pick_candidates
from host.search.sensitivity import candidate_kl, log_softmax, mean_kl
from host.search.space import (
    LayerTensors,
    SearchSpace,
    assignment_groups,
    build_space,
    mixmap_document,
)

TYPES = ("Q8_0", "Q5_0", "Q4_0")
REPO = Path(__file__).resolve().parents[2]


def synthetic_space(n_layers: int = 3, weights: int = 4096) -> SearchSpace:
    layers = tuple(LayerTensors(i, ((f"blk.{i}.w", 256, weights),)) for i in range(n_layers))
    return SearchSpace(n_layers, layers, TYPES, {"token_embd": "Q8_0", "output": "Q8_0"},
                       fixed_bytes=1000, n_weights=n_layers * weights + 1000)


def test_bits_per_weight_match_ggml_block_layouts() -> None:
    # Q8_0: 32 int8 + one f16 scale = 34 bytes per 32 weights; Q4_0: 16 + 2 = 18 bytes.
    assert bits_per_weight("Q8_0") == pytest.approx(34 * 8 / 32)
    assert bits_per_weight("Q4_0") == pytest.approx(18 * 8 / 32)
    assert bits_per_weight("Q6_K") == pytest.approx(210 * 8 / 256)


def test_space_bytes_equal_the_tensor_data_an_independent_reader_finds(
    tiny_model: Path, tmp_path: Path
) -> None:
    """Quantize a real model with a per-layer candidate and read the file back with the test's
    own GGUF parser (gguf's type tables; it checks that the tensors tile the data section):
    the search's byte count must equal the bytes of the file's quantized tensors."""
    from host.gguf_io.file import sha256_file
    from host.quant.gguf_info import read_model
    from host.quant.mixmap import parse_mixmap
    from host.quant.quantize import quantize_map
    from tests.host.quant_fixtures import gguf_view

    model = read_model(tiny_model)  # 8 layers, 256 wide
    space = build_space(model, ["Q8_0", "Q5_0", "Q4_0"])
    assignment = ("Q8_0", "Q4_0", "Q4_0", "Q5_0") * 2
    doc = mixmap_document("cand", assignment, space, "test")
    path = tmp_path / "cand.json"
    path.write_text(json.dumps(doc))
    result = quantize_map(parse_mixmap(doc, path), model, sha256_file(tiny_model),
                          tmp_path / "q", threads=2)
    view = gguf_view(result.output)
    assert space.bytes_of(assignment) == sum(view.nbytes.values())
    assert view.types["blk.1.ffn_down.weight"] == "Q4_0"
    assert view.types["blk.3.attn_q.weight"] == "Q5_0"
    assert view.types["blk.4.attn_q.weight"] == "Q8_0"


def test_default_types_are_those_that_fit_every_block_tensor(
    tiny_model: Path, tmp_path: Path
) -> None:
    from host.quant.gguf_info import read_model
    from host.quant.tiny_model import write_test_model

    wide = read_model(tiny_model)  # 256 wide, ffn 512
    narrow = read_model(write_test_model(tmp_path / "n.gguf", n_layers=2, n_embd=96, n_ff=192,
                                         n_head=2))
    assert wide.n_embd == 256
    assert "Q6_K" in build_space(wide).types
    narrow_types = build_space(narrow).types
    assert "Q6_K" not in narrow_types and "Q4_K" not in narrow_types  # 96 % 256 != 0
    assert {"Q8_0", "Q4_0"} <= set(narrow_types)  # 96 % 32 == 0
    with pytest.raises(UserError, match="do not fit"):
        build_space(narrow, ["Q8_0", "Q6_K"])


def test_fit_line_recovers_a_known_line_and_refuses_one_point() -> None:
    x = [0.1, 0.2, 0.35, 0.5]
    fit = fit_line(x, [0.02 + 0.3 * v for v in x])
    assert fit.intercept == pytest.approx(0.02) and fit.slope == pytest.approx(0.3)
    assert fit.predict(1.0) == pytest.approx(0.32)
    assert not fit_line([0.1], [0.2]).fitted
    assert math.isnan(fit_line([0.1], [0.2]).predict(1.0))


def test_accuracy_fit_holds_a_positive_slope_at_zero() -> None:
    # composite rising with KL (noise from a tiny composite): the slope ≤ 0 optimum is the
    # constant model at the mean, 0.4, residual sd with n − 1 df: sqrt((0.01+0+0.01)/2) = 0.1
    kl, acc = [0.0, 0.1, 0.2], [0.3, 0.4, 0.5]
    assert fit_line(kl, acc).slope == pytest.approx(1.0)  # the free fit
    held = fit_nonincreasing(kl, acc)
    assert held.clamped and held.slope == 0.0 and held.intercept == pytest.approx(0.4)
    assert held.residual_sd == pytest.approx(0.1)
    assert held.prediction_sd(5.0) == pytest.approx(0.1 * math.sqrt(1 + 1 / 3))
    falling = fit_nonincreasing(kl, [0.5, 0.45, 0.3])  # a negative slope is kept as fitted
    assert not falling.clamped and falling.slope == pytest.approx(-1.0)
    predictor = fit_predictor([0.1, 0.2, 0.3], [1.0, 1.1, 1.2], kl, acc)
    # the constant model ranks by energy alone: the smaller file has the lower predicted EPI
    assert predictor.accuracy_of(0.0) == predictor.accuracy_of(0.2) == pytest.approx(0.4)
    assert predictor.epi(0.1, 0.2) < predictor.epi(0.3, 0.0)


def test_kl_against_perplexity_correlation_and_its_count() -> None:
    kl = [0.01, 0.05, 0.2, 0.3]
    ppl = [40.0, 41.0, 45.0, math.nan]  # the last map scored no perplexity
    predictor = fit_predictor([0.1] * 4, [1.0] * 4, kl, [0.3] * 4, [0.012, 0.04, 0.25, 0.3], ppl)
    assert predictor.direct_kl_ppl_rank_correlation == pytest.approx(1.0)
    assert predictor.proxy_ppl_rank_correlation == pytest.approx(1.0)
    assert predictor.ppl_n == 3
    assert math.isnan(fit_predictor([0.1] * 4, [1.0] * 4, kl, [0.3] * 4)
                      .direct_kl_ppl_rank_correlation)


def test_spearman_against_hand_computed_ranks() -> None:
    assert spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    # ranks x: 1 2 3 4 5, y: 2 1 4 3 5 -> d² = 1+1+1+1+0 = 4 -> 1 - 6·4/(5·24) = 0.8
    assert spearman([1, 2, 3, 4, 5], [2, 1, 4, 3, 5]) == pytest.approx(0.8)
    assert math.isnan(spearman([1, 2], [1, 2]))


def test_mean_kl_closed_form_and_zero_for_identical_rows() -> None:
    p = np.log(np.array([[0.5, 0.5]]))
    q = np.log(np.array([[0.9, 0.1]]))
    expected = 0.5 * math.log(0.5 / 0.9) + 0.5 * math.log(0.5 / 0.1)
    assert mean_kl(p, q) == pytest.approx(expected)
    rows = log_softmax(np.random.default_rng(0).standard_normal((3, 7)))
    assert mean_kl(rows, rows) == pytest.approx(0.0, abs=1e-12)
    assert np.allclose(np.exp(rows).sum(axis=1), 1.0)


def convex_kl(n_layers: int, scale: list[float]) -> dict[tuple[int, str], float]:
    """Per-layer KL convex in bits saved: each notch down costs more than the one before."""
    steps = {"Q8_0": 0.0, "Q5_0": 1.0, "Q4_0": 3.0}
    return {(i, t): scale[i] * steps[t] for i in range(n_layers) for t in TYPES}


def test_descent_states_lie_on_the_brute_force_front_for_convex_costs() -> None:
    space = synthetic_space(3)
    kl = convex_kl(3, [1.0, 0.2, 5.0])
    path = descent_path(space, kl)
    assert path[0].assignment == ("Q8_0",) * 3 and path[-1].assignment == ("Q4_0",) * 3
    everything = [(space.bytes_of(a), candidate_kl(a, kl))
                  for a in itertools.product(TYPES, repeat=3)]
    for c in path:
        dominated = any(b <= c.bytes and k <= c.kl and (b < c.bytes or k < c.kl)
                        for b, k in everything)
        assert not dominated, c
    assert [c.bytes for c in path] == sorted((c.bytes for c in path), reverse=True)
    # the least sensitive layer (1) is lowered first
    assert path[1].assignment == ("Q8_0", "Q5_0", "Q8_0")


def test_two_notch_look_ahead_crosses_a_poor_intermediate_type() -> None:
    """Layer 0's first notch is expensive but its two-notch move is cheap per byte: a
    one-notch greedy would lower layer 1 first; the look-ahead takes layer 0 to Q4_0.
    Per byte saved (Q8_0 4352, Q5_0 2816, Q4_0 2304 bytes): layer 0 one notch 2.0/1536,
    two notches 1.9/2048; layer 1 one notch 1.5/1536."""
    space = synthetic_space(2)
    kl = {(0, "Q8_0"): 0.0, (0, "Q5_0"): 2.0, (0, "Q4_0"): 1.9,
          (1, "Q8_0"): 0.0, (1, "Q5_0"): 1.5, (1, "Q4_0"): 4.0}
    path = descent_path(space, kl)
    assert path[1].assignment == ("Q4_0", "Q8_0")


def test_pick_respects_budget_exclusions_and_spacing() -> None:
    space = synthetic_space(3)
    path = descent_path(space, convex_kl(3, [1.0, 0.2, 5.0]))
    budget = Budget(max_bpw=7.0)
    picks = pick_candidates(path, None, budget, 3, exclude=set())
    assert picks and all(c.bpw <= 7.0 for c in picks)
    again = pick_candidates(path, None, budget, 3, exclude={c.assignment for c in picks})
    assert not {c.assignment for c in again} & {c.assignment for c in picks}
    fitted = fit_predictor([0.01, 0.02, 0.03], [1.0, 2.0, 3.0], [0.0, 1.0, 2.0], [0.5, 0.4, 0.3])
    by_epi = pick_candidates(path, fitted, Budget(), 2, set(), min_gap_bpw=0.5)
    assert len(by_epi) == 2 and abs(by_epi[0].bpw - by_epi[1].bpw) >= 0.5
    epis = [fitted.epi(c.gb, c.kl) for c in path]
    assert fitted.epi(by_epi[0].gb, by_epi[0].kl) == pytest.approx(min(epis))


def test_unfitted_picks_sit_inside_the_range_not_at_its_ends() -> None:
    space = synthetic_space(6)
    path = descent_path(space, convex_kl(6, [1.0, 0.2, 5.0, 0.7, 2.0, 0.4]))
    pool = sorted(path, key=lambda c: c.bpw)
    picks = sorted(pick_candidates(path, None, Budget(), 2, exclude=set()), key=lambda c: c.bpw)
    # two picks over n states: positions round(1·(n+1)/3) and round(2·(n+1)/3), 1-based
    n = len(pool)
    assert [c.assignment for c in picks] == [pool[round((n + 1) / 3) - 1].assignment,
                                             pool[round(2 * (n + 1) / 3) - 1].assignment]
    assert picks[0].bpw > pool[1].bpw and picks[-1].bpw < pool[-2].bpw


def fake_measurer(space: SearchSpace, kl_table: dict, calls: list[int], noise: float = 0.0,
                  baselines: list[str | None] | None = None):
    """Closed-form "measurements": J/token = 0.5 + 40·GB, accuracy = 0.6 − 0.05·KL; `noise`
    adds a deterministic per-configuration offset to J/token so refits move. Every round
    measures each map 3 times at exactly its J/token (a noiseless campaign); `baselines`
    collects the baseline each round's campaign was asked to compare with."""
    from host.search.measure import Measured

    def measure(round_no: int, round_dir: Path, maps: list[Path],
                baseline: str | None = None) -> list[Measured]:
        calls.append(round_no)
        if baselines is not None:
            baselines.append(baseline)
        out = []
        for p in maps:
            doc = json.loads(p.read_text())
            assignment = ["Q8_0"] * space.n_layers
            for g in doc["groups"]:
                for layer in g["layers"]:
                    assignment[layer] = g["type"]
            size = space.bytes_of(assignment)
            kl = candidate_kl(assignment, kl_table)
            j, acc = 0.5 + 40 * size / 1e9, 0.6 - 0.05 * kl
            j += noise * ((sum(map(ord, doc["id"])) % 7) - 3)
            gguf = round_dir / f"{doc['id']}.gguf"
            gguf.parent.mkdir(parents=True, exist_ok=True)
            gguf.write_text(json.dumps(assignment))
            out.append(Measured(doc["id"], round_no, str(gguf), size, j, (j, j), acc, j / acc,
                                (j / acc, j / acc), "modelled (test)", "",
                                per_round_j=(j, j, j)))
        return out

    return measure


def four_layer_search(tmp_path: Path) -> tuple[SearchSpace, dict, SearchSettings]:
    """A 4-layer space, its convex KL table, and settings against two uniform hand-made maps
    (all-Q8_0, all-Q4_0): 3 candidates, 2 per round."""
    space = synthetic_space(4, weights=1 << 20)
    kl_table = convex_kl(4, [1.0, 0.2, 5.0, 0.5])
    hand = tmp_path / "hand"
    hand.mkdir(exist_ok=True)
    for t in ("Q8_0", "Q4_0"):
        doc = mixmap_document(f"uniform_{t.lower()}", (t,) * 4, space, "hand-made")
        (hand / f"uniform_{t.lower()}.json").write_text(json.dumps(doc))
    return space, kl_table, SearchSettings(out=tmp_path / "s", candidates=3, per_round=2,
                                           against=sorted(hand.glob("*.json")))


def test_search_loop_refits_measures_the_budget_and_resumes(tmp_path: Path) -> None:
    space, kl_table, settings = four_layer_search(tmp_path)
    calls: list[int] = []

    def direct(p: Path) -> float:
        return candidate_kl(json.loads(p.read_text()), kl_table)

    baselines: list[str | None] = []
    state, path, pred = run_search(space, kl_table, settings,
                                   fake_measurer(space, kl_table, calls, baselines=baselines),
                                   direct, echo=lambda s: None)
    # round 0: the hand-made maps alone (fixed rounds); then 2 + 1 picks, each measured beside
    # the best hand-made map by EPI (J/token over accuracy of the closed forms)
    assert len(state.search_maps) == 3 and calls == [0, 1, 2]
    hand_epi = {m.config: m.j_per_token / m.accuracy for m in state.measured if m.round == 0}
    best = min(hand_epi, key=hand_epi.__getitem__)
    assert baselines == [None, best, best]
    # every pick's comparison is settled and stored: noiseless rounds decide at round 3, in
    # the direction of the closed-form J/token (0.5 + 40·GB: the larger file draws more)
    assert set(state.verdicts) == set(state.search_maps)
    size = {m.config: m.size_bytes or 0 for m in state.measured}
    for cid, v in state.verdicts.items():
        assert v["state"] == "decided" and v["against"] == best and v["paired_rounds"] == 3
        assert v["direction"] == ("more energy" if size[cid] > size[best] else "less energy")
    # no measured candidate is spent on a map a hand-made one already is (the path's two ends)
    assert not {tuple(a) for a in state.search_maps.values()} & {("Q8_0",) * 4, ("Q4_0",) * 4}
    assert pred.energy.intercept == pytest.approx(0.5) and pred.energy.slope == pytest.approx(40)
    assert pred.accuracy.slope == pytest.approx(-0.05)
    assert pred.proxy_rank_correlation == pytest.approx(1.0)
    doc = summary(state, path, pred, space, {"uniform_q8_0", "uniform_q4_0"})
    searched = {r.config: r for r in doc.configs if r.kind == "search"}
    for cfg, r in searched.items():
        assert r.prediction == state.predictions[cfg]
        # round 1 picks: fitted on the 2 hand-made maps; round 2's on those and round 1's two
        assert state.predictions[cfg].fit_n == (2 if cfg.startswith("search_r1_") else 4)
        assert r.prediction.j_per_token == pytest.approx(r.measured.j_per_token)
        row = r.to_json()
        assert row["predicted_epi"] == state.predictions[cfg].epi
        assert row["predicted_at"] == "pick time, before measuring"
        assert row["decision"] == state.verdicts[cfg]
    # hand-made maps sit on the same summed per-layer proxy as the candidates
    rows = {r.config: r for r in doc.configs}
    assert rows["uniform_q4_0"].proxy_kl_nats == pytest.approx(
        candidate_kl(("Q4_0",) * 4, kl_table))
    assert doc.predictor.proxy_n == 5  # 2 hand-made + 3 search maps
    assert doc.predictor.direct_kl_rank_correlation == pytest.approx(1.0)
    assert len(doc.predictor.energy.residuals) == 5
    assert all(r.energy_residual_j is not None and abs(r.energy_residual_j) < 1e-9
               for r in rows.values())
    assert doc.verdict.best_search is not None
    assert doc.verdict.comparison_counts == {"decided": 3}
    # the same command again: everything is in search.json, nothing is measured twice, and
    # the verdicts are the saved ones
    calls.clear()
    again, _, _ = run_search(space, kl_table, settings, fake_measurer(space, kl_table, calls),
                             direct, echo=lambda s: None)
    assert calls == []
    assert again.verdicts == json.loads(json.dumps(state.verdicts))


def test_verdict_says_so_when_nothing_beats_the_hand_made_maps() -> None:
    from host.search.driver import SearchState

    def m(cfg: str, j: float, a: float) -> Measured:
        return Measured(cfg, 0, None, 1, j, (j, j), a, j / a, (j / a, j / a), "measured", "")

    state = SearchState(measured=[m("hand", 1.0, 0.5), m("s1", 1.2, 0.45)],
                        search_maps={"s1": ["Q4_0"]})
    v = verdict(state, {"hand"})
    assert "found nothing with a lower measured EPI" in v.text
    assert "its best, s1, measured 2.667" in v.text and "overlap" not in v.text
    assert v.on_or_beyond_frontier == ()


def test_an_invalid_anchor_re_measurement_keeps_the_earlier_valid_figures() -> None:
    from host.search.driver import SearchState, latest_measured

    nan = math.nan
    hand_r0 = Measured("hand", 0, None, 1, 0.9, (0.88, 0.92), 0.5, 1.8, (1.7, 1.9), "m", "")
    hand_r1 = Measured("hand", 1, None, 1, nan, (nan, nan), 0.5, nan, (nan, nan), "m",
                       "no valid runs: repeat CV 9.4% above 3.0%")
    found = Measured("s1", 1, None, 1, 1.0, (0.98, 1.02), 0.5, 2.0, (1.9, 2.1), "m", "")
    state = SearchState(measured=[hand_r0, hand_r1, found], search_maps={"s1": ["Q4_0"]})
    counted = latest_measured(state)["hand"]
    assert (counted.round, counted.j_per_token) == (0, 0.9)
    assert "round 0" in counted.reason and "repeat CV 9.4%" in counted.reason
    # the verdict compares against the hand-made map's valid figures, not against nothing
    v = verdict(state, {"hand"})
    assert v.best_hand_made == "hand" and "found nothing with a lower" in v.text
    # a valid later measurement still replaces an earlier one (drift shows in the anchor)
    hand_r2 = replace(hand_r0, round=2, j_per_token=0.95)
    state.measured.append(hand_r2)
    assert latest_measured(state)["hand"] == hand_r2


def test_study_file_round_trips_through_tomllib(tmp_path: Path) -> None:
    tomllib = pytest.importorskip("tomllib")  # stdlib on 3.11+
    from host.search.measure import CampaignSettings

    text = study_text("r0", CampaignSettings(base=tmp_path / "b.gguf",
                                             benchmarks={"mmlu": 10}, rate_hz=40.0,
                                             prompts=tmp_path / "p.json"),
                      [tmp_path / 'a "quoted".json'], tmp_path / "c")
    doc = tomllib.loads(text)
    assert doc["meter"]["emulate"] is True
    assert doc["models"][0]["maps"] == [str((tmp_path / 'a "quoted".json').resolve())]
    assert doc["accuracy"]["benchmarks"] == {"mmlu": 10}
    assert doc["meter"]["rate_hz"] == 40.0
    assert doc["run"]["prompts"] == str((tmp_path / "p.json").resolve())


def test_campaign_results_reader_takes_the_headline_row(tmp_path: Path) -> None:
    (tmp_path / "analysis").mkdir()
    (tmp_path / "analysis" / "results.csv").write_text(
        "config,scope,phase,unit,basis,j_per_token_median,accuracy,epi,power_source,perplexity\n"
        "a,all,request,generated,gross,0.5,0.4,1.25,modelled,41.5\n"
        "a,all,decode,generated,gross,0.3,0.4,0.75,modelled,41.5\n"
        "b,all,request,generated,gross,,0.4,,modelled,\n"
    )
    rows = {m.config: m for m in read_campaign_results(0, tmp_path)}
    assert rows["a"].j_per_token == 0.5 and rows["a"].epi == 1.25
    assert rows["a"].perplexity == 41.5 and math.isnan(rows["b"].perplexity)
    assert math.isnan(rows["b"].j_per_token) and rows["b"].reason == "no valid runs"


def test_groups_compress_consecutive_layers() -> None:
    assert assignment_groups(["Q8_0", "Q8_0", "Q4_0", "Q8_0"]) == [
        ([0, 1], "Q8_0"), ([2], "Q4_0"), ([3], "Q8_0")]


def test_held_out_windows_come_from_the_end_and_refuse_short_texts() -> None:
    from host.search.sensitivity import held_out_windows

    toks = list(range(100))
    held = held_out_windows(toks, n_ctx=10, n_windows=3, source="t", bos=1)
    assert held.windows[0] == (1, *range(71, 80))
    assert held.windows[-1][-1] == 99 and held.n_scored == 27
    with pytest.raises(UserError, match="needs 200"):
        held_out_windows(toks, n_ctx=100, n_windows=2, source="t", bos=None)


@pytest.mark.slow
@pytest.mark.shares_cpu  # no timing of it is checked: it may run beside another test
def test_sensitivity_probes_rank_fewer_bits_as_further_from_the_base(tmp_path: Path) -> None:
    """Real probes through llama-quantize and llama.cpp: a layer at Q4_0 moves the next-token
    distributions further from the F16 base than the same layer at Q8_0; cached on rerun."""
    from host.quant.gguf_info import read_model
    from host.quant.tiny_model import write_test_model
    from host.search.sensitivity import held_out_windows, measure_sensitivity

    base = read_model(write_test_model(tmp_path / "tiny.gguf", n_layers=2))
    held = held_out_windows(list(range(10, 200)), n_ctx=64, n_windows=2, source="ids", bos=1)
    table = measure_sensitivity(base, ["Q8_0", "Q4_0"], held, tmp_path / "s", threads=2)
    for layer in (0, 1):
        assert 0 < table[(layer, "Q8_0")] < table[(layer, "Q4_0")]
    lines: list[str] = []
    again = measure_sensitivity(base, ["Q8_0", "Q4_0"], held, tmp_path / "s", threads=2,
                                progress=lines.append)
    assert again == table and lines == []


def test_predicted_is_the_pick_time_prediction_not_the_final_refit(tmp_path: Path) -> None:
    """With noisy measurements the final fit includes each candidate's own point; the summary
    must report what the models said before the candidate was measured."""
    from host.search.driver import pick_prediction

    space = synthetic_space(4, weights=1 << 20)
    kl_table = convex_kl(4, [1.0, 0.2, 5.0, 0.5])
    hand = tmp_path / "hand"
    hand.mkdir()
    for t in ("Q8_0", "Q5_0", "Q4_0"):
        doc = mixmap_document(f"uniform_{t.lower()}", (t,) * 4, space, "hand-made")
        (hand / f"uniform_{t.lower()}.json").write_text(json.dumps(doc))
    settings = SearchSettings(out=tmp_path / "s", candidates=3, per_round=2,
                              against=sorted(hand.glob("*.json")))
    state, path, final = run_search(
        space, kl_table, settings, fake_measurer(space, kl_table, [], noise=0.05),
        lambda p: candidate_kl(json.loads(p.read_text()), kl_table), echo=lambda s: None)
    result = summary(state, path, final, space, {"uniform_q8_0", "uniform_q5_0", "uniform_q4_0"})
    later = [r for r in result.configs if r.config.startswith("search_r2_")]
    assert later
    by_assignment = {c.assignment: c for c in path}
    for r in later:
        c = by_assignment[tuple(state.search_maps[r.config])]
        assert r.prediction is not None
        predicted = r.prediction.j_per_token
        assert predicted == state.predictions[r.config].j_per_token
        assert predicted != pytest.approx(final.j_per_token(c.gb), abs=1e-9)
        # the stored figure is the pick-time line's J/token at this candidate's size: an
        # independent least-squares line (numpy) through rounds 0 and 1's measured (GB,
        # J/token) points, which the round-2 picks were predicted from. A prediction stored on
        # another scale (J per GB, per request, the final refit's) misses it by far more.
        r0 = list({m.config: m for m in state.measured if m.round <= 1}.values())  # latest
        slope, intercept = np.polyfit([(m.size_bytes or 0) / 1e9 for m in r0],
                                      [m.j_per_token for m in r0], 1)
        assert predicted == pytest.approx(intercept + slope * c.gb, rel=1e-9)
        assert predicted != pytest.approx(
            pick_prediction(final, c).j_per_token, rel=1e-6)  # not the refit
    # the stored prediction survives a reload of search.json
    from host.search.driver import SearchState

    again = SearchState.load(tmp_path / "s" / "search.json")
    assert again.predictions == state.predictions


def test_frontier_shift_states_the_move_or_that_there_is_none() -> None:
    from host.search.driver import frontier_shift

    def m(cfg: str, j: float, a: float) -> Measured:
        return Measured(cfg, 0, None, 1, j, (j * 0.99, j * 1.01), a, j / a,
                        (j / a, j / a), "modelled", "")

    hand = [m("h_big", 2.0, 0.50), m("h_small", 1.0, 0.40), m("h_bad", 2.5, 0.45)]
    moved = frontier_shift(hand, [m("s", 1.5, 0.50)])
    assert moved.moves[0].against == "h_big"
    assert moved.moves[0].j_saving_frac == pytest.approx(0.25)
    assert "25.0 % less J/token than h_big" in moved.text
    assert "at equal accuracy" in moved.text
    # cheaper but less accurate than every hand-made map that is as accurate: a trade-off,
    # never worded as a gain "at equal or better accuracy"
    traded = frontier_shift(hand, [m("t", 0.8, 0.35)])
    assert traded.moves[0].against == "h_small"
    assert traded.moves[0].j_saving_frac == pytest.approx(0.2)
    assert "at lower accuracy (0.35 vs 0.4)" in traded.text
    assert "equal accuracy" not in traded.text.replace("not a gain at equal accuracy", "")
    assert moved.hand_made_frontier == ((1.0, 0.40), (2.0, 0.50))  # h_bad is dominated
    # the JSON form keeps the keys of each kind of move
    assert moved.to_json()["hand_made_frontier"] == [[1.0, 0.40], [2.0, 0.50]]
    assert list(moved.moves[0].to_json()) == ["config", "j_per_token", "accuracy", "against",
                                              "against_accuracy", "j_saving_frac",
                                              "intervals_overlap"]
    above = frontier_shift(hand, [m("s", 3.0, 0.55)])
    assert above.moves[0].accuracy_gain == pytest.approx(0.05)
    assert list(above.moves[0].to_json()) == ["config", "j_per_token", "accuracy", "against",
                                              "accuracy_gain", "intervals_overlap"]
    still = frontier_shift(hand, [m("s", 2.2, 0.45)])
    assert still.moves == () and "did not move" in still.text


def test_hand_made_map_assignment_in_the_search_space(tmp_path: Path) -> None:
    from host.search.space import assignment_of_map

    space = synthetic_space(4)
    frac = {"format": "epi-mixmap", "format_version": 1, "id": "bookend", "base_type": "Q4_0",
            "groups": [{"name": "early", "fraction": 0.25, "type": "Q8_0"},
                       {"name": "middle", "fraction": 0.5, "type": "Q4_0"},
                       {"name": "late", "fraction": 0.25, "type": "Q8_0"}],
            "non_block": {"token_embd": "Q8_0", "output": "Q8_0"}}
    (tmp_path / "b.json").write_text(json.dumps(frac))
    assert assignment_of_map(tmp_path / "b.json", space) == (
        ("Q8_0", "Q4_0", "Q4_0", "Q8_0"), "")
    frac["groups"][1]["type"] = "Q4_1"
    (tmp_path / "c.json").write_text(json.dumps(frac))
    assignment, why = assignment_of_map(tmp_path / "c.json", space)
    assert assignment is None and "Q4_1" in why
    frac["groups"][1]["type"] = "Q4_0"
    frac["non_block"] = {"token_embd": "Q4_0", "output": "Q8_0"}
    (tmp_path / "d.json").write_text(json.dumps(frac))
    assert assignment_of_map(tmp_path / "d.json", space)[0] is None


def test_meter_options_are_refused_before_any_work(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from epi.commands.search import search
    from host.search.app import check_meter_options

    with pytest.raises(UserError, match="--trace DIR"):
        check_meter_options("http://meter:8757", None, None)
    with pytest.raises(UserError, match="no such directory"):
        check_meter_options("http://meter:8757", tmp_path / "nope", None)
    with pytest.raises(UserError, match="not a daemon URL"):
        check_meter_options("meter:8757", tmp_path, None)
    with pytest.raises(UserError, match="only with --meter"):
        check_meter_options(None, tmp_path, None)
    with pytest.raises(UserError, match="--meter-rate-hz"):
        check_meter_options("http://meter:8757", tmp_path, 40.0)
    check_meter_options("http://meter:8757", tmp_path, None)
    check_meter_options(None, None, 40.0)
    # through the command: refused before the model is even read (the base does not exist)
    result = CliRunner().invoke(search, [str(tmp_path / "missing.gguf"), "--out",
                                         str(tmp_path / "o"), "--meter", "http://m:8757"])
    assert result.exit_code != 0 and "--trace" in str(result.exception or result.output)
    assert not (tmp_path / "o").exists()


def test_study_check_uses_the_campaigns_own_checker(tmp_path: Path) -> None:
    from host.search.measure import CampaignSettings, check_study

    maps = [REPO / "quantmaps" / "demo" / "demo_q8_0.json"]
    base = tmp_path / "b.gguf"
    work = tmp_path / "work"
    check_study(CampaignSettings(base=base), maps, work)
    with pytest.raises(UserError, match=r"meter\.trace"):
        check_study(CampaignSettings(base=base, emulate=False, meter_url="http://m:8757"),
                    maps, work)
    with pytest.raises(UserError, match="not found"):
        check_study(CampaignSettings(base=base), [tmp_path / "missing.json"], work)
    check_study(CampaignSettings(base=base, emulate=False, meter_url="http://m:8757",
                                 meter_trace=tmp_path), maps, work)
    assert list(work.iterdir()) == []  # the probe study file is removed


def test_analysis_settings_reach_the_rounds_study(tmp_path: Path) -> None:
    """--lag and --cv-threshold become the round's [analysis] table, which the campaign's
    own checker accepts (and refuses out of range)."""
    from host.search.measure import CampaignSettings, check_study

    maps = [REPO / "quantmaps" / "demo" / "demo_q8_0.json"]
    base = tmp_path / "b.gguf"
    settings = CampaignSettings(base=base, lag="auto", cv_threshold=0.5)
    text = study_text("r0", settings, maps, tmp_path / "c")
    assert '[analysis]\nlag = "auto"\ncv_threshold = 0.5\n' in text
    check_study(settings, maps, tmp_path / "work")
    with pytest.raises(UserError, match="cv_threshold"):
        check_study(CampaignSettings(base=base, cv_threshold=2.0), maps, tmp_path / "work")


def test_found_map_carries_its_figures_and_still_validates(tmp_path: Path) -> None:
    from host.quant.mixmap import load_mixmap
    from host.search.app import write_found_map

    space = synthetic_space(2)
    src = tmp_path / "r" / "search_r1_s003.json"
    src.parent.mkdir()
    src.write_text(json.dumps(mixmap_document("search_r1_s003", ("Q8_0", "Q4_0"), space, "x")))
    from host.search.records import Prediction
    from host.search.summary import ConfigRow

    measured = Measured("search_r1_s003", 1, None, 1, 0.6, (0.55, 0.65), 0.5, 1.2, (1.1, 1.3),
                        "modelled (emulated meter)", "")
    row = ConfigRow("search_r1_s003", "search", measured, None, None, None,
                    assignment="0:Q8_0 1:Q4_0",
                    prediction=Prediction(None, None, 1.25, (1.0, 1.5), fit_n=2,
                                          accuracy_fit_n=2))
    write_found_map(src, tmp_path / "maps" / src.name, row)
    found = load_mixmap(tmp_path / "maps" / src.name)
    assert "Measured EPI 1.2 [1.1, 1.3]" in found.description
    assert "modelled (emulated meter)" in found.description
    assert "predicted when picked: EPI 1.25 [1, 1.5]" in found.description
    assert json.loads(src.read_text())["description"] == "x"  # the measured copy is untouched


def test_figure_and_page_show_frontier_intervals_and_models(tmp_path: Path) -> None:
    from host.search.figure import plot_search
    from host.search.page import write_page

    space, kl_table, settings = four_layer_search(tmp_path)
    state, path, pred = run_search(
        space, kl_table, settings, fake_measurer(space, kl_table, [], noise=0.02),
        lambda p: candidate_kl(json.loads(p.read_text()), kl_table), echo=lambda s: None)
    doc = summary(state, path, pred, space, {"uniform_q8_0", "uniform_q4_0"})
    figs = plot_search(doc, tmp_path)
    html_path, md_path = write_page(doc, tmp_path, figs[0])
    page = html_path.read_text()
    assert "data:image/png;base64," in page and "MODELLED" in page
    assert doc.verdict.frontier.text in page
    md = md_path.read_text()
    assert "![search](search.png)" in md and "residuals" in md and "intercept" in md
    assert "EPI pred [PI]" in md and "summed per-layer proxy" in md
    # each candidate's comparison with the best hand-made map, as stored in the state
    assert "Each candidate against the best hand-made map" in md
    for cid, v in state.verdicts.items():
        assert f"| {cid} | {v['against']} | {v['state']}" in md


def test_a_round_whose_analysis_lacks_a_map_is_refused(tmp_path: Path) -> None:
    from host.search.measure import check_covered

    m = tmp_path / "search_r0_s001.json"
    m.write_text(json.dumps({"id": "search_r0_s001"}))
    (tmp_path / "analysis").mkdir()
    (tmp_path / "analysis" / "results.csv").write_text(
        "config,scope,phase,unit,basis,j_per_token_median,accuracy,epi,power_source\n"
        "a,all,request,generated,gross,0.5,0.4,1.25,modelled\n")
    results = read_campaign_results(0, tmp_path)
    with pytest.raises(UserError, match="no row for search_r0_s001"):
        check_covered(results, [m], tmp_path)
    check_covered(results, [], tmp_path)
