"""The campaign's sequential verdicts (analysis/decisions.json of an adaptive campaign) are
stated in the report's answer block beside the fixed-sample intervals, and a damaged file is
refused in one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from epi.core.errors import UserError
from host.report import answers as answers_mod
from host.report import data as report_data
from host.report.sequential import DECISIONS_FILE, load_decisions
from tests.host.report_fixtures import answered  # noqa: F401  (a fixture: its own copy)

DECISIONS = {
    "rounds_done": 3,
    "lines": ["savings vs baseline q4 → q8: undecided after the budget 3.0 % [no finite "
              "interval yet] 95 % anytime-valid, n=1"],
    "next_configs": [], "states": {"undecided": 1}, "budget_spent": True,
    "method": "Lai (1976) t-mixture confidence sequence", "margin_pct": 2.0, "alpha": 0.05,
}


def test_sequential_verdicts_are_stated_beside_the_fixed_intervals(answered: Path  # noqa: F811
                                                                   ) -> None:
    before = " ".join(answers_mod.build(report_data.load(answered)).limits)
    assert "sequential" not in before  # a non-adaptive study says nothing of the kind
    (answered / DECISIONS_FILE).write_text(json.dumps(DECISIONS))
    limits = " ".join(answers_mod.build(report_data.load(answered)).limits)
    assert "on 1 comparison(s) after 3 round(s): 1 undecided; the budget is spent" in limits
    assert "95% coverage at every look" in limits
    assert "trust the sequential verdict" in limits
    assert DECISIONS["lines"][0] in limits


@pytest.mark.parametrize(("field", "value"), [
    ("rounds_done", -1), ("rounds_done", True), ("lines", "one"), ("lines", [1]),
    ("states", {"undecided": -1}), ("states", {"undecided": 2}), ("budget_spent", "yes"),
    ("method", ""), ("alpha", 1.5), ("alpha", "0.05"),
])
def test_a_damaged_decisions_file_is_refused_in_one_line(tmp_path: Path, field: str,
                                                         value: object) -> None:
    (tmp_path / DECISIONS_FILE).write_text(json.dumps({**DECISIONS, field: value}))
    with pytest.raises(UserError) as info:
        load_decisions(tmp_path)
    message = str(info.value)
    assert "\n" not in message and DECISIONS_FILE in message


def test_no_decisions_file_is_none(tmp_path: Path) -> None:
    assert load_decisions(tmp_path) is None
