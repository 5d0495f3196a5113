"""The suite's CPU lock (tests/conftest.py, _CpuShare): a test that must have the CPUs alone
never overlaps another test, shared holders overlap each other, and a waiting exclusive holder
is not starved by a later shared hold (the turnstile). Checked with real processes and flock,
as pytest-xdist workers use it; the expected orderings follow from the lock's definition and
are read off the times the processes log. The processes step in an order set by marker files
and by /proc/locks (a process queued in flock), not by sleeps, so the checks hold on a loaded
machine."""

from __future__ import annotations

import importlib.util
import multiprocessing
import time
from pathlib import Path
from types import ModuleType

CONFTEST = Path(__file__).resolve().parent / "conftest.py"
Span = tuple[float, float]


def _conftest() -> ModuleType:
    spec = importlib.util.spec_from_file_location("epi_tests_conftest_copy", CONFTEST)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _wait_for(path: Path) -> None:
    deadline = time.monotonic() + 30
    while not path.exists():
        assert time.monotonic() < deadline, f"{path.name} never appeared"
        time.sleep(0.01)


def _wait_blocked(lock_file: Path) -> None:
    """Wait until some process is blocked in flock on `lock_file` (a `->` line of /proc/locks
    on its inode): the exclusive holder is then queued, not merely about to ask."""
    deadline = time.monotonic() + 30
    while True:
        ino = lock_file.stat().st_ino if lock_file.exists() else None
        if ino is not None and any("->" in line and line.split()[-3].endswith(f":{ino}")
                                   for line in Path("/proc/locks").read_text().splitlines()):
            return
        assert time.monotonic() < deadline, f"nobody blocked on {lock_file.name}"
        time.sleep(0.01)


def _holder(d: Path, name: str, exclusive: bool, after: str | None, blocked: bool,
            until: str | None) -> None:
    """Wait for marker `after` (and, with `blocked`, until a process is queued on the CPU
    lock), say so, take the lock, mark '<name>.held', hold it until marker `until` exists
    (+0.3 s) or for 0.3 s, let go, log the span."""
    if after:
        _wait_for(d / after)
    if blocked:
        _wait_blocked(d / "lock" / "cpus")
    (d / f"{name}.asking").touch()
    share = _conftest()._CpuShare(str(d / "lock"))
    share.hold(Path(name), exclusive)
    t_in = time.monotonic()
    (d / f"{name}.held").touch()
    if until:
        _wait_for(d / until)
    time.sleep(0.3)
    t_out = time.monotonic()
    share.release()
    (d / f"{name}.span").write_text(f"{t_in} {t_out}")


def _run(d: Path, plan: list[tuple[str, bool, str | None, bool, str | None]]) -> dict[str, Span]:
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_holder, args=(d, *step)) for step in plan]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    spans = {}
    for name, *_ in plan:
        t_in, t_out = (d / f"{name}.span").read_text().split()
        spans[name] = (float(t_in), float(t_out))
    return spans


def _overlap(a: Span, b: Span) -> bool:
    return a[0] < b[1] and b[0] < a[1]


def test_an_exclusive_holder_overlaps_no_shared_one_and_shared_ones_overlap(
        tmp_path: Path) -> None:
    # `alone` asks once both shared holders hold (a_holds until b holds too)
    spans = _run(tmp_path, [
        ("shared_a", False, None, False, "shared_b.held"),
        ("shared_b", False, "shared_a.held", False, None),
        ("alone", True, "shared_b.held", False, None),
    ])
    assert _overlap(spans["shared_a"], spans["shared_b"])
    assert not _overlap(spans["alone"], spans["shared_a"])
    assert not _overlap(spans["alone"], spans["shared_b"])


def test_a_waiting_exclusive_holder_goes_before_a_later_shared_one(tmp_path: Path) -> None:
    # `late` asks while `first` still holds and `alone` is already queued behind it (blocked in
    # flock, seen in /proc/locks): without the turnstile `late` would join first's shared hold
    # and keep `alone` waiting
    spans = _run(tmp_path, [
        ("first", False, None, False, "late.asking"),
        ("alone", True, "first.held", False, None),
        ("late", False, "alone.asking", True, None),
    ])
    assert spans["alone"][0] >= spans["first"][1]
    assert spans["late"][0] >= spans["alone"][1]


def test_a_shared_holder_sees_a_queued_exclusive_one(tmp_path: Path) -> None:
    """someone_waits: false while nobody is queued, true once an exclusive holder is blocked
    behind this shared hold (so the shared worker lets go after its current test)."""
    share = _conftest()._CpuShare(str(tmp_path / "lock"))
    share.hold(Path("shared"), False)
    assert not share.someone_waits()
    ctx = multiprocessing.get_context("fork")
    queued = ctx.Process(target=_holder, args=(tmp_path, "alone", True, None, False, None))
    queued.start()
    try:
        _wait_blocked(tmp_path / "lock" / "cpus")
        assert share.someone_waits()
    finally:
        share.release()  # never leave the queued process (joined at exit) behind our lock
        queued.join(30)
    assert queued.exitcode == 0


class _Item:
    """What _cpu_lock_order reads of a pytest item: its file and its markers."""

    def __init__(self, name: str, path: str, *marks: str) -> None:
        self.name, self.path, self._marks = name, Path(path), set(marks)

    def get_closest_marker(self, mark: str) -> object | None:
        return object() if mark in self._marks else None


def test_files_with_an_exclusive_test_go_first_then_slow_shared_files_then_the_rest() -> None:
    """The suite's file order (scripts/run_tests.sh keeps it with --no-loadscope-reorder): a
    file with any test that needs the CPUs alone (`serial`, or `slow` without `shares_cpu`)
    first, then the shared files with a `slow` test, then the rest; within each group the
    files keep their collection order, and a file's tests theirs, even when split apart."""
    items = [_Item("a1", "a.py"), _Item("b1", "b.py", "slow", "shares_cpu"),
             _Item("c1", "c.py"), _Item("a2", "a.py"), _Item("d1", "d.py", "slow"),
             _Item("c2", "c.py", "serial"), _Item("e1", "e.py")]
    ordered = _conftest()._cpu_lock_order(items)
    assert [i.name for i in ordered] == ["c1", "c2", "d1", "b1", "a1", "a2", "e1"]
