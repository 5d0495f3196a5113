"""Adaptive rounds: which comparisons a study names, and the whole loop by simulation.

The loop simulation is a campaign in miniature: four configurations with known true J/token
(differences of 0.5 %, 6 % and 12 %, a 2 % margin), per-round values with a drift shared by
every run of a round (it cancels in the pairs) plus run noise, and now and then an invalid
run. After the minimum rounds only configurations of unsettled comparisons are measured.
Over 250 studies (1,500 comparisons): every comparison ends settled, wrong verdicts are no
more frequent than α, and the adaptive study needs fewer runs than a fixed protocol reaching
the same decisions.
"""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest

from host.campaign import adaptive as ad

CONFIGS = ["q8", "q6", "q5", "q4"]
TRUE_J = {"q8": 0.100, "q6": 0.0995, "q5": 0.094, "q4": 0.088}  # −0.5 %, −6 %, −12 %


def test_comparisons_per_target() -> None:
    rules = ad.DecisionRules(targets=("baseline",))
    comps, notes = ad.comparisons(rules, CONFIGS, baseline="q8")
    assert [(c.reference, c.candidate) for c in comps] == [("q8", "q6"), ("q8", "q5"), ("q8", "q4")]
    assert notes == []
    allp, _ = ad.comparisons(ad.DecisionRules(targets=("all_pairs",)), CONFIGS)
    assert len(allp) == 6
    front, _ = ad.comparisons(
        ad.DecisionRules(targets=("frontier",)), CONFIGS,
        accuracy={"q8": 0.60, "q6": 0.59, "q5": 0.61, "q4": 0.50}, j_per_token=TRUE_J)
    # q8 is dominated by q5 (more accurate and cheaper): frontier q4 < q5 by J/token
    assert [(c.reference, c.candidate) for c in front] == [("q4", "q5")]
    ppl, _ = ad.comparisons(ad.DecisionRules(targets=("ppl_matched",)), CONFIGS,
                            ppl={"q8": 10.0, "q6": 10.05, "q5": 10.5, "q4": 12.0},
                            j_per_token=TRUE_J, ppl_tolerance=0.01)
    assert [(c.kind, c.reference, c.candidate) for c in ppl] == [("ppl_matched", "q8", "q6")]
    both, _ = ad.comparisons(ad.DecisionRules(targets=("baseline", "all_pairs")), CONFIGS,
                             baseline="q8")
    assert len(both) == 6 and sum(c.kind == "baseline" for c in both) == 3
    none, notes = ad.comparisons(ad.DecisionRules(targets=("baseline", "frontier")), CONFIGS)
    assert none == [] and len(notes) == 2 and "no baseline" in notes[0]


def test_frontier_is_the_pareto_staircase() -> None:
    acc = {"q8": 0.60, "q6": 0.59, "q5": 0.58, "q4": 0.50}
    front, _ = ad.comparisons(ad.DecisionRules(targets=("frontier",)), CONFIGS,
                              accuracy=acc, j_per_token=TRUE_J)
    assert [(c.reference, c.candidate) for c in front] == [("q4", "q5"), ("q5", "q6"), ("q6", "q8")]


@pytest.mark.parametrize(("field", "value", "match"), [
    ("targets", ("everything",), "each target must be one of"),
    ("targets", (), "got none"),
    ("min_rounds", 2, "min_rounds must be >= 3"),
    ("max_rounds", 2, "max_rounds"),
    ("margin_pct", -1.0, "margin_pct"),
    ("time_budget_s", 0.0, "time_budget_s"),
    ("alpha", 1.0, "alpha"),
])
def test_rules_are_checked(field: str, value: object, match: str) -> None:
    kwargs: dict[str, object] = {field: value}
    if field == "max_rounds":
        kwargs["min_rounds"] = 3
    with pytest.raises(ValueError, match=match):
        ad.DecisionRules(**kwargs)  # type: ignore[arg-type]  # hostile values on purpose


def test_paired_savings_use_common_valid_rounds() -> None:
    values: dict[str, dict[int, float | None]] = {"a": {1: 1.0, 2: 2.0, 3: None, 4: 1.0},
                                                  "b": {1: 0.9, 3: 1.0, 4: 1.1}}
    assert ad.paired_savings_pct(values, "a", "b") == pytest.approx([10.0, -10.0])


def test_round_order_is_seeded_and_interleaved() -> None:
    a = ad.round_order(CONFIGS, 1, 4)
    assert a == ad.round_order(CONFIGS, 1, 4) and sorted(a) == sorted(CONFIGS)
    expected = list(CONFIGS)
    random.Random("1:4").shuffle(expected)  # the fixed plan's draw for round 4
    assert a == expected
    assert ad.rounds_affordable(600.0, 60.0, 4) == 2 and ad.rounds_affordable(10, 0, 4) == 0


