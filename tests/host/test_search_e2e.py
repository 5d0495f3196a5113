"""A small-budget `epi search` end to end: real probes through llama-quantize and llama.cpp, two
rounds of real campaigns on the emulated meter (round 0: the hand-made maps; round 1: the picks
beside the best of them, with the campaign's [decide] rounds), a fit in between, maps in the
quantmaps format, measured figures taken from the campaign's own results (read here with the csv
module), the power labelled as modelled, each candidate's comparison with the best hand-made map
agreeing with the campaign's own decision, and a second invocation that resumes without
measuring again and keeps the verdicts.

Cost (215 s on an idle 2-core machine before these cuts): one 64-token prompt per
request (a run is 1 warm-up and 3 repeats of one request, not of every default prompt), round 0
one fixed round (its 3 repeats still give each hand-made map an interval), one candidate round
of the 3 rounds a comparison needs, and each repeat's cool-down and idle window cut from the
campaign's 1 s + 3 s to 0.1 s + 0.2 s (`--cooldown-s`, `--idle-s`; still 8 meter samples of
idle at 40 Hz). 11 metered runs instead of 13 at 12 s of sleeping each. The generated tokens
are what the analysis' checks need, computed below (GEN_TOKENS), not fewer.

Its metered runs use one thread beside the emulated meter's daemon, as the demo does, with the
repeat-CV limit raised (the modelled power follows this machine's load) so the campaign's
validity checks pass on a shared 2-core machine; every configuration must then have measured
figures, and the test checks the predictions and the verdict against them.
"""

from __future__ import annotations

import csv
import json
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest

from host.quant.mixmap import load_mixmap
from host.quant.tiny_model import write_test_model

REPO = Path(__file__).resolve().parents[2]
HAND = [REPO / "quantmaps" / "demo" / f"demo_{t}.json" for t in ("q8_0", "q4_0")]
# Tokens generated per request. The binding check is not the 40 Hz meter's 2 samples per window
# (50 ms) but the energy counter's resolution: the emulated meter counts 0.0036 J, which must be
# at most 0.5 % of the median request energy (host/analysis/verdicts.py), so a request needs
# ≥ 0.72 J. An idle 2-core VM decodes the 3-layer Q4_0 map at one thread at ~1,800 tok/s
# (2026-11-27: 192 tokens gave 0.405 J a request, 2.1 mJ a token, and the check refused
# demo_q4_0), so 432 tokens (0.91 J there; the most the 512-token context leaves beside the
# 64-token prompt, with a margin) are needed; a slower or loaded machine only adds energy.
GEN_TOKENS = 432
TEXT = " ".join(
    ["The meter reads the wall feed of every node while the model writes one token after another."]
    * 40
)


def _one_prompt(tmp_path: Path) -> Path:
    """examples/prompts-search.json's one prompt cut to 64 tokens: the tiny model's context is
    512 tokens, too short for its 384-token prompt plus 256 generated."""
    doc = json.loads((REPO / "examples" / "prompts-search.json").read_text())
    doc["prompts"] = [{**doc["prompts"][0], "n_tokens": 64}]
    doc["name"], doc["version"] = "epi-search-e2e", "epi-search-e2e-v1"
    path = tmp_path / "prompts.json"
    path.write_text(json.dumps(doc))
    return path


def _search(model: Path, out: Path, text: Path) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "epi", "search", str(model), "--out", str(out),
            "--against", str(HAND[0]), "--against", str(HAND[1]),
            "--types", "Q8_0,Q4_0", "--candidates", "2", "--per-round", "2",
            "--prompts", str(text.with_name("prompts.json")), "--max-rounds", "3",
            "--text", str(text), "--kl-windows", "1", "--kl-ctx", "64",
            "--tokens", str(GEN_TOKENS), "--meter-rate-hz", "40", "--repeats", "1",
            "--cooldown-s", "0.1", "--idle-s", "0.2", "--items", "10",
            "--threads", "2", "--run-threads", "1", "--lag", "auto",
            # the search's mechanics are under test here, not the meter's validity rules
            # (tested in tests/host/test_analyze*.py): the modelled power follows the whole
            # machine's CPU, whose load a shared 2-core CI machine does not hold to the 3 %
            # repeat CV the analysis asks by default, so the limit is raised for this test
            "--cv-threshold", "0.5",
            # the tiny model's 432-token request draws 0.71-0.91 J by the machine's speed,
            # at the 0.72 J the default 0.5 % resolution limit needs: the search's flow is
            # under test, not the counter's step (the gate keeps its default in the e2e
            # analysis tests)
            "--max-resolution-frac", "0.01"]
    return subprocess.run(argv, capture_output=True, text=True, timeout=1500, cwd=REPO)


def _headline_rows(campaign: Path) -> dict[str, dict[str, str]]:
    with (campaign / "analysis" / "results.csv").open(newline="") as f:
        return {r["config"]: r for r in csv.DictReader(f)
                if (r["scope"], r["phase"], r["unit"], r["basis"])
                == ("all", "request", "generated", "gross")}


@pytest.mark.slow
@pytest.mark.shares_cpu  # one thread of llama.cpp beside the meter daemon, its gates set for a
                         # loaded machine: it runs beside another test (tests/conftest.py)
