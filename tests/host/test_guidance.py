"""Guidance by use on hand-built figures whose right picks are known by construction."""

from __future__ import annotations

import math

from host.analysis.guidance import ConfigFigures, Figure, guidance

NAN = math.nan


def _f(v: float, half: float) -> Figure:
    return Figure(v, v - half, v + half)


# q8: most accurate, slowest, costliest; q4: 5 points worse, fastest, thriftiest; mix: 1 point
# worse than q8, between the two on time and energy
CONFIGS = {
    "q8": ConfigFigures(_f(0.60, 0.01), _f(1.00, 0.01), _f(0.020, 0.0005)),
    "mix": ConfigFigures(_f(0.59, 0.01), _f(0.85, 0.01), _f(0.016, 0.0005)),
    "q4": ConfigFigures(_f(0.55, 0.01), _f(0.70, 0.01), _f(0.012, 0.0005)),
}


def test_each_use_gets_the_pick_its_rule_names() -> None:
    latency, energy, quality = guidance(CONFIGS, accuracy_loss=0.02, j_budget=1.10)
    # within 2 points of 0.60: q8 and mix; mix is faster and thriftier
    assert (latency.config, energy.config) == ("mix", "mix")
    assert latency.eligible == energy.eligible == 2
    # within 1.10 × 0.70 = 0.77 J only q4 is affordable
    assert quality.config == "q4"
    assert all(r.status == "decided" for r in (latency, energy, quality))


def test_a_looser_loss_admits_the_thriftiest() -> None:
    _, energy, quality = guidance(CONFIGS, accuracy_loss=0.06, j_budget=1.5)
    assert energy.config == "q4"
    # 1.5 × 0.70 = 1.05 J: every configuration is affordable; q8 is the most accurate
    assert quality.config == "q8"


def test_overlapping_intervals_leave_the_pick_undecided_with_its_rivals() -> None:
    close = {**CONFIGS, "mix": ConfigFigures(_f(0.59, 0.01), _f(0.86, 0.2), _f(0.0199, 0.002))}
    latency, energy, _ = guidance(close, accuracy_loss=0.02)
    assert energy.config == "mix" and energy.status == "undecided"
    assert energy.rivals == ("q8",)
    assert latency.rivals == ("q8",)


def test_without_accuracy_every_configuration_is_ranked_and_quality_is_not_answered() -> None:
    bare = {c: ConfigFigures(None, f.j_per_token, f.s_per_token) for c, f in CONFIGS.items()}
    latency, energy, quality = guidance(bare)
    assert (latency.config, energy.config) == ("q4", "q4")
    assert "no accuracy" in energy.criterion
    assert quality.config is None and quality.status == "undecided"


def test_a_figure_without_an_interval_is_never_decided() -> None:
    one = {"q8": ConfigFigures(Figure(0.6, NAN, NAN), Figure(1.0, NAN, NAN), None)}
    _, energy, quality = guidance(one)
    assert energy.config == "q8" and energy.status == "undecided"
    assert quality.config == "q8" and quality.status == "undecided"


def test_a_paired_verdict_overrides_the_intervals_both_ways() -> None:
    """The study's own paired verdict decides: overlapping intervals told apart by a paired
    test are decided; disjoint ones a paired test could not separate are not."""
    close = {**CONFIGS, "mix": ConfigFigures(_f(0.59, 0.01), _f(0.86, 0.2), _f(0.016, 0.0005))}
    told = guidance(close, told_apart=lambda a, b, q: True if q == "energy" else None)
    assert told[1].config == "mix" and told[1].status == "decided"
    untold = guidance(CONFIGS, accuracy_loss=0.02,
                      told_apart=lambda a, b, q: False if q == "energy" else None)
    assert untold[1].config == "mix" and untold[1].rivals == ("q8",)
    assert untold[0].status == "decided"  # time has no paired verdict: the intervals decide
