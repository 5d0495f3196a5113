"""Split configurations beside their parents (host/analysis/split_compare.py): the parents from
run.json, the paired differences per phase and the 'beats both' verdict, against values
written out by hand."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from host.analysis import split_compare as sc

ROUNDS = 4
T_975_DF3 = 3.182446305284263  # Student-t 97.5 % quantile, 3 degrees of freedom (tables)


def _tables(values: dict[str, list[float]], *, invalid: set[str] = frozenset()
            ) -> tuple[pd.DataFrame, pd.DataFrame]:
    """repeats.csv and runs.csv rows: one run (one repeat) per configuration and round, the
    same J/token in every phase."""
    rep, runs = [], []
    for cfg, vals in values.items():
        for k, v in enumerate(vals, 1):
            run_id = f"{cfg}-{k}"
            for phase in ("prefill", "decode", "request"):
                unit = "prompt" if phase == "prefill" else "generated"
                rep.append({"config": cfg, "run_id": run_id, "scope": "all", "phase": phase,
                            "unit": unit, "basis": "net", "j_per_token": v,
                            "t_start_meter_ns": k * 10**9, "campaign_round": k})
                runs.append({"run_id": run_id, "phase": phase,
                             "valid": cfg not in invalid})
    return pd.DataFrame(rep), pd.DataFrame(runs)


SPLIT = sc.SplitParents("s", "a", "b")


def test_the_parents_come_from_the_split_runs_headers() -> None:
    headers = [("a", {"run_id": "1"}),
               ("s", {"split": {"prefill": {"map_id": "a"}, "decode": {"map_id": "b"}}}),
               ("s", {"split": {"prefill": {"map_id": "a"}, "decode": {"map_id": "b"}}})]
    assert sc.split_parents(headers) == [SPLIT]


def test_the_difference_is_the_paired_mean_with_its_t_interval() -> None:
    a = [1.00, 1.10, 0.95, 1.05]
    b = [0.90, 0.97, 0.88, 0.93]
    s = [0.80, 0.91, 0.74, 0.85]
    rep, runs = _tables({"a": a, "b": b, "s": s})
    diffs = sc.differences(rep, runs, [SPLIT], basis="net")
    d = next(x for x in diffs if x.parent == "a" and x.phase == "request")
    x = np.array(s) - np.array(a)  # by round
    half = T_975_DF3 * x.std(ddof=1) / math.sqrt(ROUNDS)
    assert d.delta_j_per_token == pytest.approx(x.mean())
    assert (d.ci_lo, d.ci_hi) == pytest.approx((x.mean() - half, x.mean() + half))
    assert d.n_pairs == ROUNDS and d.role == "prefill"
    assert sc.verdict(diffs, "s") == "beats both"


def test_a_split_dearer_than_one_parent_does_not_beat_both() -> None:
    rep, runs = _tables({"a": [1.0, 1.1, 0.95, 1.05], "b": [0.5, 0.55, 0.52, 0.51],
                         "s": [0.8, 0.9, 0.76, 0.84]})
    assert sc.verdict(sc.differences(rep, runs, [SPLIT], basis="net"), "s") == \
        "does not beat both"


def test_a_split_within_its_parents_noise_is_undecided() -> None:
    rep, runs = _tables({"a": [1.0, 1.2, 0.9, 1.1], "b": [1.0, 1.2, 0.9, 1.1],
                         "s": [1.1, 1.0, 1.05, 0.95]})
    assert sc.verdict(sc.differences(rep, runs, [SPLIT], basis="net"), "s") == "undecided"


def test_invalid_runs_are_left_out() -> None:
    rep, runs = _tables({"a": [1.0, 1.1, 0.95, 1.05], "b": [0.9, 0.97, 0.88, 0.93],
                         "s": [0.8, 0.91, 0.74, 0.85]}, invalid={"a"})
    diffs = sc.differences(rep, runs, [SPLIT], basis="net")
    d = next(x for x in diffs if x.parent == "a" and x.phase == "request")
    assert d.n_pairs == 0 and not d.decided and d.reason
    assert sc.verdict(diffs, "s") == "undecided"


def test_the_document_reads_back(tmp_path) -> None:
    rep, runs = _tables({"a": [1.0, 1.1, 0.95, 1.05], "b": [0.9, 0.97, 0.88, 0.93],
                         "s": [0.8, 0.91, 0.74, 0.85]})
    diffs = sc.differences(rep, runs, [SPLIT], basis="net")
    (tmp_path / sc.SPLITS_JSON).write_bytes(sc.write([SPLIT], diffs))
    splits, back = sc.read(tmp_path)
    assert splits == [SPLIT] and back == diffs


@pytest.mark.parametrize("text", ["", "{", "[]", '{"splits": [{}]}',
                                  '{"splits": [], "differences": [{"x": 1}]}'])
def test_a_damaged_document_is_one_line(tmp_path, text: str) -> None:
    from epi.core.errors import UserError

    (tmp_path / sc.SPLITS_JSON).write_text(text)
    with pytest.raises(UserError, match=r"splits\.json: not a split comparison"):
        sc.read(tmp_path)
