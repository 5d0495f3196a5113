"""Benchmark records → `Item`s: the exact strings that get scored, with the gold choice.

Every benchmark is scored in the *cloze* (completion) formulation small models are evaluated
with: the model continues a context with each choice and the choice's log-likelihood decides.
The strings follow lm-evaluation-harness and llama.cpp's task files:

- HellaSwag: `preprocess(activity_label + ": " + ctx_a + " " + ctx_b.capitalize())`, choice
  `" " + preprocess(ending)` — the same text llama.cpp's HellaSwag task file holds.
- ARC, MMLU: `"Question: " + question + "\\nAnswer:"`, choice `" " + choice_text`.
- WinoGrande (partial scoring): context `sentence[:blank] + option` for each option, one shared
  continuation `" " + sentence[blank + 1:].strip()` — only the words after the blank are scored.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from epi.core.vocabulary import Word
from host.errors import RecordError


class Benchmark(Word):
    """The multiple-choice benchmarks epi scores (each has its reader, host/accuracy/readers)."""

    HELLASWAG = "hellaswag"
    ARC_CHALLENGE = "arc_challenge"
    ARC_EASY = "arc_easy"
    MMLU = "mmlu"
    WINOGRANDE = "winogrande"


BENCHMARKS: tuple[str, ...] = Benchmark.values()
FORMAT = "cloze"  # stated in every result: choices are scored as continuations, not letters


@dataclass(frozen=True)
class Item:
    """One multiple-choice question as the strings that are scored.

    Choice `i` is the text `contexts[i] + continuations[i]`; only the continuation's tokens are
    scored. `partial` items (WinoGrande) have one context per choice and the same continuation;
    the others share one context.
    """

    id: str
    contexts: tuple[str, ...]
    continuations: tuple[str, ...]
    gold: int
    partial: bool = False
    # the few-shot prefix every context starts with (host/accuracy/fewshot.py): scored items
    # with one prefix share its KV cells, decoded once
    shared_prefix: str = ""

    @property
    def n_choices(self) -> int:
        return len(self.continuations)

    def texts(self) -> list[str]:
        """The full text of every choice."""
        return [c + k for c, k in zip(self.contexts, self.continuations, strict=True)]


def shared_item(item_id: str, context: str, choices: Sequence[object], gold: int) -> Item:
    """An item whose choices continue one context after a single space (llama.cpp's rule)."""
    if len(choices) < 2:
        raise RecordError("choices", f"needs at least 2 choices, got {len(choices)}")
    if not 0 <= gold < len(choices):
        raise RecordError("label", f"gold index {gold} outside 0..{len(choices) - 1}")
    texts: list[str] = []
    for c in choices:  # hostile data files: a choice may be anything
        if not isinstance(c, str) or not c:
            raise RecordError("choices", "a choice is empty or not text")
        texts.append(" " + c)
    return Item(item_id, (context,) * len(texts), tuple(texts), gold)


def _text(rec: Mapping[str, object], field: str) -> str:
    value = rec.get(field)
    if not isinstance(value, str):
        raise RecordError(field, "missing or not text")
    return value


def hellaswag_preprocess(text: str) -> str:
    """lm-evaluation-harness's HellaSwag clean-up (WikiHow `[title]` markers, brackets)."""
    text = text.strip()
    text = text.replace(" [title]", ". ")
    text = re.sub(r"\[.*?\]", "", text)
    return text.replace("  ", " ")


def hellaswag_item(rec: Mapping[str, object], row: int) -> Item:
    """HF `hellaswag` / rowanz JSONL record → item."""
    label = _text(rec, "activity_label")
    ctx_a, ctx_b = rec.get("ctx_a"), rec.get("ctx_b")
    if isinstance(ctx_a, str) and isinstance(ctx_b, str):
        ctx = ctx_a + " " + ctx_b.capitalize()
    else:
        ctx = _text(rec, "ctx")
    endings = rec.get("endings")
    if not isinstance(endings, list | tuple) or len(endings) != 4:
        raise RecordError("endings", "expected a list of 4 endings")
    gold = _int_label(rec.get("label"), "label")
    context = hellaswag_preprocess(label + ": " + ctx)
    return shared_item(f"row{row}", context, [hellaswag_preprocess(str(e)) for e in endings], gold)


def _int_label(value: object, field: str) -> int:
    if isinstance(value, bool):
        raise RecordError(field, f"bad label {value!r}")
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        return int(value.strip())
    raise RecordError(field, f"missing or not an integer label ({value!r})")


def question_context(question: str) -> str:
    """The cloze prompt of ARC and MMLU."""
    return f"Question: {question}\nAnswer:"


def arc_item(rec: Mapping[str, object], row: int) -> Item:
    """HF `ai2_arc` record (or the original nested ARC JSONL record) → item."""
    question = rec.get("question")
    choices = rec.get("choices")
    if isinstance(question, Mapping):  # original ARC JSONL: {"question": {"stem", "choices"}}
        choices = question.get("choices")
        question = question.get("stem")
    if not isinstance(question, str):
        raise RecordError("question", "missing or not text")
    if isinstance(choices, Mapping):
        texts, labels = choices.get("text"), choices.get("label")
    elif isinstance(choices, list) and all(isinstance(c, Mapping) for c in choices):
        texts = [c.get("text") for c in choices]
        labels = [c.get("label") for c in choices]
    else:
        raise RecordError("choices", "expected {text: [...], label: [...]}")
    if not isinstance(texts, list) or not isinstance(labels, list) or len(texts) != len(labels):
        raise RecordError("choices", "text and label lists missing or of different lengths")
    key = rec.get("answerKey")
    if key not in labels:
        raise RecordError("answerKey", f"{key!r} is not one of the labels {labels}")
    return shared_item(
        str(rec.get("id") or f"row{row}"), question_context(question), texts, labels.index(key)
    )


def mmlu_item(rec: Mapping[str, object], row: int) -> Item:
    """HF `cais/mmlu`-style record (question, subject, choices, answer) → item."""
    question = _text(rec, "question")
    choices = rec.get("choices")
    if not isinstance(choices, list | tuple) or len(choices) < 2:
        raise RecordError("choices", "expected a list of choices")
    answer = rec.get("answer")
    if isinstance(answer, str) and len(answer) == 1 and answer.upper() in "ABCDEFGHIJ":
        gold = "ABCDEFGHIJ".index(answer.upper())
    else:
        gold = _int_label(answer, "answer")
    subject = rec.get("subject") or "mmlu"
    # lm-eval's cloze MMLU (mmlu/continuation) writes `question.strip()`
    return shared_item(f"{subject}/row{row}", question_context(question.strip()),
                       list(choices), gold)


def winogrande_item(rec: Mapping[str, object], row: int) -> Item:
    """HF `winogrande` record → partial-scoring item (lm-evaluation-harness's formulation)."""
    sentence = _text(rec, "sentence")
    options = [_text(rec, "option1"), _text(rec, "option2")]
    answer = rec.get("answer")
    if str(answer).strip() not in ("1", "2"):
        raise RecordError("answer", f"expected '1' or '2', got {answer!r}")
    return winogrande_from_parts(f"row{row}", sentence, options, int(str(answer).strip()) - 1)


def winogrande_from_parts(item_id: str, sentence: str, options: list[str], gold: int) -> Item:
    """Split a WinoGrande sentence at its blank `_` into per-option contexts and one target."""
    if sentence.count("_") != 1:
        raise RecordError("sentence", "expected exactly one blank '_'")
    blank = sentence.index("_")
    target = " " + sentence[blank + 1 :].strip()
    if not target.strip():
        raise RecordError("sentence", "nothing after the blank to score")
    contexts = tuple(sentence[:blank] + o for o in options)
    return Item(item_id, contexts, (target,) * len(options), gold, partial=True)


CONVERTERS = {
    "hellaswag": hellaswag_item,
    "arc_challenge": arc_item,
    "arc_easy": arc_item,
    "mmlu": mmlu_item,
    "winogrande": winogrande_item,
}


def items_sha256(items: Sequence[Item]) -> str:
    """sha256 over the scored strings and gold labels: identifies data *and* subset."""
    h = hashlib.sha256()
    for it in items:
        h.update(json.dumps([it.id, it.contexts, it.continuations, it.gold, it.partial]).encode())
        h.update(b"\n")
    return h.hexdigest()
