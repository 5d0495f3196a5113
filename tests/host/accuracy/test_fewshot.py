"""k-shot prompts (host/accuracy/fewshot.py): which shots, the template, no item scored with
itself, the store keyed on the protocol, and hostile shot specs refused in one line."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from epi.core.errors import UserError
from host.accuracy import fewshot
from host.accuracy.items import Item, question_context, shared_item


def _arc(n: int) -> list[Item]:
    return [shared_item(f"q{i}", question_context(f"What is {i}?"), ["a", "b"], i % 2)
            for i in range(n)]


def _mmlu(subject: str, n: int) -> list[Item]:
    return [shared_item(f"{subject}/row{i}", question_context(f"Q{i}?"), ["x", "y", "z"], 2)
            for i in range(n)]


def test_the_template_is_description_labelled_shots_and_the_question() -> None:
    items = _mmlu("high_school_physics", 8)
    (group,) = fewshot.choose("mmlu", items, 2, 1234)
    assert [s.id for s in group.shots] == [items[0].id, items[1].id]  # first k of the subject
    (scored,) = fewshot.with_shots("mmlu", fewshot.without_shots(items, [group])[:1], [group])
    assert scored.contexts[0] == (
        "The following are questions (with answers) about high school physics.\n\n"
        "Question: Q0?\nAnswer: z\n\nQuestion: Q1?\nAnswer: z\n\nQuestion: Q2?\nAnswer:")
    assert scored.continuations == (" x", " y", " z") and scored.shared_prefix


def test_arc_shots_are_the_seeded_draw_and_never_scored() -> None:
    items = _arc(40)
    (group,) = fewshot.choose("arc_challenge", items, 25, 7)
    assert list(group.shots) == random.Random(7).sample(items, 25)  # the documented rule
    pool = fewshot.without_shots(items, [group])
    assert len(pool) == 15 and not {i.id for i in pool} & {s.id for s in group.shots}
    for it in fewshot.with_shots("arc_challenge", pool, [group]):
        assert it.contexts[0].startswith(group.prefix)
        assert it.contexts[0].count("Question:") == 26  # 25 shots and the item itself


def test_mmlu_groups_by_subject_and_zero_shots_change_nothing() -> None:
    items = _mmlu("anatomy", 6) + _mmlu("virology", 4)
    groups = fewshot.choose("mmlu", items, 3, 0)
    assert {g.key: len(g.shots) for g in groups} == {"anatomy": 3, "virology": 3}
    assert "about virology" in groups[1].prefix
    assert fewshot.choose("mmlu", items, 0, 0) == []
    assert fewshot.with_shots("mmlu", items, []) == items


def test_too_few_items_for_the_shots_is_one_line() -> None:
    with pytest.raises(UserError, match="not enough for 5 shots"):
        fewshot.choose("arc_challenge", _arc(5), 5, 0)
    with pytest.raises(UserError, match=r"winogrande.*give it 0"):
        fewshot.check_shots("winogrande", 1)


@pytest.mark.parametrize(("spec", "want"), [
    ("0", {"mmlu": 0, "arc_challenge": 0, "winogrande": 0}),
    ("3", {"mmlu": 3, "arc_challenge": 3}),
    ("study", {"mmlu": 5, "arc_challenge": 25, "winogrande": 0}),
    ("mmlu=5, arc_challenge=1", {"mmlu": 5, "arc_challenge": 1}),
])
def test_shot_specs(spec: str, want: dict[str, int]) -> None:
    assert fewshot.parse_shots(spec, ["mmlu", "arc_challenge", "winogrande"]) == want


@given(st.text(max_size=40))
def test_a_hostile_shot_spec_is_a_user_error_or_valid(text: str) -> None:
    try:
        out = fewshot.parse_shots(text, ["mmlu", "hellaswag"])
    except UserError as exc:
        assert "\n" not in str(exc)
        return
    assert all(0 <= k <= fewshot.MAX_SHOTS for k in out.values())


def test_the_store_keys_on_shots_seed_and_template(prepared: Path) -> None:
    from host.accuracy.evaluate import Settings, benchmark_key, load_benchmarks

    keys = []
    for shots, seed in ((0, 1234), (2, 1234), (2, 99)):
        s = Settings(benches=["hellaswag"], n=5, shots={"hellaswag": shots}, shot_seed=seed)
        bd = load_benchmarks(s)["hellaswag"]
        key = benchmark_key("m" * 64, bd, s)
        assert key["shots"] == shots and key["template_version"] == fewshot.TEMPLATE_VERSION
        keys.append(json.dumps(key, sort_keys=True))
    assert len(set(keys)) == 3  # three protocols, three entries: never mixed


def test_study_files_default_to_the_studys_shots(tmp_path: Path) -> None:
    from host.campaign.study import load_study
    from tests.host.test_campaign_preflight import _study

    s = load_study(_study(tmp_path, accuracy="benchmarks = { arc_challenge = 10, mmlu = 20 }"))
    assert s.accuracy.shots == {"arc_challenge": 25, "mmlu": 5}
    s = load_study(_study(tmp_path, accuracy="benchmarks = { arc_challenge = 10 }\n"
                                             "shots = { arc_challenge = 3 }"))
    assert s.accuracy.shots == {"arc_challenge": 3}
    for bad, field in (("shots = { mmlu = 5 }", "shots.mmlu"),
                       ("shots = { arc_challenge = -1 }", "shots.arc_challenge"),
                       ("shots = { arc_challenge = true }", "shots.arc_challenge")):
        with pytest.raises(UserError, match=field):
            load_study(_study(tmp_path, accuracy="benchmarks = { arc_challenge = 10 }\n" + bad))
