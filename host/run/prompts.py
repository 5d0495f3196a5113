"""Prompt sets for energy runs: fixed texts cut to stated token lengths.

A prompt set file (`format: "epi-prompts"`, version 1) is JSON:
`{"format", "format_version", "name", "version", "description", "prompts": [{"id", "n_tokens",
"text"}, ...]}`. Each text is tokenized with the model's own tokenizer (BOS included when the
model adds one) and cut to exactly `n_tokens`, so every model sharing a tokenizer gets identical
prompt tokens and requests.csv's `n_prompt_tokens` is the stated length. A text that gives
fewer tokens than stated is an error, never a silently shorter prompt.

The shipped default, `host/data/prompts-v1.json` ("epi-default-v1"), has 32, 64, 128 and
256-token prompts. Change a shipped set only by adding a new versioned file.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from epi.core.errors import UserError
from epi.formats.fields import parse_json_bytes, read_bytes

FORMAT = "epi-prompts"
FORMAT_VERSION = 1
DEFAULT_FILE = "prompts-v1.json"
_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}\Z")
# Valid ranges (docs/formats.md §3): a prompt is at most a context's worth of tokens.
MAX_PROMPTS = 10_000
MAX_PROMPT_TOKENS = 1_048_576
MAX_TEXT_CHARS = 10_000_000


@dataclass(frozen=True)
class Prompt:
    """One prompt: id (no commas: it is a CSV field), stated token length, text."""

    id: str
    n_tokens: int
    text: str


@dataclass(frozen=True)
class PromptSet:
    """A loaded, validated prompt set."""

    path: Path
    name: str
    version: str
    prompts: tuple[Prompt, ...]
    sha256: str

    @property
    def max_tokens(self) -> int:
        return max(p.n_tokens for p in self.prompts)


def default_prompts_path() -> Path:
    """The shipped default prompt set."""
    return Path(str(resources.files("host") / "data" / DEFAULT_FILE))


def _nonempty_str(value: object, path: Path, key: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise UserError(f"{path}: field {key!r} must be a non-empty string")
    return value


def load_prompt_set(path: Path | None = None) -> PromptSet:
    """Read and validate a prompt set; every problem is one UserError naming file and field."""
    path = Path(path) if path is not None else default_prompts_path()
    raw = read_bytes(path, "prompt file not found")
    data = parse_json_bytes(raw, str(path))
    if not isinstance(data, dict):
        raise UserError(f"{path}: expected a JSON object with a 'prompts' list")
    if data.get("format") != FORMAT:
        raise UserError(f"{path}: field 'format' must be {FORMAT!r}, got {data.get('format')!r}")
    version = data.get("format_version")
    if not isinstance(version, int) or version < 1 or version > FORMAT_VERSION:
        raise UserError(
            f"{path}: field 'format_version' {version!r} is not one this epi reads "
            f"(1..{FORMAT_VERSION})"
        )
    name, set_version = (_nonempty_str(data.get(key), path, key) for key in ("name", "version"))
    items = data.get("prompts")
    if not isinstance(items, list) or not items or len(items) > MAX_PROMPTS:
        raise UserError(f"{path}: field 'prompts' must be a list of 1 to {MAX_PROMPTS} prompts")
    prompts: list[Prompt] = []
    seen: set[str] = set()
    for i, item in enumerate(items):
        where = f"{path}: prompts[{i}]"
        if not isinstance(item, dict):
            raise UserError(f"{where}: expected an object with id, n_tokens, text")
        pid, n, text = item.get("id"), item.get("n_tokens"), item.get("text")
        if not isinstance(pid, str) or not _ID.match(pid):
            raise UserError(f"{where}.id: {pid!r} is not an id (letters, digits, . _ -)")
        if pid in seen:
            raise UserError(f"{where}.id: {pid!r} appears twice")
        seen.add(pid)
        if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_PROMPT_TOKENS:
            raise UserError(f"{where}.n_tokens: {n!r} is not an integer in "
                            f"[1, {MAX_PROMPT_TOKENS}]")
        if not isinstance(text, str) or not text.strip() or len(text) > MAX_TEXT_CHARS:
            raise UserError(f"{where}.text: must be a non-empty string of at most "
                            f"{MAX_TEXT_CHARS} characters")
        prompts.append(Prompt(pid, n, text))
    return PromptSet(
        path=path,
        name=name,
        version=set_version,
        prompts=tuple(prompts),
        sha256=hashlib.sha256(raw).hexdigest(),
    )


def prompt_tokens(
    prompt_set: PromptSet, tokenize: Callable[[list[str]], list[list[int]]]
) -> dict[str, list[int]]:
    """Token ids of every prompt, cut to its stated length with the model's tokenizer.

    `tokenize(texts)` must return the model's tokens for each text as the model would see it
    (BOS included when the model adds one).
    """
    all_tokens = tokenize([p.text for p in prompt_set.prompts])
    out: dict[str, list[int]] = {}
    for p, tokens in zip(prompt_set.prompts, all_tokens, strict=True):
        if len(tokens) < p.n_tokens:
            raise UserError(
                f"{prompt_set.path}: prompt {p.id!r}: text gives {len(tokens)} tokens with this "
                f"model's tokenizer, fewer than its n_tokens {p.n_tokens}; lengthen the text"
            )
        out[p.id] = list(tokens[: p.n_tokens])
    return out
