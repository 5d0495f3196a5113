"""Prompt sets: the shipped default, validation errors, cutting to stated token lengths."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from epi.core.errors import UserError
from host.run.prompts import default_prompts_path, load_prompt_set, prompt_tokens


def _write(tmp_path: Path, data: object) -> Path:
    path = tmp_path / "prompts.json"
    path.write_text(json.dumps(data) if not isinstance(data, str) else data)
    return path


def _valid() -> dict:
    return {
        "format": "epi-prompts",
        "format_version": 1,
        "name": "t",
        "version": "t-v1",
        "prompts": [{"id": "a", "n_tokens": 3, "text": "one two three four"}],
    }


def test_default_set_is_shipped_and_versioned() -> None:
    ps = load_prompt_set()
    assert ps.path == default_prompts_path() and ps.path.name == "prompts-v1.json"
    assert ps.version == "epi-default-v1"
    assert [p.n_tokens for p in ps.prompts] == [32, 64, 128, 256]
    assert len({p.id for p in ps.prompts}) == 4 and ps.max_tokens == 256
    assert len(ps.sha256) == 64


def test_texts_are_cut_to_exact_token_lengths() -> None:
    ps = load_prompt_set()
    words = {p.id: p.text.split() for p in ps.prompts}

    def by_words(texts: list[str]) -> list[list[int]]:  # a stand-in tokenizer: one id per word
        return [[1, *range(2, 2 + len(t.split()))] for t in texts]

    tokens = prompt_tokens(ps, by_words)
    assert {k: len(v) for k, v in tokens.items()} == {p.id: p.n_tokens for p in ps.prompts}
    assert all(v[0] == 1 for v in tokens.values())
    assert all(len(words[p.id]) + 1 >= p.n_tokens for p in ps.prompts)


def test_short_text_is_an_error_not_a_shorter_prompt(tmp_path: Path) -> None:
    data = _valid()
    data["prompts"][0]["n_tokens"] = 50
    ps = load_prompt_set(_write(tmp_path, data))
    with pytest.raises(UserError, match=r"prompt 'a': text gives 2 tokens .* n_tokens 50"):
        prompt_tokens(ps, lambda texts: [[1, 2] for _ in texts])


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda d: d.update(format="other"), "field 'format'"),
        (lambda d: d.update(format_version=9), "'format_version' 9"),
        (lambda d: d.update(version=""), "field 'version'"),
        (lambda d: d.update(prompts=[]), "field 'prompts'"),
        (lambda d: d["prompts"][0].update(n_tokens=0), r"prompts\[0\]\.n_tokens"),
        (lambda d: d["prompts"][0].update(n_tokens="8"), r"prompts\[0\]\.n_tokens"),
        (lambda d: d["prompts"][0].update(id="a,b"), r"prompts\[0\]\.id"),
        (lambda d: d["prompts"][0].update(text=" "), r"prompts\[0\]\.text"),
        (lambda d: d["prompts"].append(dict(d["prompts"][0])), "appears twice"),
    ],
)
def test_invalid_prompt_files_name_the_field(tmp_path: Path, change, message: str) -> None:
    data = _valid()
    change(data)
    path = _write(tmp_path, data)
    with pytest.raises(UserError, match=message) as err:
        load_prompt_set(path)
    assert str(path) in str(err.value) and "\n" not in str(err.value)


def test_missing_and_malformed_files(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="prompt file not found"):
        load_prompt_set(tmp_path / "nope.json")
    with pytest.raises(UserError, match="not valid JSON"):
        load_prompt_set(_write(tmp_path, "{not json"))
