"""perf_event_open counters against an independent clock, and `perf stat -x,` parsing."""

from __future__ import annotations

import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from epi.core.errors import UserError
from host.run.perf_counters import CORTEX_A76_EVENTS, RequestCounters, probe
from host.run.perf_stat import event_name, known_counts, parse_perf_stat

FIXTURE = Path(__file__).parent / "fixtures" / "perf_stat_cortex_a76.csv"


def _spin(n: int) -> int:
    x = 0
    for i in range(n):
        x += i
    return x


def test_task_clock_agrees_with_the_threads_cpu_clock() -> None:
    """Counted on this thread over two phases: the kernel's task-clock event against
    time.thread_time_ns (the thread's CPU clock, read independently) within 3 %."""
    av = probe()
    if "task-clock" not in {e.name for e in av.events}:
        pytest.skip(f"perf_event_open unavailable here: {av.unavailable}")
    rc = RequestCounters([e for e in av.events if e.name == "task-clock"],
                         [threading.get_native_id()])
    rc.start()
    t0 = time.thread_time_ns()
    _spin(1_500_000)
    t1 = time.thread_time_ns()
    rc.first_token()
    _spin(500_000)
    t2 = time.thread_time_ns()
    rc.end()
    phases = rc.phases()
    assert phases["prefill"]["task-clock"] == pytest.approx(t1 - t0, rel=0.03)
    assert phases["decode"]["task-clock"] == pytest.approx(t2 - t1, rel=0.03)


def test_unavailable_events_carry_the_kernels_reason() -> None:
    av = probe(CORTEX_A76_EVENTS)
    for e in CORTEX_A76_EVENTS:
        assert (e in av.events) != (e.name in av.unavailable)
    assert all(reason for reason in av.unavailable.values())


def test_the_cortex_a76_fixture_maps_to_the_runners_events() -> None:
    counts = parse_perf_stat(FIXTURE.read_text(), str(FIXTURE))
    known = known_counts(counts)
    # every hardware event the runner opens on a Pi 5 appears, by its raw or PMU name
    assert {e.name for e in CORTEX_A76_EVENTS} <= set(known)
    assert known["task-clock"] == pytest.approx(3998.41e6)  # msec → ns
    assert known["mem_access"] == 3876543210
    assert next(c for c in counts if c.value is None).reason == "<not counted>"
    assert event_name("r19") == "bus_access" and event_name("r13:u") == "mem_access"


@pytest.mark.skipif(shutil.which("perf") is None, reason="the perf tool is not installed")
def test_live_perf_stat_output_parses() -> None:
    proc = subprocess.run(["perf", "stat", "-x,", "-e", "task-clock,context-switches,r13",
                           "--", sys.executable, "-c", "pass"], capture_output=True, text=True,
                          timeout=60)
    counts = {c.event: c for c in parse_perf_stat(proc.stderr)}
    assert counts["task-clock"].value is not None and counts["task-clock"].value > 0
    assert "mem_access" in counts  # r13, counted or not supported on this machine


@pytest.mark.parametrize("text", ["garbage", "12,,x,1,abc,,", "abc,,task-clock,1,100,,"])
def test_malformed_perf_stat_output_is_one_line(text: str) -> None:
    with pytest.raises(UserError, match=r"perf\.txt: line 1: "):
        parse_perf_stat(text, "perf.txt")


def _rd(runs: list[dict[str, object]]):  # type: ignore[no-untyped-def]
    import pandas as pd

    from host.report.data import Labels, ReportData

    empty = pd.DataFrame()
    return ReportData(Path("."), {"runs": runs}, empty, empty, empty, empty,
                      Labels("modelled", "t", "gross", "counter", "step", ""))


def test_the_bandwidth_answer_says_which_counters_the_runs_recorded(tmp_path: Path) -> None:
    import json

    from host.report.work_answers import counters_line

    vm, pi = tmp_path / "vm", tmp_path / "pi"
    vm.mkdir()
    pi.mkdir()
    (vm / "perf_counters.json").write_text(json.dumps(
        {"events": ["task-clock"], "unavailable": {"cycles": "No such file or directory"}}))
    (pi / "perf_counters.json").write_text(json.dumps(
        {"events": ["task-clock", "mem_access", "bus_access"], "unavailable": {}}))
    assert "not available on these nodes (No such file or directory)" in \
        counters_line(_rd([{"path": str(vm)}]))
    assert "recorded per request and phase: bus_access, mem_access" in \
        counters_line(_rd([{"path": str(pi)}]))
    assert "none recorded" in counters_line(_rd([{"path": str(tmp_path / "gone")}]))
