"""The campaign's last console lines: the study's questions, each with its status, as the
report's answer block gives them (host/report/answers.py), so a reader of the console sees the
answers without opening the report, and never a different verdict from the report's."""

from __future__ import annotations

import re
from pathlib import Path

from epi.core.errors import UserError
from host.report.answer_model import DECIDED

SHORT_QUESTION = 72
# "What would decide it" opens a sentence in some answers, "what would decide it" follows a
# semicolon in others: both are the answer's own clause
_DECIDE = re.compile(r"[Ww]hat would decide it: (.+?)(?:\.\s+(?=[A-Z])|\.?\s*$)", re.S)


def answer_lines(analysis_dir: Path) -> list[str]:
    """One line a question: its status and the question (shortened); [] without an analysis."""
    from host.report import answers, data

    try:
        block = answers.build(data.load(analysis_dir))
    except UserError:
        return []
    lines = ["answers (the top of the report):"]
    for k, a in enumerate(block.answers, 1):
        q = a.question if len(a.question) <= SHORT_QUESTION else \
            a.question[:SHORT_QUESTION - 1].rstrip() + "…"
        lines.append(f"  {k}. [{a.status}] {q}")
        decide = _what_would_decide(a.text) if a.status != DECIDED else None
        if decide:
            lines.append(f"     what would decide it: {decide}")
    return lines


def _what_would_decide(text: str) -> str | None:
    """The answer's own 'what would decide it: …' clause, to its sentence's end (a full stop
    before a capital or the end; "e.g." does not end it)."""
    m = _DECIDE.search(text)
    if not m:
        return None
    clause = m.group(1).strip()
    while clause.endswith(")") and clause.count(")") > clause.count("("):
        clause = clause[:-1]  # the parenthesis the clause was written inside
    return clause or None
