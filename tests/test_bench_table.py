"""The `make bench` table: BENCH lines collected, goals from bench/goals.py, missing marked."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.bench_modules import BENCH, load_bench

run_all = load_bench("run_all")
goals = load_bench("goals")


def _line(**kw: object) -> str:
    return "BENCH " + json.dumps(kw)


def test_table_rows_verdicts_missing_and_failures() -> None:
    key = next(iter(goals.GOALS))
    text = "\n".join(["some human output", _line(figure=key, goal="<= 1.0", measured=0.5,
                                                    unit="ratio", met=True, runs=3,
                                                    spread=[0.4, 0.6]),
                      _line(figure="other", measured=2.0, met=False, runs=1), "BENCH {bad"])
    objs = run_all.parse_bench_lines(text)
    assert [o.get("figure") for o in objs] == [key, "other", "?"]
    rows = run_all.table_rows({"bench_x": (0, objs), "bench_quiet": (0, []),
                               "bench_broken": (2, [])})
    by_fig = {r[0]: r for r in rows}
    assert by_fig[key][3] == "met" and by_fig[key][2] == "0.5 [0.4-0.6] ratio (3 runs)"
    assert by_fig["other"][3] == "missed"
    assert by_fig["?"][3] == "error"
    assert by_fig["(bench_quiet)"][2] == "no figures"
    assert by_fig["(bench_broken)"][3] == "failed"
    for other in list(goals.GOALS)[1:]:  # goals nobody reported
        assert by_fig[other][2:4] == ["missing", "missing"]
    assert key in run_all.render(rows)


@given(st.text(max_size=400))
def test_parser_takes_only_bench_objects(text: str) -> None:
    for obj in run_all.parse_bench_lines(text):
        assert "figure" in obj


def test_goal_verdicts_follow_the_comparison() -> None:
    for key, g in goals.GOALS.items():
        assert g["op"] in ("<=", ">=", "in") and g["text"] and g["unit"]
        if g["op"] == "in":
            low, high = g["goal"]
            assert goals.met(key, low) is True and goals.met(key, high) is True
            assert goals.met(key, low - abs(low) - 1) is False
            assert goals.met(key, high + abs(high) + 1) is False
            continue
        assert goals.met(key, g["goal"]) is True
        worse = g["goal"] * 2 + 1 if g["op"] == "<=" else g["goal"] / 2 - 1
        assert goals.met(key, worse) is False
        assert goals.met(key, None) is None and goals.met(key, float("nan")) is None


@pytest.mark.slow
@pytest.mark.shares_cpu  # no timing of it is checked: it may run beside another test
def test_runner_collects_a_real_bench(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, str(BENCH / "run_all.py"), "--only", "bench_align",
                          "--pass-args", "bench_align=--samples 4e5 --windows 4e3 "
                          "--loop-windows 50 --repeat 1 --pandas-fraction 0.2"],
                         capture_output=True, text=True, check=False, timeout=600)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    assert "machine:" in out.stdout and "load average at start" in out.stdout
    table = out.stdout[out.stdout.rindex("figure"):]
    for key in ("aligner_vs_numpy_pass", "aligner_speedup_vs_window_loop",
                "aligner_speedup_vs_pandas"):
        assert key in table
    assert "runner_vs_bare_llama_cpp" in table and "missing" in table  # not run: missing
