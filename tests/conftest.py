"""Shared fixtures: a tiny random-weight llama GGUF made on the fly (no downloads)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings

# Generated hostile input, reproducibly: under CI (CI=true, as .ci/run is started) every
# hypothesis test draws the same examples each run (derandomize), so a red CI is the code's
# doing, not the draw's. Elsewhere the draws vary (more ground covered over many runs); a
# failure prints the blob that replays it (@reproduce_failure) and is kept in the local
# example database. HYPOTHESIS_PROFILE=ci reproduces CI's draws on any machine.
settings.register_profile("ci", derandomize=True, database=None, print_blob=True)
settings.register_profile("dev", print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE")
                      or ("ci" if os.environ.get("CI") else "dev"))


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An 8-layer, 256-wide random llama GGUF (F16) with a real SPM tokenizer."""
    from host.quant.tiny_model import write_test_model

    out = tmp_path_factory.mktemp("tiny") / "tiny-llama-f16.gguf"
    write_test_model(out)
    return out


# Timing-sensitive files (rates, deadlines, loopback round trips, CPU time of real processes):
# scripts/run_tests.sh never runs them beside another test on the 2 cores (they hold the CPU
# lock exclusively, see _CpuShare below; so do the `slow` tests unless marked `shares_cpu`).
# A new such file is added here.
SERIAL_FILES = frozenset({
    "tests/host/test_align_groundtruth.py",
    "tests/host/test_multi_meter.py",
    "tests/host/test_runner.py",
    "tests/meter/test_clocksync.py",
    "tests/meter/test_daemon.py",
    "tests/meter/test_daemon_storage.py",
    "tests/meter/test_grafana_dashboard.py",
    "tests/meter/test_process_tree_model.py",
    "tests/meter/test_sampler.py",
    "tests/meter/test_stream_clients.py",
})
_ROOT = Path(__file__).resolve().parents[1]


