"""The report's settle table reads the campaign journal's `done` lines and names each rule."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

from host.report.data import campaign_settles
from host.report.tables import settle_table


def _journal(tmp_path: Path) -> tuple[Path, dict]:
    runs = tmp_path / "runs"
    doc = {"runs": [{"path": str(runs / "a"), "config": "A", "run_id": "run-a"},
                    {"path": str(runs / "b"), "config": "B", "run_id": "run-b"}]}
    lines = [
        {"event": "started", "step": 1, "result": {"run_dir": "runs/a"},
         "settle": {"rule": "fixed", "wait_s": 9}},  # not done: not a settle of a run
        {"event": "done", "step": 1, "result": {"run_dir": "runs/a"},
         "settle": {"rule": "fixed", "wait_s": 30, "waited_s": 30.0, "settled": True}},
        {"event": "done", "step": 2, "result": {"run_dir": "runs/b"},
         "settle": {"rule": "stable", "tolerance": 0.02, "window_s": 60, "waited_s": 75.5,
                    "settled": False, "reason": "timed out"}},
    ]
    journal = tmp_path / "journal.jsonl"
    journal.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return journal, doc


def test_settles_come_from_done_lines_only(tmp_path: Path) -> None:
    journal, doc = _journal(tmp_path)
    got = campaign_settles(journal, doc)
    assert [(s["step"], s["run_id"], s["rule"]) for s in got] == [
        (1, "run-a", "fixed"), (2, "run-b", "stable")]


def test_settle_table_names_each_rule(tmp_path: Path) -> None:
    journal, doc = _journal(tmp_path)
    rd = SimpleNamespace(settles=campaign_settles(journal, doc),
                         labels=SimpleNamespace(tag=lambda: "measured"))
    table = settle_table(rd)  # type: ignore[arg-type]
    assert [r[2] for r in table.rows] == ["fixed wait 30 s", "stable within ±2 % for 60 s"]
    assert table.row_classes == ["", "invalid"]
