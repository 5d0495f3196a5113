"""The report's transfer answer, from a two-model study's repeats and quantization manifests.

The study is built here: three maps on a dense and an MoE base, each configuration's per-round
J/token = truth × a round factor × small noise, so the answer is known by construction.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

from host.report.data import Labels, ReportData
from host.report.transfer_answer import model_and_map, transfer_answer

DENSE = {"q8": 1.00, "mix": 0.80, "q4": 0.65, "q6": 0.9}


def _manifest(path: Path, map_id: str, base: str) -> None:
    doc = {"format": "epi-quant-manifest", "format_version": 1, "map_id": map_id,
           "base": {"path": f"/models/{base}.gguf", "sha256": base * 4, "n_layers": 2,
                    "n_params": 1000, "requantized": False},
           "output": {"size_bytes": 1000, "sha256": None}, "total": {}, "inputs": {}}
    path.with_suffix(".manifest.json").write_text(json.dumps(doc))


def _rd(tmp: Path, moe_truth: dict[str, float], rounds: int, seed: int = 0) -> ReportData:
    rng = np.random.default_rng(seed)
    runs, rows = [], []
    for base, truth in (("dense", DENSE), ("moe", moe_truth)):
        drift = rng.lognormal(0, 0.03, rounds)
        for map_id, value in truth.items():
            cfg = f"{map_id}.{base}"
            gguf = tmp / base / f"{map_id}.gguf"
            gguf.parent.mkdir(parents=True, exist_ok=True)
            gguf.write_bytes(b"")
            _manifest(tmp / base / map_id, map_id, base)
            runs.append({"config": cfg, "model": {"path": str(gguf), "map_id": cfg}})
            for r in range(rounds):
                rows.append({"config": cfg, "scope": "all", "phase": "request",
                             "unit": "generated", "basis": "gross", "reason": "",
                             "campaign_round": r + 1,
                             "j_per_token": value * drift[r] * rng.lognormal(0, 0.005)})
    labels = Labels("modelled", "test", "gross", "counter", "step", "")
    empty = pd.DataFrame()
    return ReportData(tmp, {"runs": runs, "options": {}},
                      pd.DataFrame(columns=["config", "scope", "phase", "unit", "basis"]),
                      empty, pd.DataFrame(rows), empty, labels)


def test_configurations_pair_up_by_their_manifests(tmp_path: Path) -> None:
    keys = model_and_map(_rd(tmp_path, DENSE, 3))
    assert keys["q8.dense"] == ("dense", "q8")
    assert keys["q8.moe"] == ("moe", "q8")


def test_a_ranking_that_holds_is_said_to_transfer(tmp_path: Path) -> None:
    a = transfer_answer(_rd(tmp_path, {k: 3 * v for k, v in DENSE.items()}, 8))
    assert a is not None
    assert a.status == "decided", a.text
    assert a.text.startswith("The ranking transfers between dense and moe")
    assert "EPI: no accuracy" in a.text


def test_two_maps_that_swap_are_named_in_the_answer(tmp_path: Path) -> None:
    swapped = {"q8": 3.0, "mix": 3 * 0.62, "q4": 3 * 0.8, "q6": 2.7}
    a = transfer_answer(_rd(tmp_path, swapped, 8))
    assert a is not None
    assert a.status == "decided", a.text
    assert a.text.startswith("It does not: these maps move between dense and moe: ")
    moved = a.text.split("moe: ", 1)[1].split(" (", 1)[0].split(", ")
    assert set(moved[:2]) == {"mix", "q4"}


def test_three_rounds_are_undecided_and_say_how_many_would_do(tmp_path: Path) -> None:
    swapped = {"q8": 3.0, "mix": 3 * 0.62, "q4": 3 * 0.8, "q6": 2.7}
    a = transfer_answer(_rd(tmp_path, swapped, 3))
    assert a is not None
    assert a.status == "undecided"
    assert "at least 6 paired rounds" in a.text


def test_a_one_model_study_is_not_asked(tmp_path: Path) -> None:
    rd = _rd(tmp_path, DENSE, 3)
    rd.doc["runs"] = [r for r in rd.doc["runs"] if r["config"].endswith(".dense")]
    assert transfer_answer(rd) is None
