"""The analysis' comparison records read back what they write, keys in results.json's order."""

from __future__ import annotations

import json
import math

from host.analysis.records import GroupDifferential, PerplexityPair, TimeShareEstimate

# results.json's keys for each record, in the order the file has always had them
PAIR_KEYS = ["cheaper", "dearer", "ppl_cheaper", "ppl_dearer", "ppl_rel_diff",
             "j_per_token_cheaper", "j_per_token_dearer", "saving_pct", "saving_pct_ci_lo",
             "saving_pct_ci_hi", "delta_j_per_token", "delta_ci_lo", "delta_ci_hi",
             "ci_coverage", "ci_method", "n_pairs", "distinguishable", "reason",
             "ppl_tolerance", "energy_basis"]
DIFF_KEYS = ["group", "config_a", "config_b", "type_a", "type_b", "delta_j_per_token", "ci_lo",
             "ci_hi", "ci_coverage", "ci_method", "n_a", "n_b", "distinguishable", "reason",
             "energy_basis", "method"]
SHARE_KEYS = ["config", "node", "group", "j_per_token", "energy_basis", "label"]


def test_a_pair_round_trips_through_json_in_file_order():
    doc = dict(zip(PAIR_KEYS, ["q4", "q8", 20.0, 20.1, 0.005, 0.1, 0.12, 16.7, 10.0, 20.0,
                               -0.02, -0.03, -0.01, 0.95, "paired by round", 3, True, "",
                               0.01, "gross J per generated token (whole request)"],
                          strict=True))
    p = PerplexityPair.from_json(json.loads(json.dumps(doc)))
    assert list(p.to_json()) == PAIR_KEYS
    assert p.to_json() == doc


def test_a_differential_reads_a_null_interval_as_nan_and_an_unknown_verdict_as_none():
    doc = dict(zip(DIFF_KEYS, ["late", "q4", "q8", "Q4_K", "Q8_0", 0.03, None, None, None,
                               "Welch", 1, 2, None, "needs ≥ 2 valid repeats", "gross", "d"],
                          strict=True))
    d = GroupDifferential.from_json(doc)
    assert math.isnan(d.ci_lo) and math.isnan(d.ci_hi) and d.distinguishable is None
    assert list(d.to_json()) == DIFF_KEYS and (d.n_a, d.n_b) == (1, 2)


def test_a_time_share_estimate_round_trips():
    doc = dict(zip(SHARE_KEYS, ["q8", "pi1", "late", 0.2, "gross", "estimate"], strict=True))
    assert TimeShareEstimate.from_json(doc).to_json() == doc
    assert list(TimeShareEstimate.from_json(doc).to_json()) == SHARE_KEYS
