"""bench/bench_fewshot.py's arithmetic: the prefix's one decode spread over the study's items,
checked against the ratio written out by hand, and the study's item count read from its file."""

from __future__ import annotations

import pytest

from tests.bench_modules import BENCH, load_bench

bench = load_bench("bench_fewshot")


def test_the_prefix_spread_over_more_items_by_hand() -> None:
    # zero-shot 0.100 s an item; 40 shared items took 0.170 s each, of which a 2.0 s prefix:
    # the items' own 0.120 s. Over 299 items: (2.0 / 299 + 0.120) / 0.100 = 1.2669
    got = {"zero": [0.100], "shared": [0.170], "prefix": [2.0], "recomputed": [1.0]}
    assert bench.at_items(got, 40, 299) == pytest.approx([1.26689], abs=1e-5)
    # spread over the bench's own 40 items it is the measured ratio itself
    assert bench.at_items(got, 40, 40) == pytest.approx([1.7])


def test_a_run_shorter_than_its_prefix_counts_no_negative_item_time() -> None:
    got = {"zero": [0.1], "shared": [0.04], "prefix": [2.0], "recomputed": [1.0]}
    assert bench.at_items(got, 40, 299) == pytest.approx([2.0 / 299 / 0.1])


def test_the_study_items_are_the_paper_study_files() -> None:
    text = (BENCH.parent / "hardware" / "study-paper-llama-3.1-8b.toml").read_text()
    assert "arc_challenge = 299" in text
    assert bench.study_items() == 299
