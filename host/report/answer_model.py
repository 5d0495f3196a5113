"""The answer block's vocabulary: an answer (question, words, one status) and the block."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

DECIDED: Final = "decided"
UNDECIDED: Final = "undecided"
PARTLY: Final = "partly decided"
UNANSWERABLE: Final = "cannot be answered from this study"


@dataclass(frozen=True)
class Answer:
    """One research question with its answer in words and its decided/undecided status."""

    key: str
    question: str
    text: str
    status: str


@dataclass(frozen=True)
class AnswerBlock:
    answers: list[Answer]
    limits: list[str]  # what this study cannot tell