def test_small_budget_search_measures_through_the_campaign_and_resumes(tmp_path: Path) -> None:
    model = write_test_model(tmp_path / "tiny.gguf", n_layers=3)
    text = tmp_path / "held_out.txt"
    text.write_text(TEXT)
    _one_prompt(tmp_path)
    out = tmp_path / "search"

    first = _search(model, out, text)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    log = first.stdout
    assert log.count(": campaign ") == 2  # two rounds, each one campaign
    assert "sensitivity: 6 probe(s)" in log  # 3 layers × 2 types
    assert "verdict: " in log

    doc = json.loads((out / "summary.json").read_text())
    rows = {r["config"]: r for r in doc["configs"]}
    search_ids = sorted(c for c, r in rows.items() if r["kind"] == "search")
    assert len(search_ids) == 2 and {"demo_q8_0", "demo_q4_0"} <= set(rows)

    # measured figures are the campaign's own, round by round, and labelled modelled
    for k in (0, 1):
        for cfg, row in _headline_rows(out / f"round{k}" / "campaign").items():
            measured = doc["configs"][[r["config"] for r in doc["configs"]].index(cfg)]
            if measured["measured"]["round"] != k:
                continue  # the anchor is measured every round; the summary keeps the latest
            j = measured["measured"]["j_per_token"]
            if row["j_per_token_median"]:
                assert j == pytest.approx(float(row["j_per_token_median"]), rel=1e-12)
            else:
                assert math.isnan(j) and measured["measured"]["reason"]
            assert measured["measured"]["power_source"].startswith("modelled")

    # every measured configuration has measured figures (one thread beside the emulated meter
    # leaves the daemon its core; a run the checks refuse would show here with its reason)
    missing = {c: r["measured"]["reason"] for c, r in rows.items()
               if not (math.isfinite(r["measured"]["j_per_token"])
                       and math.isfinite(r["measured"]["accuracy"])
                       and math.isfinite(r["measured"]["epi"]))}
    assert not missing, missing
    for r in rows.values():  # each configuration has an interval (over its runs' repeats)
        assert all(math.isfinite(x) for x in r["measured"]["epi_ci"]), r["config"]

    # round 0 measured the hand-made maps alone; both picks were predicted from their two
    # points before they were measured, and that is what the summary reports as predicted
    state = json.loads((out / "search.json").read_text())
    assert all(c.startswith("search_r1_") for c in search_ids)
    for cid in search_ids:
        assert state["predictions"][cid]["fit_n"] == 2
        assert rows[cid]["predicted_epi"] == state["predictions"][cid]["predicted_epi"]
        assert math.isfinite(rows[cid]["predicted_j_per_token"])
    assert doc["energy_model"]["n"] == 4 and len(doc["energy_model"]["residuals_j"]) == 4

    # round 1's campaign decides each pick against the best hand-made map of round 0 (lowest
    # EPI in round 0's own results.csv), and the search's verdict is the campaign's decision
    r0 = _headline_rows(out / "round0" / "campaign")
    best = min(("demo_q8_0", "demo_q4_0"), key=lambda c: float(r0[c]["epi"]))
    study = (out / "round1" / "study.toml").read_text()
    assert f'baseline = "{best}"' in study and 'compare = ["baseline"]' in study
    decisions = json.loads((out / "round1" / "campaign" / "analysis" / "decisions.json")
                           .read_text())["lines"]
    assert set(state["verdicts"]) == set(search_ids)
    for cid in search_ids:
        v = state["verdicts"][cid]
        assert v["against"] == best and rows[cid]["decision"] == v
        line = next(x for x in decisions if f"{best} → {cid}: " in x)
        said = re.match(r"(decided|equivalent|undecided)", line.split(f"{best} → {cid}: ")[1])
        assert said is not None and said.group(1) == v["state"]
        assert f"n={v['paired_rounds']}" in line
        if v["state"] == "undecided":
            assert v["reason"]
        assert f"  {cid}: {v['text']}" in log

    # both tiny-model maps are expressible in Q8_0/Q4_0: every map has a summed proxy
    assert all(r["proxy_kl_nats"] is not None for r in rows.values())

    # the verdict agrees with the measured points
    v = doc["verdict"]
    hand = {c: r["measured"] for c, r in rows.items() if r["kind"] == "hand-made"}
    found = {c: r["measured"] for c, r in rows.items() if r["kind"] == "search"}
    best_hand = min(hand, key=lambda c: hand[c]["epi"])
    best_found = min(found, key=lambda c: found[c]["epi"])
    assert (v["best_hand_made"], v["best_search"]) == (best_hand, best_found)
    if found[best_found]["epi"] < hand[best_hand]["epi"]:
        assert v["text"].startswith(f"{best_found} has a lower measured EPI")
    else:
        assert "found nothing with a lower measured EPI" in v["text"]
    for c, m in found.items():
        beaten = any(h["j_per_token"] <= m["j_per_token"] and h["accuracy"] >= m["accuracy"]
                     and (h["j_per_token"] < m["j_per_token"] or h["accuracy"] > m["accuracy"])
                     for h in hand.values())
        assert (c in v["on_or_beyond_frontier"]) == (not beaten)
    assert ("did not move" in v["frontier"]["text"]) == (not v["on_or_beyond_frontier"])
    assert "frontier: " in log and "rank correlation" in log
    assert (out / "search.html").stat().st_size > 0 and (out / "search.md").exists()

    # the found maps are ordinary mix maps that load and name one type per layer
    for cfg in search_ids:
        mixmap = load_mixmap(out / "maps" / f"{cfg}.json")
        assert mixmap.id == cfg
        assert "Measured EPI" in mixmap.description and "modelled" in mixmap.description
    assert (out / "search.png").stat().st_size > 0

    # the same command again continues from search.json and measures nothing twice
    again = _search(model, out, text)
    assert again.returncode == 0, again.stderr[-3000:]
    assert ": campaign " not in again.stdout
    assert "probe(s) to quantize" not in again.stdout
    assert json.loads((out / "search.json").read_text())["verdicts"] == state["verdicts"]