def _simulate(rng: np.random.Generator, rules: ad.DecisionRules, comps: list[ad.Comparison]
              ) -> tuple[list[ad.Assessment], int, int]:
    """One study: (final assessments, runs measured, round at which all had settled)."""
    values: dict[str, dict[int, float | None]] = {c: {} for c in CONFIGS}
    runs = 0
    todo = list(CONFIGS)
    k = 0
    assessments: list[ad.Assessment] = []
    while todo:
        k += 1
        drift = 1.0 + rng.normal(0.0, 0.03)  # shared by the round's runs
        for cfg in ad.round_order(todo, 1, k):
            runs += 1
            ok = rng.random() > 0.05
            values[cfg][k] = TRUE_J[cfg] * drift * (1 + rng.normal(0, 0.012)) if ok else None
        if k < rules.min_rounds:
            continue
        assessments = ad.assess(rules, comps, values, k)
        todo = [] if k >= rules.max_rounds else ad.configs_to_measure(assessments)
    return assessments, runs, k


@pytest.mark.long
def test_adaptive_loop_settles_with_few_wrong_verdicts_and_fewer_runs() -> None:
    rules = ad.DecisionRules(targets=("all_pairs",), min_rounds=3, max_rounds=12,
                             margin_pct=2.0)
    comps, _ = ad.comparisons(rules, CONFIGS)
    rng = np.random.default_rng(28)
    n_studies, wrong, total, settled, ratios = 250, 0, 0, 0, []
    states: dict[str, int] = {}
    for _ in range(n_studies):
        final, runs, last_round = _simulate(rng, rules, comps)
        for s in final:
            c, v = s.comparison, s.verdict
            true = (TRUE_J[c.reference] - TRUE_J[c.candidate]) / TRUE_J[c.reference] * 100.0
            total += 1
            settled += v.settled
            states[v.state] = states.get(v.state, 0) + 1
            if v.state == "decided" and np.sign(v.mean) != np.sign(true):
                wrong += 1
            if v.state == "equivalent" and abs(true) >= rules.margin_pct:
                wrong += 1
        ratios.append(runs / (len(CONFIGS) * last_round))
    print(f"verdicts {states}; wrong {wrong}/{total}; runs adaptive/fixed "
          f"{np.mean(ratios):.2f}")
    assert settled == total  # decided, equivalent, or undecided after the budget
    assert wrong / total <= rules.alpha
    assert states.get("decided", 0) > total / 2
    assert np.mean(ratios) < 0.9  # fewer runs than every configuration for as many rounds


def test_assess_marks_the_budget_and_says_what_it_would_need() -> None:
    rules = ad.DecisionRules(targets=("baseline",), min_rounds=3, max_rounds=4, margin_pct=0.1)
    values = {"a": {1: 1.00, 2: 1.02, 3: 0.99, 4: 1.01}, "b": {1: 0.99, 2: 1.02, 3: 0.985,
                                                                   4: 1.00}}
    comps, _ = ad.comparisons(rules, ["a", "b"], baseline="a")
    (s,) = ad.assess(rules, comps, values, 4)
    assert s.verdict.state == "undecided" and s.verdict.budget_spent
    assert "undecided after the budget" in s.text() and "rounds would resolve" in s.text()
    assert ad.configs_to_measure([s]) == []
    (early,) = ad.assess(rules, comps, values, 3)
    assert not early.verdict.settled and ad.configs_to_measure([early]) == ["a", "b"]


def test_rounds_go_to_the_comparisons_max_rounds_can_settle() -> None:
    """a → b: savings 13, 10, 7 % (mean 10, sd 3): the 95 % sequence's half-width at n = 5 is
    2.53 sd (Lai's closed form), so about 5 rounds decide it, within max_rounds 8. a → c:
    savings 1, −1, 0.1 % (mean 0.03, sd 1) with 0.1 % worth resolving: thousands of rounds.
    c alone is then not measured; when a → c is the only open comparison it is (nothing
    within reach to give its rounds to)."""
    rules = ad.DecisionRules(targets=("baseline",), min_rounds=3, max_rounds=8, margin_pct=0.1)
    values = {"a": {1: 1.0, 2: 1.0, 3: 1.0}, "b": {1: 0.87, 2: 0.90, 3: 0.93},
              "c": {1: 0.99, 2: 1.01, 3: 0.999}}
    comps, _ = ad.comparisons(rules, ["a", "b", "c"], baseline="a")
    found = ad.assess(rules, comps, values, 3)
    ab, ac = found
    assert (ab.comparison.candidate, ac.comparison.candidate) == ("b", "c")
    assert not ab.verdict.settled and ab.verdict.rounds_needed is not None
    assert 4 <= ab.verdict.rounds_needed <= 8
    assert [s.comparison.candidate for s in ad.out_of_reach(found, 8)] == ["c"]
    assert ad.configs_to_measure(found, 8) == ["a", "b"]
    assert ad.configs_to_measure(found) == ["a", "b", "c"]  # no limit: every open one
    assert ad.configs_to_measure([ac], 8) == ["a", "c"]


