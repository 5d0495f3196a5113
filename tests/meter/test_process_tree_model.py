"""The process-tree activity model: power follows the inference tree, not the machine.

Two levels:
* a fake /proc (stat files written by the test) pins the bookkeeping: which processes are in
  the tree, the daemon's own subtree left out, a new child counted from its birth, a reused
  PID counted afresh, a root followed late bringing no backlog;
* real processes on this machine: an unrelated CPU burner beside an "inference-like" child
  (a busy worker thread, as llama.cpp's): the model's power stays at the idle floor while only
  the burner runs, rises while the child works, and its energy above idle matches the CPU time
  the child reports for itself (time.process_time(): CLOCK_PROCESS_CPUTIME_ID, a source the
  model does not read).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from meter.clock import SystemClock
from meter.emulation import power_models as pm
from meter.emulation.power_models import (
    ActivityModel,
    ProcessTreeActivityModel,
    ProcessTreeCpu,
    default_activity_model,
    read_proc_stat,
)

IDLE_W, MAX_W = 2.7, 9.5


class FakeProc:
    """A directory laid out like /proc: PID/stat files with chosen parents and CPU ticks."""

    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        (root / "stat").write_text("cpu  0 0 0 0 0 0 0 0\n")

    def set(self, pid: int, ppid: int, cpu: int, start: int = 1, comm: str = "x") -> None:
        d = self.root / str(pid)
        d.mkdir(exist_ok=True)
        half = cpu // 2
        fields = ["S", ppid, 0, 0, 0, -1, 0, 0, 0, 0, 0, half, cpu - half, 0, 0, 20, 0, 1, 0,
                  start, 1000]
        (d / "stat").write_text(f"{pid} ({comm}) " + " ".join(map(str, fields)) + "\n")

    def gone(self, pid: int) -> None:
        for f in (self.root / str(pid)).iterdir():
            f.unlink()
        (self.root / str(pid)).rmdir()


def _tree(tmp_path: Path, roots: str = "100\n") -> tuple[FakeProc, ProcessTreeCpu, Path]:
    proc = FakeProc(tmp_path / "proc")
    follow = tmp_path / "follow.pids"
    follow.write_text(roots)
    clock = [0.0]
    counter = ProcessTreeCpu(follow, proc_root=proc.root, exclude_pid=300,
                             rescan_period_s=0.0, monotonic_s=lambda: clock[0])
    return proc, counter, follow


def test_counts_the_tree_and_nothing_else(tmp_path: Path) -> None:
    proc, counter, _ = _tree(tmp_path)
    proc.set(1, 0, 10_000)             # init
    proc.set(100, 1, 500)              # root: the campaign
    proc.set(101, 100, 50, comm="a) b")  # the run step (name with ') ')
    proc.set(102, 101, 7)              # its inference child
    proc.set(200, 1, 900)              # an unrelated burner
    proc.set(300, 100, 40)             # the meter daemon, a child of the campaign
    proc.set(301, 300, 3)              # a child of the daemon
    assert counter() == 0  # the roots were just read: everything counts from now
    assert counter.roots == (100,)
    for pid, ppid, cpu in [(100, 1, 510), (101, 100, 60), (102, 101, 107), (200, 1, 1900),
                           (300, 100, 400), (301, 300, 300)]:
        proc.set(pid, ppid, cpu)
    assert counter() == 10 + 10 + 100  # root, step, child; not the burner nor the daemon


def test_new_child_counts_from_birth_and_reused_pid_afresh(tmp_path: Path) -> None:
    proc, counter, _ = _tree(tmp_path)
    proc.set(100, 1, 500)
    assert counter() == 0
    proc.set(102, 100, 30, start=50)  # born since the last reading: all 30 ticks are new
    assert counter() == 30
    proc.gone(102)
    proc.set(102, 100, 5, start=90)  # the same PID, another process: not 5 − 30
    assert counter() == 35
    proc.gone(102)
    assert counter() == 35  # gone: nothing taken back


def test_a_root_followed_late_brings_no_backlog(tmp_path: Path) -> None:
    proc, counter, follow = _tree(tmp_path, roots="")
    proc.set(100, 1, 500)
    proc.set(400, 1, 8000)
    assert counter() == 0  # no roots: nothing
    follow.write_text("400 junk -3\n")  # only the PID words count
    proc.set(400, 1, 8010)
    assert counter() == 0 and counter.roots == (400,)
    proc.set(400, 1, 8025)
    assert counter() == 15
    follow.unlink()  # follow file removed: the idle floor again
    proc.set(400, 1, 9000)
    assert counter() == 15 and counter.roots == ()


def test_read_proc_stat_of_this_process_and_malformed(tmp_path: Path) -> None:
    st = read_proc_stat(Path(f"/proc/{os.getpid()}/stat"))
    assert st is not None and st.ppid == os.getppid()
    bad = tmp_path / "stat"
    bad.write_text("12 (x) S 1 2\n")
    assert read_proc_stat(bad) is None
    assert read_proc_stat(tmp_path / "missing") is None


def test_default_model_follows_the_environment(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    clock = SystemClock()
    monkeypatch.delenv(pm.FOLLOW_ENV, raising=False)
    monkeypatch.setenv(pm.ACTIVITY_ENV, "machine")
    whole = default_activity_model(clock)
    assert type(whole) is ActivityModel and whole.describe()["kind"] == "activity"
    monkeypatch.setenv(pm.FOLLOW_ENV, str(tmp_path / "follow.pids"))
    tree = default_activity_model(clock)
    assert isinstance(tree, ProcessTreeActivityModel)
    d = tree.describe()
    assert d["kind"] == "activity_process_tree" and d["modelled"] is True
    assert d["follow_file"] == str(tmp_path / "follow.pids") and d["roots"] == []
    assert "process tree" in d["reads"]


CHILD = r"""
import sys, threading, time
stop = threading.Event()
def burn():
    while not stop.is_set():
        pass
