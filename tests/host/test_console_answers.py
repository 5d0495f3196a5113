"""The campaign's closing console lines carry the report's answers: the same questions in the
same order with the same statuses, and each undecided answer's own 'what would decide it'."""

from __future__ import annotations

import re
from pathlib import Path

from host.campaign.console_answers import _what_would_decide, answer_lines
from host.report import answers, data
from tests.host.report_fixtures import answered_shared  # noqa: F401  (fixture)


def test_the_console_says_what_the_report_says(answered_shared: Path) -> None:  # noqa: F811
    lines = answer_lines(answered_shared)
    block = answers.build(data.load(answered_shared))
    shown = [(m.group(1), m.group(2)) for m in
             (re.match(r"  \d+\. \[(.+?)\] (.+)", ln) for ln in lines) if m]
    assert [s for s, _ in shown] == [a.status for a in block.answers]
    for (_, q), a in zip(shown, block.answers, strict=True):
        assert a.question.startswith(q.rstrip("…"))


def test_the_decide_clause_is_the_answers_own() -> None:
    text = ("Undecided: neither term's interval excludes 0 (…); what would decide it: more "
            "rounds (narrower decode J/token) or more maps. Terms: bytes …")
    assert _what_would_decide(text) == "more rounds (narrower decode J/token) or more maps"
    assert _what_would_decide("A decided answer with no such clause.") is None
    # the clause opening its own sentence (the EPI-optimum answer's form)
    epi = ("The EPI optimum cannot be told from 4 other configuration(s) (…); across that set "
           "the answer is on both sides. What would decide it: more accuracy items or more "
           "rounds, narrowing the EPI intervals until one configuration stands alone.")
    assert _what_would_decide(epi) == ("more accuracy items or more rounds, narrowing the EPI "
                                       "intervals until one configuration stands alone")


def test_no_analysis_gives_no_lines(tmp_path: Path) -> None:
    assert answer_lines(tmp_path / "missing") == []