# `make test-fast` (-m "not slow") is the quick loop: a test that takes over this many seconds
# on an idle 2-core machine is marked `long`; it still runs in `make test`.
FAST_TEST_LIMIT_S = 1.5


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark every test of SERIAL_FILES `serial`, and every `long` test that is not `slow`
    already `slow` and `shares_cpu` (left out of the fast pass, yet run beside another test in
    the full one; a test already `slow` keeps how it shares the CPUs). First, so that `-m`
    selects on these marks."""
    for item in items:
        if item.path.relative_to(_ROOT).as_posix() in SERIAL_FILES:
            item.add_marker(pytest.mark.serial)
        if (item.get_closest_marker("long") is not None
                and item.get_closest_marker("slow") is None):
            item.add_marker(pytest.mark.slow)
            item.add_marker(pytest.mark.shares_cpu)
    items[:] = _cpu_lock_order(items)


def _cpu_lock_order(items: list[pytest.Item]) -> list[pytest.Item]:
    """The files in the order that keeps both cores busy under the CPU lock (_CpuShare):
    every file with a test that needs the CPUs alone first, then the files whose tests all
    share them, those with a `slow` test first. Interleaved, each exclusive test waited for
    the other worker's running test to end and then left that worker idle: on the 2-core VM
    a quarter of the suite's wall time went to such waits. Grouped, the exclusive block runs
    one test at a time once, and the shared block ends the run with its short files, so the
    last worker to finish is not left with a long one. A file's tests keep their order
    (module fixtures), and so do the files within each group; scripts/run_tests.sh passes
    --no-loadscope-reorder so that pytest-xdist hands the files out in this order."""
    files: dict[Path, list[pytest.Item]] = {}
    for item in items:
        files.setdefault(item.path, []).append(item)

    def group(tests: list[pytest.Item]) -> int:
        if any(_needs_cpus_alone(t) for t in tests):
            return 0
        return 1 if any(t.get_closest_marker("slow") is not None for t in tests) else 2

    ordered = sorted(files.values(), key=group)  # stable: the collection order within a group
    return [item for tests in ordered for item in tests]


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """Name the fast-pass tests whose own call took over twice FAST_TEST_LIMIT_S (twice: a
    loaded machine slows every test): they belong in `long`. A note, never a failure — a
    timing is no verdict. The call only: a module fixture's set-up lands on whichever test
    first needs it, and marking that test `long` would only move the cost to the next one
    (the fixture costs the fast pass as long as any of its tests stays there);
    EPI_TEST_PROFILE shows set-up with each test."""
    over = sorted(
        (rep.duration, rep.nodeid) for rep in terminalreporter.stats.get("passed", [])
        if rep.when == "call" and "slow" not in rep.keywords
        and rep.duration > 2 * FAST_TEST_LIMIT_S)
    if over:
        terminalreporter.write_sep("-", f"fast-pass tests over {2 * FAST_TEST_LIMIT_S:.0f} s "
                                        "(mark them `long`, tests/conftest.py)")
        for duration_s, nodeid in reversed(over):
            terminalreporter.write_line(f"{duration_s:6.2f} s  {nodeid}")


def _needs_cpus_alone(item: pytest.Item) -> bool:
    """A `serial` test, or a `slow` one not marked `shares_cpu`, runs with no other test beside
    it: the first are timing-sensitive, the second mostly use both cores themselves."""
    if item.get_closest_marker("serial") is not None:
        return True
    return (item.get_closest_marker("slow") is not None
            and item.get_closest_marker("shares_cpu") is None)


class _CpuShare:
    """A readers-writer lock on the machine's CPUs between pytest-xdist workers.

    scripts/run_tests.sh runs the whole suite in one xdist session (`--dist loadfile`) and
    names a directory in EPI_TEST_CPU_LOCK. Every test holds the lock: shared by default,
    exclusive when it must have the CPUs alone (_needs_cpus_alone), so a timing-sensitive test
    never shares the cores while every other one still runs two at a time. A worker keeps
    the lock across consecutive tests of one file in one mode and lets go before another file
    or a change of mode — or, holding it shared, after the current test as soon as an
    exclusive holder is queued (no shared file keeps a background process in a module
    fixture; the serial files that do hold it exclusively); so module fixtures set up in a file
    whose tests all have one mode
    (the serial files: every test exclusive) live under one hold, while in a file that mixes
    modes a module fixture outlives the hold at each switch (fine for fixtures that are files;
    a background daemon there would overlap the other worker's tests). A
    turnstile keeps a waiting exclusive holder from being starved by the other worker's
    stream of shared holds (flock itself does not order waiters)."""

    def __init__(self, directory: str) -> None:
        Path(directory).mkdir(parents=True, exist_ok=True)
        self._turnstile = open(Path(directory) / "turnstile", "a+")  # noqa: SIM115
        self._cpus = open(Path(directory) / "cpus", "a+")  # noqa: SIM115
        self.held: tuple[Path, bool] | None = None

    def hold(self, path: Path, exclusive: bool) -> None:
        import fcntl

        if self.held == (path, exclusive):
            return
        self.release()
        fcntl.flock(self._turnstile, fcntl.LOCK_EX)
        try:
            fcntl.flock(self._cpus, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        finally:
            fcntl.flock(self._turnstile, fcntl.LOCK_UN)
        self.held = (path, exclusive)

    def someone_waits(self) -> bool:
        """Whether another worker holds the turnstile — an exclusive holder queued for the
        CPUs (or, for an instant, a shared one passing through): a shared holder then lets go
        after its current test instead of at the end of its file."""
        import fcntl

        try:
            fcntl.flock(self._turnstile, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(self._turnstile, fcntl.LOCK_UN)
        return False

    def release(self) -> None:
        import fcntl

        if self.held is not None:
            fcntl.flock(self._cpus, fcntl.LOCK_UN)
            self.held = None


_CPU_LOCK_DIR = os.environ.get("EPI_TEST_CPU_LOCK")
_cpu_share: _CpuShare | None = None


_PROFILE = os.environ.get("EPI_TEST_PROFILE")


def _cpu_s() -> float:
    """CPU seconds of this process and of its children waited for so far."""
    import resource

    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> object:
    """Hold the CPU lock (shared or exclusive, _CpuShare) from set-up to tear-down. With
    EPI_TEST_PROFILE=FILE, also append the test's wall and CPU seconds (this process and its
    waited-for children, lock waits excluded) to FILE as JSON lines: which slow tests wait
    rather than compute, i.e. what may share the two cores."""
    import time

    global _cpu_share
    if _CPU_LOCK_DIR and _cpu_share is None:
        _cpu_share = _CpuShare(_CPU_LOCK_DIR)
    if _cpu_share is not None:
        _cpu_share.hold(item.path, _needs_cpus_alone(item))
    wall0, cpu0 = time.perf_counter(), _cpu_s()
    try:
        yield
    finally:
        if _PROFILE:
            import json

            row = {"test": item.nodeid, "wall_s": round(time.perf_counter() - wall0, 3),
                   "cpu_s": round(_cpu_s() - cpu0, 3), "alone": _needs_cpus_alone(item)}
            with open(_PROFILE, "a") as f:
                f.write(json.dumps(row) + "\n")
        if _cpu_share is not None and (
                nextitem is None or nextitem.path != item.path
                or _needs_cpus_alone(nextitem) != _needs_cpus_alone(item)
                or (not _needs_cpus_alone(item) and _cpu_share.someone_waits())):
            _cpu_share.release()
