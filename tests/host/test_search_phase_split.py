"""`epi search --phase-split`: each pick also measured as two split configurations with the
round's baseline (host/search/driver.py `phase_splits`), through the campaign's own split form."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from host.campaign.plan import configurations
from host.campaign.study import load_study
from host.search.driver import SearchState, run_search, summary
from host.search.measure import CampaignSettings, Measured, study_text
from host.search.sensitivity import candidate_kl
from tests.host.test_search import fake_measurer, four_layer_search

REPO = Path(__file__).resolve().parents[2]


def split_measurer(space: object, kl_table: dict, seen: list[tuple[int, list]]):
    """The closed-form maps of test_search's fake measurer, plus each split configuration
    modelled as half its prefill parent's J/token and half its decode parent's, and its decode
    parent's accuracy; `seen` collects (round, splits) of every call."""
    maps_only = fake_measurer(space, kl_table, [])  # type: ignore[arg-type]

    def measure(round_no: int, round_dir: Path, maps: Sequence[Path],
                baseline: str | None = None, splits: Sequence[tuple[str, str, str]] = ()
                ) -> list[Measured]:
        seen.append((round_no, list(splits)))
        out = maps_only(round_no, round_dir, list(maps), baseline)
        by = {m.config: m for m in out}
        for sid, pre, dec in splits:
            j = 0.5 * by[pre].j_per_token + 0.5 * by[dec].j_per_token
            acc = by[dec].accuracy
            out.append(Measured(sid, round_no, None, None, j, (j, j), acc, j / acc,
                                (j / acc, j / acc), "modelled (test)", "",
                                per_round_j=(j, j, j)))
        return out

    return measure


def test_each_pick_is_also_measured_split_with_the_baseline_both_ways(tmp_path: Path) -> None:
    space, kl_table, settings = four_layer_search(tmp_path)
    settings.phase_split = True

    def direct(p: Path) -> float:
        return candidate_kl(json.loads(p.read_text()), kl_table)

    seen: list[tuple[int, list]] = []
    state, path, pred = run_search(space, kl_table, settings,
                                   split_measurer(space, kl_table, seen), direct,
                                   echo=lambda s: None)
    assert seen[0] == (0, [])  # round 0: the hand-made maps alone
    # the baseline: the hand-made map of lowest EPI in round 0 (closed forms' J / accuracy)
    hand_epi = {m.config: m.j_per_token / m.accuracy for m in state.measured if m.round == 0}
    best = min(hand_epi, key=hand_epi.__getitem__)
    for round_no, splits in seen[1:]:
        picks = [c for c in state.search_maps if c.startswith(f"search_r{round_no}_")]
        assert splits == [s for c in picks for s in (
            (f"{c}.prefill-{best}.decode", c, best), (f"{best}.prefill-{c}.decode", best, c))]
    assert len(state.phase_splits) == 2 * len(state.search_maps) == 6
    assert len(state.search_maps) == 3  # splits do not spend the candidate budget
    # every split's comparison with the baseline is settled like a pick's
    assert set(state.verdicts) == set(state.search_maps) | set(state.phase_splits)
    doc = summary(state, path, pred, space, {"uniform_q8_0", "uniform_q4_0"})
    rows = {r.config: r for r in doc.configs}
    for sid, (pre, dec) in state.phase_splits.items():
        assert rows[sid].kind == "split"
        assert rows[sid].assignment == f"prefill {pre}, decode {dec}"
    # splits sit with the search's candidates in the verdict (here the model makes every
    # split's J/token the mean of its parents': a split is never below both)
    assert doc.verdict.comparison_counts == {"decided": 9}
    # the splits are in search.json and a resumed search reads them back
    saved = SearchState.load(settings.out / "search.json")
    assert saved.phase_splits == state.phase_splits
    seen.clear()
    again, _, _ = run_search(space, kl_table, settings, split_measurer(space, kl_table, seen),
                             direct, echo=lambda s: None)
    assert seen == [] and again.phase_splits == state.phase_splits


def test_without_the_option_the_state_has_no_split_key(tmp_path: Path) -> None:
    space, kl_table, settings = four_layer_search(tmp_path)
    seen: list[tuple[int, list]] = []
    run_search(space, kl_table, settings, split_measurer(space, kl_table, seen),
               lambda p: candidate_kl(json.loads(p.read_text()), kl_table), echo=lambda s: None)
    assert all(splits == [] for _, splits in seen)
    assert "phase_splits" not in json.loads((settings.out / "search.json").read_text())


def test_a_rounds_study_names_the_splits_in_the_campaigns_form(tmp_path: Path,
                                                               tiny_model: Path) -> None:
    maps = [REPO / "quantmaps" / "uniform_q8.json", REPO / "quantmaps" / "uniform_q4km.json"]
    split = ("uniform_q4km.prefill-uniform_q8.decode", "uniform_q4km", "uniform_q8")
    text = study_text("r1", CampaignSettings(base=tiny_model), maps, tmp_path / "c",
                      baseline="uniform_q8", splits=[split])
    assert text == study_text("r1", CampaignSettings(base=tiny_model), maps, tmp_path / "c",
                              baseline="uniform_q8").replace(
        "uniform_q4km.json\"]\n",
        "uniform_q4km.json\"]\nsplits = [{ id = \"uniform_q4km.prefill-uniform_q8.decode\", "
        "prefill = \"uniform_q4km\", decode = \"uniform_q8\" }]\n")
    (tmp_path / "study.toml").write_text(text)
    configs = {c.config_id: c for c in configurations(load_study(tmp_path / "study.toml"))}
    got = configs[split[0]]
    assert got.is_split and got.parents == ("uniform_q4km", "uniform_q8")
    assert got.gguf == configs["uniform_q4km"].gguf
    assert got.decode_gguf == configs["uniform_q8"].gguf
