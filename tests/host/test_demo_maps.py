"""The demo's maps do what the demo study says they do (docs/campaign.md, "The demo's maps"):
demo_q8_0 and demo_q4_1 are a perplexity-matched pair (within the analysis' default
ppl_tolerance on the same lambada windows) while demo_q4_0 is not, and the four Q8_0/Q4_0
maps differ one layer group at a time. Perplexities come from epi's scorer, which
tests/host/accuracy cross-checks against llama-perplexity."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib

from host.analysis.model import Options

REPO = Path(__file__).resolve().parents[2]
STUDY = REPO / "examples" / "study-demo.toml"


def _maps() -> dict[str, dict[str, str]]:
    """map id → group → type, for every map of the demo study."""
    doc = tomllib.loads(STUDY.read_text())
    out = {}
    for rel in doc["models"][0]["maps"]:
        m = json.loads((STUDY.parent / rel).read_text())
        out[m["id"]] = {g["name"]: g["type"] for g in m["groups"]}
    return out


def test_the_q8_q4_maps_differ_one_group_at_a_time() -> None:
    maps = _maps()
    chain = ["demo_q8_0", "demo_bookend_q8_q4_q8", "demo_q8_q4_q4", "demo_q4_0"]
    varied = []
    for a, b in itertools.pairwise(chain):
        assert set(maps[a]) == set(maps[b]) == {"early", "middle", "late"}
        diff = [g for g in maps[a] if maps[a][g] != maps[b][g]]
        assert len(diff) == 1, (a, b, diff)
        varied += diff
    assert sorted(varied) == ["early", "late", "middle"]  # every group is varied once


@pytest.mark.slow
def test_q4_1_matches_q8_0_on_perplexity_and_q4_0_does_not(tmp_path: Path) -> None:
    from host.accuracy import evaldata
    from host.quant.models import prepare_model

    base = prepare_model("smollm2").path
    assert base is not None
    evaldata.ensure_prepared(["arc_challenge"], ["lambada"])  # none, on a fresh machine
    maps = [REPO / "quantmaps" / "demo" / f"demo_{t}.json" for t in ("q8_0", "q4_1", "q4_0")]
    q = subprocess.run([sys.executable, "-m", "epi", "quantize", "--model", str(base), "--out",
                        str(tmp_path), *map(str, maps)], cwd=REPO, capture_output=True,
                       text=True, timeout=600, check=False)
    assert q.returncode == 0, q.stderr[-2000:]
    out = tmp_path / "acc.json"
    a = subprocess.run([sys.executable, "-m", "epi", "accuracy",
                        *[str(tmp_path / f"{m.stem}.gguf") for m in maps],
                        "--bench", "arc_challenge", "--n", "2", "--ppl", "lambada",
                        "--ppl-windows", "8", "--threads", "2", "--out", str(out)],
                       cwd=REPO, capture_output=True, text=True, timeout=900, check=False)
    assert a.returncode == 0, a.stderr[-2000:]
    ppl = {m["map_id"]: m["perplexity"]["ppl"] for m in json.loads(out.read_text())["models"]}
    tol = Options().ppl_tolerance

    def rel(x: str, y: str) -> float:
        return abs(ppl[x] - ppl[y]) / min(ppl[x], ppl[y])

    assert rel("demo_q8_0", "demo_q4_1") <= tol, ppl
    assert rel("demo_q8_0", "demo_q4_0") > 5 * tol, ppl  # the tolerance does tell maps apart
