"""A note that many runs share is said once, naming its runs (host/analysis/run_notes.py)."""

from __future__ import annotations

from host.analysis.run_notes import collect

NOTE = "llama.cpp build leaves out CPU features AVX512 that this CPU has"


def test_a_note_shared_by_runs_is_said_once_with_its_runs() -> None:
    per_run = [(f"r{i}", NOTE) for i in range(12)] + [("r3", "clock offset from one sync")]
    out = collect(per_run)
    assert out == [f"12 runs (r0, r1, r2, …): {NOTE}", "r3: clock offset from one sync"]


def test_distinct_notes_keep_their_order_and_a_run_is_named_once() -> None:
    out = collect([("a", "x"), ("b", "y"), ("a", "x"), ("b", "x")])
    assert out == ["2 runs (a, b): x", "b: y"]