print("ready", flush=True)    # start-up over: from here it waits, using no CPU
sys.stdin.readline()          # wait for "go"
print(time.process_time(), flush=True)  # this process's CPU time, all threads
t = threading.Thread(target=burn); t.start()
sys.stdin.readline()          # wait for "stop"
stop.set(); t.join()
print(time.process_time(), flush=True)
sys.stdin.readline()
"""
BURNER = "while True:\n    pass\n"


def _poll(models: list[ActivityModel], clock: SystemClock, seconds: float,
          until: Callable[[], bool] | None = None) -> list[list[float]]:
    """Ask every model about 'now' at 20 Hz, as the daemon's sweeps do; the powers seen.
    With `until`, go on past `seconds` (up to 60 s) until it holds."""
    seen: list[list[float]] = [[] for _ in models]
    end = time.monotonic() + seconds
    while time.monotonic() < end or (until is not None and not until()
                                     and time.monotonic() < end + 60):
        time.sleep(0.05)
        now = clock.monotonic_ns()
        for k, m in enumerate(models):
            seen[k].append(m.power_w(now))
    return seen


@pytest.mark.long
@pytest.mark.skipif(not Path("/proc/stat").exists(), reason="needs Linux /proc")
def test_power_follows_the_child_not_an_unrelated_burner(tmp_path: Path) -> None:
    """A CPU burner runs beside the inference-like child throughout; only the child counts."""
    clock = SystemClock()
    burner = subprocess.Popen([sys.executable, "-c", BURNER])
    child = subprocess.Popen([sys.executable, "-c", CHILD], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    assert child.stdin is not None and child.stdout is not None
    try:
        follow = tmp_path / "follow.pids"
        follow.write_text(f"{child.pid}\n")
        # the child's interpreter start-up is over (it says so: a loaded machine can take
        # longer than any fixed wait)
        assert child.stdout.readline().strip() == "ready"
        tree = ProcessTreeActivityModel(clock, follow, idle_w=IDLE_W, max_w=MAX_W)
        whole = ActivityModel(clock, idle_w=IDLE_W, max_w=MAX_W)
        t0 = clock.monotonic_ns()
        quiet_tree, quiet_whole = _poll([tree, whole], clock, 1.5)  # burner only
        t1 = clock.monotonic_ns()
        child.stdin.write("go\n")
        child.stdin.flush()
        cpu_go_s = float(child.stdout.readline())
        ticks_s = float(os.sysconf("SC_CLK_TCK"))

        def child_cpu_s() -> float:  # a precondition only: the figure is checked below
            st = read_proc_stat(Path(f"/proc/{child.pid}/stat"))
            return st.cpu_ticks / ticks_s if st else 0.0

        cpu_at_go = child_cpu_s()
        # burner and child, until the child had 0.4 s of CPU (a loaded machine gives it less
        # per second: at load 19 it had 0.07 s in 2 s)
        busy_tree, _ = _poll([tree, whole], clock, 2.0,
                             until=lambda: child_cpu_s() - cpu_at_go >= 0.4)
        child.stdin.write("stop\n")
        child.stdin.flush()
        cpu_stop_s = float(child.stdout.readline())
        _poll([tree, whole], clock, 0.3)
        t2 = clock.monotonic_ns()
        child.stdin.write("end\n")
        child.stdin.flush()
        child.wait(timeout=10)
    finally:
        burner.kill()
        burner.wait()
        if child.poll() is None:
            child.kill()
            child.wait()
    n_cpu = len([ln for ln in Path("/proc/stat").read_text().splitlines()
                 if ln[:3] == "cpu" and ln[3:4].isdigit()])
    # burner alone: the tree model stays at the idle floor; the whole-machine one does not
    assert max(quiet_tree[2:]) <= IDLE_W + 0.02 * (MAX_W - IDLE_W)
    assert sum(quiet_whole[2:]) / len(quiet_whole[2:]) > IDLE_W + 0.3 * (MAX_W - IDLE_W) / n_cpu
    # the child working: energy above the idle floor = the child's own CPU time × (max − idle)
    # / CPUs — however much CPU a loaded machine left it
    child_cpu_s = cpu_stop_s - cpu_go_s
    excess_j = tree.energy_j(t1, t2) - IDLE_W * (t2 - t1) / 1e9
    expected_j = (MAX_W - IDLE_W) * child_cpu_s / n_cpu
    print(f"child CPU {child_cpu_s:.2f} s in {(t2 - t1) / 1e9:.2f} s; excess {excess_j:.3f} J, "
          f"expected {expected_j:.3f} J; load {os.getloadavg()[0]:.1f}")
    assert child_cpu_s > 0.2  # the child did work (else the check below says nothing)
    assert excess_j == pytest.approx(expected_j, rel=0.05, abs=0.05)  # ±1.5 ticks
    # the power rose while the child worked (by how much is the energy check's: on a loaded
    # machine the child's share of a core, and so the rise, can be a few percent)
    assert sum(busy_tree[4:]) / len(busy_tree[4:]) > max(quiet_tree[2:])
    assert tree.energy_j(t0, t1) == pytest.approx(IDLE_W * (t1 - t0) / 1e9, rel=0.01)


def test_denominator_is_the_machines_cpus_times_wall_time(tmp_path: Path) -> None:
    """The busy fraction's denominator is CPUs × wall time, not /proc/stat's jiffy count
    (which moves in whole jiffies per CPU: ±10 % on a 50 ms interval). Closed form: 0.5 s
    of the tree's CPU in 1 s on 2 CPUs is a quarter of the machine — however /proc/stat's
    total moved (here: not at all)."""
    from meter.clock import SimulatedClock

    proc, _, follow = _tree(tmp_path)
    (proc.root / "stat").write_text("cpu  0 0 0 0 0 0 0 0\ncpu0 0 0 0 0\ncpu1 0 0 0 0\n")
    proc.set(100, 1, cpu=0)
    clock = SimulatedClock()
    m = ProcessTreeActivityModel(clock, follow, proc_root=proc.root, exclude_pid=300,
                                 rescan_period_s=0.0, idle_w=IDLE_W, max_w=MAX_W)
    t0 = clock.monotonic_ns()
    ticks = os.sysconf("SC_CLK_TCK")
    proc.set(100, 1, cpu=ticks // 2)  # 0.5 s of CPU
    clock.sleep_until(t0 + 1_000_000_000)
    assert m.power_w(clock.monotonic_ns()) == pytest.approx(IDLE_W + (MAX_W - IDLE_W) * 0.25)
    assert m.energy_j(t0, t0 + 1_000_000_000) == pytest.approx(IDLE_W + (MAX_W - IDLE_W) / 4)
    assert m.describe()["n_cpu"] == 2


def test_thread_run_times_in_ns_where_the_kernel_gives_them(tmp_path: Path) -> None:
    """Per-thread schedstat (ns) instead of 10 ms ticks: a window's CPU time is then exact to
    the last scheduler tick, not truncated to 10 ms. Closed form: the ns written, in ticks."""
    proc, counter, _ = _tree(tmp_path)
    tick_ns = 1e9 / os.sysconf("SC_CLK_TCK")

    def threads(pid: int, run_ns: dict[int, int]) -> None:
        task = proc.root / str(pid) / "task"
        task.mkdir(exist_ok=True)
        for old in task.iterdir():
            if int(old.name) not in run_ns:
                (old / "schedstat").unlink()
                old.rmdir()
        for tid, ns in run_ns.items():
            (task / str(tid)).mkdir(exist_ok=True)
            (task / str(tid) / "schedstat").write_text(f"{ns} 0 0\n")

    proc.set(100, 1, cpu=999)  # its ticks are not used while threads can be read
    threads(100, {100: 5_000_000_000, 101: 1_000_000_000})
    assert counter() == 0.0  # roots just read: a baseline, no backlog
    threads(100, {100: 5_020_000_000, 101: 1_010_000_000, 102: 5_000_000})  # 102 is new
    assert counter() == pytest.approx(35_000_000 / tick_ns)
    threads(100, {100: 5_030_000_000})  # 101 and 102 exited: nothing goes negative
    assert counter() == pytest.approx(45_000_000 / tick_ns)
    proc.set(200, 100, cpu=0)  # a child born since: all of its run time counts
    threads(200, {200: 30_000_000})
    assert counter() == pytest.approx(75_000_000 / tick_ns)
