"""After an energy-counter reset: the summary rows whose windows fell back to the
power integral say so (energy_method "mixed" or "trapezoid", never "counter"), and the console
says the reset happened. The expected method of each row comes from the schedule: which of the
row's requests start after the reset."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from host.analysis.pipeline import analyze
from host.analysis.summary import summary_text

N_REQUESTS = 8  # the synthetic schedule: 1 warm-up and 3 repeats of 2 prompts


def _reset_counter(tdir: Path, at_ns: int) -> None:
    """Restart channel 0's energy counter from 0 at meter time `at_ns` (inside one segment)."""
    p = tdir / "seg-000001.samples.csv"
    lines = p.read_text().splitlines()
    base = None
    for i in range(1, len(lines)):
        f = lines[i].split(",")
        if int(f[2]) >= at_ns:
            if base is None:
                base = float(f[9])
            f[9] = repr(float(f[9]) - base)
            lines[i] = ",".join(f)
    p.write_text("\n".join(lines) + "\n")


def _expected(k: int) -> str:
    """Method of a row over the measured (non-warm-up) requests when requests k.. follow the
    reset: all before it counter, all after it trapezoid, else mixed."""
    measured = range(2, N_REQUESTS)
    after = [i >= k for i in measured]
    return "trapezoid" if all(after) else "counter" if not any(after) else "mixed"


def _check(synth_run, k: int) -> None:
    tdir, rdir, sched, _ = synth_run()
    assert len(sched.requests) == N_REQUESTS
    gap_mid = (sched.requests[k - 1]["end"] + sched.requests[k]["start"]) // 2
    _reset_counter(tdir, gap_mid)
    a = analyze([rdir], tdir)
    rows = a.results[(a.results["scope"] == "all") & (a.results["basis"] == "gross")]
    assert len(rows) and (rows["n_repeats"] > 0).all()
    assert set(rows["energy_method"]) == {_expected(k)}, rows["energy_method"].tolist()
    text = summary_text(a)
    line = next((ln for ln in text.splitlines() if ln.startswith("energy counter:")), "")
    assert "fell back to the power integral" in line and "decreased or reset" in line, text


def test_a_reset_mid_run_is_mixed_and_said(synth_run) -> None:
    _check(synth_run, 5)


def test_no_reset_says_counter_and_nothing_else(synth_run) -> None:
    tdir, rdir, _, _ = synth_run()
    a = analyze([rdir], tdir)
    assert set(a.results["energy_method"]) == {"counter"}
    assert "energy counter:" not in summary_text(a)


@pytest.mark.long
@settings(max_examples=6, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(k=st.integers(1, N_REQUESTS - 1))
def test_generated_reset_times(synth_run, tmp_path_factory: pytest.TempPathFactory,
                               k: int) -> None:
    _check(lambda: synth_run(trace_dir=tmp_path_factory.mktemp("trace")), k)
