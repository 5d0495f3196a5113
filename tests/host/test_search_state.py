"""search.json is checked before it is used: a state that is not an object, lacks a
field, or holds a non-finite KL is one line naming the file, never a crash or a hang; a state
the search wrote itself (NaN standing for 'not measured') reads back as it was."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from epi.core.errors import UserError
from host.search.driver import SearchState
from host.search.measure import Measured
from host.search.records import Prediction, SearchRound

GOOD = Measured("q8", 1, "m/q8.gguf", 1000, 0.5, (0.4, 0.6), 0.5, 1.0, (0.8, 1.2),
                "modelled", "", 21.5)


def _write(tmp_path: Path, doc: object) -> Path:
    p = tmp_path / "search.json"
    p.write_text(json.dumps(doc))
    return p


def test_a_written_state_reads_back(tmp_path: Path) -> None:
    nan_j = Measured("q4", 2, None, None, math.nan, (math.nan, math.nan), 0.4, math.nan,
                     (math.nan, math.nan), "", "no valid runs")
    rounds = [SearchRound(0, ("q8.json", "q4.json"), (), None),
              SearchRound(1, ("q8.json", "s1.json"), ("s1",), "q8")]
    pred = Prediction(0.5, None, 1.0, (0.9, None), fit_n=2, accuracy_fit_n=0)
    state = SearchState(rounds, [GOOD, nan_j], {"q8": 0.01}, {"s1": ["Q8_0", "Q4_0"]},
                        {"s1": pred}, {"s1": 0.02})
    p = _write(tmp_path, state.to_json())
    back = SearchState.load(p)
    assert back.measured[0] == GOOD
    assert back.measured[1].config == "q4" and math.isnan(back.measured[1].j_per_token)
    assert back.direct_kl == {"q8": 0.01} and back.search_maps == {"s1": ["Q8_0", "Q4_0"]}
    assert back.proxy_kl == {"s1": 0.02} and back.predictions == {"s1": pred}
    assert back.rounds == rounds
    assert json.dumps(back.to_json()) == p.read_text()  # rewritten byte for byte


def test_per_round_values_and_verdicts_read_back(tmp_path: Path) -> None:
    from dataclasses import replace

    m = replace(GOOD, per_round_j=(0.5, None, 0.52))
    verdict = {"state": "undecided", "text": "undecided after the budget", "paired_rounds": 2}
    state = SearchState(measured=[m], verdicts={"s1": verdict})
    back = SearchState.load(_write(tmp_path, state.to_json()))
    assert back.measured[0].per_round_j == (0.5, None, 0.52)
    assert back.verdicts == {"s1": verdict}


@pytest.mark.parametrize(("doc", "problem"), [
    ([], "expected a search state object, got list"),
    ({"format": "epi-search", "format_version": 1, "measured": [{"config": "q8"}]},
     "measured[0]: field 'round' missing"),
    ({"format": "epi-search", "format_version": 1, "direct_kl_nats": {"q8": "NaN"}},
     "direct_kl_nats.q8"),
    ({"format": "epi-search", "format_version": 1, "measured": {}}, "'measured'"),
    ({"format": "epi-search", "format_version": 1, "search_maps": {"s": "Q8_0"}},
     "search_maps.s"),
    ({"format": "epi-search", "format_version": 1, "verdicts": {"s": {"state": 1}}},
     "'verdicts'"),
    ({"format": "epi-search", "format_version": 1, "rounds": [{"round": -1}]},
     "rounds[0]: field 'round'"),
    ({"format": "epi-search", "format_version": 1,
      "rounds": [{"round": 1, "maps": ["a.json"], "picked": [3], "against": "a"}]},
     "rounds[0]: field 'picked'"),
    ({"format": "epi-search", "format_version": 1, "predictions": {"s": {"predicted_epi": 1}}},
     "predictions.s: field"),
    ({"format": "epi-search", "format_version": 1,
      "measured": [{**GOOD.as_dict(), "per_round_j": [0.5, "x"]}]},
     "per_round_j[1]"),
])
def test_broken_states_are_one_line(tmp_path: Path, doc: object, problem: str) -> None:
    p = _write(tmp_path, doc)
    with pytest.raises(UserError) as exc:
        SearchState.load(p)
    assert problem in str(exc.value) and str(p) in str(exc.value)
    assert "\n" not in str(exc.value)


def test_a_nan_kl_is_refused(tmp_path: Path) -> None:
    p = tmp_path / "search.json"
    p.write_text('{"format": "epi-search", "format_version": 1, '
                 '"proxy_kl_nats": {"s1": NaN}}')
    with pytest.raises(UserError, match=r"proxy_kl_nats\.s1"):
        SearchState.load(p)


@settings(max_examples=80, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(field=st.sampled_from(["config", "round", "gguf", "size_bytes", "j_per_token",
                              "j_per_token_ci", "accuracy", "epi", "epi_ci", "power_source",
                              "reason", "perplexity"]),
       value=st.one_of(st.none(), st.booleans(), st.integers(-3, 3), st.floats(),
                       st.text(max_size=4), st.lists(st.floats(), max_size=3)))
def test_generated_measured_entries_load_or_are_one_line(tmp_path: Path, field: str,
                                                         value: object) -> None:
    entry = {**GOOD.as_dict(), field: value}
    p = tmp_path / "search.json"
    p.write_text(json.dumps({"format": "epi-search", "format_version": 1,
                             "measured": [entry]}))
    try:
        m = SearchState.load(p).measured[0]
    except UserError as exc:
        assert "\n" not in str(exc)
    else:
        assert isinstance(m.config, str) and isinstance(m.round, int)
        assert not math.isinf(m.j_per_token) and len(m.epi_ci) == 2