def test_power_lines_name_the_margin_and_the_basis() -> None:
    rules = ad.DecisionRules(margin_pct=3.0, max_rounds=8)
    lines = ad.power_lines(rules, 1.5, "measured by a 3-round probe")
    assert "spread measured by a 3-round probe" in lines[0]
    assert any(line.startswith("  a 3 % difference needs") for line in lines)
    assert lines[-1].startswith("  the budget of 8 rounds resolves")


def test_round_values_from_the_analysis_tables() -> None:
    """Rounds come from the campaign (run → round), invalid runs give None."""
    import pandas as pd

    rep = pd.DataFrame([
        # config, run, repeat, J/token, phase, scope, unit, basis
        ("q8", "r1", 0, 0.10, "request", "all", "generated", "gross"),
        ("q8", "r1", 1, 0.12, "request", "all", "generated", "gross"),
        ("q8", "r1", 0, 0.50, "request", "all", "generated", "net"),
        ("q8", "r1", 0, 0.70, "decode", "all", "generated", "gross"),
        ("q4", "r2", 0, 0.08, "request", "all", "generated", "gross"),
        ("q4", "r3", 0, 0.09, "request", "all", "generated", "gross"),
        ("q4", "r4", 0, 0.07, "request", "all", "generated", "gross"),
    ], columns=["config", "run_id", "repeat", "j_per_token", "phase", "scope", "unit", "basis"])
    runs = pd.DataFrame([("r1", "request", True), ("r2", "request", True),
                         ("r3", "request", False), ("r4", "request", True)],
                        columns=["run_id", "phase", "valid"])
    v = ad.round_values(rep, runs, {"r1": 1, "r2": 1, "r3": 5})
    assert v == {"q8": {1: pytest.approx(0.11)}, "q4": {1: 0.08, 5: None}}


def test_spread_from_an_earlier_analysis(tmp_path: Path) -> None:
    """Pooled spread of per-round paired savings, rounds paired by time as the analysis does."""
    import pandas as pd

    a_vals = [0.100, 0.104, 0.098, 0.101]
    b_vals = [0.090, 0.095, 0.087, 0.092]
    rows, runs = [], []
    for k, (a, b) in enumerate(zip(a_vals, b_vals, strict=True)):
        for cfg, v, t in (("A", a, 10 * k), ("B", b, 10 * k + 5)):
            rid = f"{cfg}{k}"
            runs.append((rid, "request", True))
            for r in range(2):  # two repeats per run, averaged into the round's value
                rows.append((cfg, rid, "all", "request", "generated", "gross",
                             v + (0.001 if r else -0.001), t + r))
    pd.DataFrame(rows, columns=["config", "run_id", "scope", "phase", "unit", "basis",
                                "j_per_token", "t_start_meter_ns"]).to_csv(
        tmp_path / "repeats.csv", index=False)
    pd.DataFrame(runs, columns=["run_id", "phase", "valid"]).to_csv(tmp_path / "runs.csv",
                                                                    index=False)
    savings = [(a - b) / a * 100 for a, b in zip(a_vals, b_vals, strict=True)]
    sd, n = ad.spread_from_analysis(tmp_path)
    assert n == 4 and sd == pytest.approx(float(np.std(savings, ddof=1)), rel=1e-9)
    sd_none, n_none = ad.spread_from_analysis(tmp_path / "missing")
    assert np.isnan(sd_none) and n_none == 0


def test_a_matched_pair_compared_as_a_baseline_saving_is_said_so_not_missing() -> None:
    rules = ad.DecisionRules(targets=("baseline", "ppl_matched"))
    comps, notes = ad.comparisons(rules, ["q8", "q4_1", "q4_0"], baseline="q8",
                                  j_per_token={"q8": 1.0, "q4_1": 1.2, "q4_0": 0.8},
                                  ppl={"q8": 43.19, "q4_1": 43.20, "q4_0": 50.85})
    assert [(c.kind, c.reference, c.candidate) for c in comps] == [
        ("baseline", "q8", "q4_1"), ("baseline", "q8", "q4_0")]
    assert notes == ["perplexity-matched pair: q4_1 → q8 (compared as savings vs baseline)"]
    # without the baseline target the pair is its own comparison, the dearer as reference
    comps2, notes2 = ad.comparisons(ad.DecisionRules(targets=("ppl_matched",)),
                                    ["q8", "q4_1", "q4_0"], j_per_token={"q8": 1.0, "q4_1": 1.2},
                                    ppl={"q8": 43.19, "q4_1": 43.20, "q4_0": 50.85})
    assert [(c.kind, c.reference, c.candidate) for c in comps2] == [
        ("ppl_matched", "q4_1", "q8")]
    assert notes2 == []
