"""bench/run_all.py judges every figure of bench/goals.py itself (a bench's own `met` is ignored),
marks goals without a line as missing, and prints any spread form a bench may emit."""

from __future__ import annotations

import json

import pytest

from tests.bench_modules import BENCH, load_bench

run_all = load_bench("run_all")
goals = load_bench("goals")
benchlib = load_bench("benchlib")


def _rows(*objs: dict) -> dict[str, list[str]]:
    return {r[0]: r for r in run_all.table_rows({"bench_x": (0, list(objs))})}


def test_goals_overrule_a_bench_own_met() -> None:
    # aligner_vs_numpy_pass: <= 3.0; the bench claims the opposite of the truth both ways
    lie_met = {"figure": "aligner_vs_numpy_pass", "measured": 3.5, "met": True, "runs": 3}
    assert _rows(lie_met)["aligner_vs_numpy_pass"][3] == "missed"
    lie_missed = {"figure": "aligner_speedup_vs_window_loop", "measured": 12.0, "met": False}
    assert _rows(lie_missed)["aligner_speedup_vs_window_loop"][3] == "met"
    # a range goal ("in"), and a line without `met` at all
    rng = {"figure": "sources-achieved-over-update-rate-nvml", "measured": 1.2, "met": True}
    assert _rows(rng)["sources-achieved-over-update-rate-nvml"][3] == "missed"
    bare = {"figure": "report-render-s", "measured": 2.0}
    assert _rows(bare)["report-render-s"][3] == "met"
    # the goal column comes from bench/goals.py, whatever the line says
    wrong_goal = {"figure": "report-render-s", "goal": ">= 99", "measured": 2.0}
    assert _rows(wrong_goal)["report-render-s"][1] == "<= 30.0"


@pytest.mark.parametrize("measured", [None, float("nan"), "fast", True])
def test_unmeasured_or_non_numeric_is_na(measured: object) -> None:
    obj = {"figure": "report-render-s", "measured": measured, "met": True}
    assert _rows(obj)["report-render-s"][3] == "n/a"


def test_figure_without_goal_keeps_its_own_met() -> None:
    assert _rows({"figure": "extra", "measured": 1.0, "met": False})["extra"][3] == "missed"
    assert _rows({"figure": "extra", "measured": 1.0})["extra"][3] == "n/a"


def test_goal_with_no_line_is_missing() -> None:
    rows = _rows({"figure": "report-render-s", "measured": 2.0})
    for key in goals.GOALS:
        if key != "report-render-s":
            assert rows[key][2:] == ["missing", "missing", "-", "-"]
            assert rows[key][1] == run_all.goal_text(key)


@pytest.mark.parametrize(("spread", "text"), [
    ([0.4, 0.6], "0.5 [0.4-0.6] s (3 runs)"),
    ((0.6, 0.4), "0.5 [0.4-0.6] s (3 runs)"),
    ([0.3, 0.5, 0.9], "0.5 [0.3-0.9] s (3 runs)"),
    ({"0": 0.001, "1": 0.0004}, "0.5 [0.0004-0.001] s (3 runs)"),
    (0.25, "0.5 ±0.25 s (3 runs)"),
    ([-0.4, 0.6], "0.5 [-0.4 to 0.6] s (3 runs)"),
    (None, "0.5 s (3 runs)"),
    ([], "0.5 s (3 runs)"),
])
def test_spread_forms(spread: object, text: str) -> None:
    obj = {"figure": "report-render-s", "measured": 0.5, "unit": "s", "runs": 3,
           "spread": spread}
    assert run_all.measured_text(obj) == text


def test_one_run_is_singular() -> None:
    obj = {"figure": "report-render-s", "measured": 0.5, "unit": "s", "runs": 1}
    assert run_all.measured_text(obj) == "0.5 s (1 run)"


def test_emit_line_round_trips_through_the_table(capsys: pytest.CaptureFixture[str],
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(benchlib, "_START_LOAD_1M", 0.5)  # as machine_line records it
    line = benchlib.emit("report-render-s", 12.5, 3, [11.0, 14.0], note="renders")
    out = capsys.readouterr().out
    assert out.startswith("BENCH ") and json.loads(out[6:]) == line
    assert line["spread"] == [11.0, 14.0] and line["runs"] == 3
    (obj,) = run_all.parse_bench_lines(out)
    row = _rows(obj)["report-render-s"]
    assert row[2] == "12.5 [11-14] s (3 runs)" and row[3] == "met"
    assert line["load_avg_1m_start"] == 0.5
    assert row[4] == f"0.50→{line['load_avg_1m']:.2f}"  # the load it was measured under


def test_machine_line_records_the_start_load_for_every_later_line(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(benchlib, "_START_LOAD_1M", None)
    printed = benchlib.machine_line("bench_x.py")
    start = float(printed.split("load average at start ")[1].split(" ")[0])
    line = benchlib.emit("report-render-s", 1.0, 1, None)
    assert line["load_avg_1m_start"] == start


@pytest.mark.parametrize(("start", "end", "text"), [
    (None, 0.871, "0.87"), (None, 12, "12.00"), (0.13, 1.9, "0.13→1.90"), (0.5, None, "0.50→?"),
    (None, None, "?"), (None, "high", "?"), ("low", True, "?")])
def test_each_row_carries_the_load_its_figure_was_measured_under(start: object, end: object,
                                                                 text: str) -> None:
    """Every row of `make bench` says its machine's load, at the bench's start and
    when the figure was printed; a line without a number there shows "?", never a blank that
    reads as idle."""
    obj = {"figure": "report-render-s", "measured": 2.0, "load_avg_1m": end,
           "load_avg_1m_start": start}
    row = _rows(obj)["report-render-s"]
    assert row[4] == text
    assert "load 1m" in run_all.render(list(_rows(obj).values())).splitlines()[0]


def test_benches_print_only_through_emit() -> None:
    """No bench builds its own BENCH line or compares against a goal itself."""
    for script in sorted(BENCH.glob("bench_*.py")):
        text = script.read_text()
        assert '"BENCH "' not in text and "'BENCH '" not in text, script.name
        assert "emit(" in text and "machine_line(" in text, script.name
        assert "GOALS" not in text, script.name
