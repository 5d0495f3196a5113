"""Runs sized to the machine (host/campaign/sizing.py): the tokens per request chosen from a
speed probe so that the measuring budget holds the rounds the power analysis asks for, the
statement when it cannot, and the campaign using what it says it chose."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from host.analysis import sequential
from host.campaign.sizing import (
    MIN_DECODE_SAMPLES,
    SIZING_JSON,
    RunShape,
    RunSizing,
    SpeedProbe,
    floor_tokens,
    read_sizing,
    run_seconds,
    size_runs,
    write_sizing,
)

PROBE = SpeedProbe(model="m.gguf", threads=1, prompt_tokens=256, decode_tokens=64,
                   prefill_tok_s=800.0, decode_tok_s=50.0, load_s=1.0)
# 3 prompts of 960 tokens in all, 1 warm-up + 2 repeats, 3 s of pauses a repeat, 2 s settle
SHAPE = RunShape(n_prompts=3, prompt_tokens=960, warmups=1, repeats=2, pause_s=3.0,
                 settle_s=2.0)


def by_hand(tokens: int) -> float:
    """One run's seconds written out: load + passes × (prefill + decode) + pauses + settle."""
    return 1.0 + 3 * (960 / 800 + 3 * tokens / 50) + 2 * 3.0 + 2.0


def test_a_run_takes_its_passes_pauses_and_settle() -> None:
    assert run_seconds(SHAPE, 256, PROBE) == pytest.approx(by_hand(256))
    assert by_hand(256) == pytest.approx(1 + 3 * (1.2 + 15.36) + 6 + 2)


def test_the_floor_holds_the_decode_window_samples() -> None:
    # 40 samples at 20 Hz are 2 s of decode: 100 tokens at 50 tok/s
    assert floor_tokens(50.0, 20.0) == 100
    assert MIN_DECODE_SAMPLES / 20.0 * 50.0 == 100
    assert floor_tokens(5.0, 40.0) == 32  # never under 32 tokens, however slow


def _size(budget_s: float, *, spread: float = 3.0, diff: float = 10.0,
          min_rounds: int = 3, max_rounds: int = 8, tokens: int = 256) -> RunSizing:
    return size_runs(study_tokens=tokens, shape=SHAPE, probe=PROBE, n_configs=5,
                     budget_s=budget_s, rate_hz=20.0, spread_pct=spread,
                     spread_basis="assumed", size_for_pct=diff, min_rounds=min_rounds,
                     max_rounds=max_rounds)


def test_the_study_tokens_stay_when_the_budget_holds_the_rounds() -> None:
    need = sequential.rounds_for(3.0, 10.0)
    assert need is not None and 3 <= need <= 8
    s = _size(need * 5 * by_hand(256) + 1)
    assert s.tokens == 256 and s.fits and s.rounds_affordable == need


def test_tokens_are_halved_until_the_rounds_fit() -> None:
    need = sequential.rounds_for(3.0, 10.0)
    assert need is not None
    # room for `need` rounds of 128-token runs, not of 256-token ones
    s = _size(need * 5 * by_hand(128) + 1)
    assert s.tokens == 128 and s.fits
    assert s.per_run_s == pytest.approx(by_hand(128))
    assert s.rounds_affordable == need
    assert "shortened to fit" in s.lines()[1] and "sized to this machine" in s.lines()[1]


def test_when_nothing_fits_it_says_so_with_the_numbers() -> None:
    s = _size(60.0)  # one minute for 5 configurations
    assert not s.fits
    assert s.tokens == 100  # the floor at 50 tok/s, 20 Hz
    assert s.rounds_affordable == 0
    text = s.lines()[1]
    need = sequential.rounds_for(3.0, 10.0)
    assert f"takes about {need} rounds" in text
    assert "the budget of 1m00s holds 0 round(s)" in text
    assert "--extend-budget" in text


def test_the_round_target_is_within_the_study_limits() -> None:
    # a 1 % difference at a 5 % spread needs hundreds of rounds: the target is max_rounds
    s = _size(1e9, spread=5.0, diff=1.0, max_rounds=6)
    assert s.rounds_target == 6 and s.tokens == 256
    # a 50 % difference at 1 %: fewer than min_rounds, which every comparison runs anyway
    assert _size(1e9, spread=1.0, diff=50.0, min_rounds=4).rounds_target == 4


