"""The hand-started emulated daemon's model: the whole machine until a run registers, then
that run's process tree (meter.emulation.power_models.RegisteredTreeActivityModel).

A fake /proc (the machine's `cpu` line and the processes' stat files, written by the test)
pins the bookkeeping: before a run registers every busy jiffy of the machine counts; once
its PID is in the follow file only its tree's ticks count (an unrelated burner does not);
the reading that sees a switch counts nothing of that interval (never a jump between the two
counters); an emptied follow file gives the whole machine back.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from meter.clock import SystemClock
from meter.emulation import power_models as pm
from meter.emulation.power_models import RegisteredTreeActivityModel, default_activity_model
from tests.meter.test_process_tree_model import FakeProc


def _machine(proc: FakeProc, busy: int, idle: int = 1000) -> None:
    proc.root.joinpath("stat").write_text(f"cpu  {busy} 0 0 {idle} 0 0 0 0\n")


def test_whole_machine_until_a_run_registers_then_only_its_tree(tmp_path: Path) -> None:
    proc = FakeProc(tmp_path / "proc")
    _machine(proc, busy=0)
    proc.set(100, 1, 500)    # the run, not yet registered
    proc.set(200, 1, 9000)   # an unrelated burner
    follow = tmp_path / "follow.pids"
    follow.write_text("")
    model = RegisteredTreeActivityModel(SystemClock(), follow, proc_root=proc.root,
                                        exclude_pid=300, rescan_period_s=0.0)
    first, _ = model._read(0)
    assert not model.following

    _machine(proc, busy=120)  # the machine was busy for 120 jiffies: all of it counts
    busy, _ = model._read(1)
    assert busy - first == 120

    follow.write_text("100\n")  # the run registers: the switch interval counts nothing
    _machine(proc, busy=400)
    proc.set(100, 1, 540)
    busy2, _ = model._read(2)
    assert model.following and busy2 == busy

    proc.set(100, 1, 570)    # 30 ticks of the run's own
    proc.set(200, 1, 9500)   # 500 of the burner's
    _machine(proc, busy=1000)
    busy3, _ = model._read(3)
    assert busy3 - busy2 == 30

    follow.write_text("")  # the run took itself out: the whole machine again, after a baseline
    _machine(proc, busy=1100)
    busy4, _ = model._read(4)
    assert not model.following and busy4 == busy3
    _machine(proc, busy=1170)
    busy5, _ = model._read(5)
    assert busy5 - busy4 == 70


def test_denominator_is_the_same_in_both_modes(tmp_path: Path) -> None:
    proc = FakeProc(tmp_path / "proc")
    _machine(proc, busy=0)
    follow = tmp_path / "follow.pids"
    follow.write_text("")
    model = RegisteredTreeActivityModel(SystemClock(), follow, proc_root=proc.root,
                                        rescan_period_s=0.0)
    _, total_a = model._read(10**9)
    follow.write_text("100\n")
    proc.set(100, 1, 5)
    _, total_b = model._read(2 * 10**9)
    n_cpu = model.describe()["n_cpu"]
    ticks_per_s = pm._clock_ticks_per_s()
    # CPUs × wall time in clock ticks, from the times alone, whatever the mode
    assert total_b - total_a == pytest.approx(ticks_per_s * n_cpu * 1.0)


def test_a_daemon_started_by_hand_gets_the_registering_model(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(pm.FOLLOW_ENV, raising=False)
    monkeypatch.delenv(pm.ACTIVITY_ENV, raising=False)
    model = default_activity_model(SystemClock())
    assert isinstance(model, RegisteredTreeActivityModel)
    d = model.describe()
    assert d["kind"] == "activity_registered_tree" and d["modelled"] is True
    follow = Path(str(d["follow_file"]))
    assert follow.name == "follow.pids" and follow.parent.name.startswith("epi-meter-follow-")
    assert follow.read_text() == "" and oct(follow.stat().st_mode & 0o777) == "0o600"
    monkeypatch.setenv(pm.ACTIVITY_ENV, "machine")  # a campaign's activity = "machine"
    assert type(default_activity_model(SystemClock())) is pm.ActivityModel
