"""The event cap: a few events per (channel, kind) each second, the rest counted and named in
the next written event; other channels and kinds have their own budgets."""

from __future__ import annotations

from meter.daemon.event_budget import EventBudget

S = 1_000_000_000


def test_over_budget_events_are_counted_and_named_in_the_next_written_one() -> None:
    budget = EventBudget(per_second=3)
    written = [budget.admit(0, "bus_error", k * S // 10, f"e{k}") for k in range(10)]
    assert written[:3] == ["e0", "e1", "e2"] and written[3:] == [None] * 7
    assert budget.admit(1, "bus_error", S // 2, "other channel") == "other channel"
    assert budget.admit(0, "absent", S // 2, "other kind") == "other kind"
    assert budget.admit(0, "bus_error", S, "next second") == \
        "next second (+7 similar events not written)"
    assert budget.admit(0, "bus_error", S + 1, "again") == "again"