@settings(max_examples=60, derandomize=True, deadline=None)
@given(budget=st.floats(1.0, 1e5), spread=st.floats(0.1, 30.0), diff=st.floats(0.5, 60.0),
       tokens=st.integers(1, 4096))
def test_the_choice_is_never_above_the_study_nor_below_the_floor(
        budget: float, spread: float, diff: float, tokens: int) -> None:
    s = _size(budget, spread=spread, diff=diff, tokens=tokens)
    assert min(tokens, 100) <= s.tokens <= tokens
    assert s.per_run_s == pytest.approx(run_seconds(SHAPE, s.tokens, PROBE))
    assert s.rounds_affordable == int(budget // (s.per_run_s * 5))
    if s.fits and s.tokens < tokens:  # a larger size would not have fitted
        larger = s.tokens * 2 if s.tokens * 2 <= tokens else tokens
        assert budget // (run_seconds(SHAPE, larger, PROBE) * 5) < s.rounds_target


def test_the_record_reads_back_and_is_ignored_for_other_tokens(tmp_path: Path) -> None:
    s = _size(600.0)
    write_sizing(tmp_path, s)
    assert read_sizing(tmp_path, 256) == s
    assert read_sizing(tmp_path, 512) is None  # the study's tokens changed: stale
    (tmp_path / SIZING_JSON).write_text("{not json")
    assert read_sizing(tmp_path, 256) is None
    doc = s.to_json()
    assert json.loads(json.dumps(doc))["format"] == "epi-run-sizing"
    assert math.isfinite(RunSizing.from_json(doc).per_run_s)


def _study(tmp_path: Path, model: Path) -> Path:
    from tests.host.campaign_fixtures import write_prompts

    prompts = write_prompts(tmp_path / "prompts.json")
    p = tmp_path / "study.toml"
    p.write_text(f"""
[study]
name = "sized"
out = "camp"

[[models]]
name = "tiny"
path = "{model}"
include_base = true

[run]
tokens = 128
repeats_per_run = 2
prompts = "{prompts}"

[meter]
emulate = true

[decide]
compare = ["baseline"]
time_budget_min = 5
""")
    return p


def test_the_campaign_runs_the_size_it_recorded(tmp_path: Path, tiny_model: Path) -> None:
    """The sizing's claim checked against its effect: the run steps ask `epi run` for the
    recorded tokens, and the plan's run estimate is the recorded one."""
    from host.campaign.execute import Campaign
    from host.campaign.journal import JournalState
    from host.campaign.study import load_study

    study = load_study(_study(tmp_path, tiny_model))
    sized = RunSizing(study_tokens=128, tokens=64, floor_tokens=64, per_run_s=12.5,
                      n_configs=1, budget_s=300.0, spread_pct=3.0, spread_basis="assumed",
                      size_for_pct=10.0, rounds_needed=5, rounds_target=5,
                      rounds_affordable=24, probe=PROBE)
    write_sizing(study.out, sized)
    c = Campaign(study)
    step = c.plan.run_steps[0]
    assert step.estimate_s == 12.5
    args, _ = c._args(step, JournalState())
    assert args["tokens"] == 64
    # without the record, the study's own tokens
    (study.out / SIZING_JSON).unlink()
    c2 = Campaign(study)
    assert c2._args(c2.plan.run_steps[0], JournalState())[0]["tokens"] == 128


def test_short_warm_ups_are_projected_at_their_own_tokens() -> None:
    """A warm-up of 16 tokens costs its prefill and 16 tokens a prompt, not the run's tokens;
    a warm-up asked longer than the run is cut to the run's (as the runner does)."""
    short = RunShape(n_prompts=3, prompt_tokens=960, warmups=1, repeats=2, pause_s=3.0,
                     settle_s=2.0, warmup_tokens=16)
    by_hand_short = 1.0 + (960 / 800 + 3 * 16 / 50) + 2 * (960 / 800 + 3 * 256 / 50) + 6 + 2
    assert run_seconds(short, 256, PROBE) == pytest.approx(by_hand_short)
    long = RunShape(n_prompts=3, prompt_tokens=960, warmups=1, repeats=2, pause_s=3.0,
                    settle_s=2.0, warmup_tokens=10_000)
    assert run_seconds(long, 256, PROBE) == pytest.approx(by_hand(256))
