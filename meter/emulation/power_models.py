"""Power models: what the load on an emulated channel draws, with exact ground truth.

The ATM90E26 emulator is fed by one of these. A model answers, at a monotonic time (ns):
`voltage_v`, `current_a`, `power_factor`, `frequency_hz` and `power_w` (= V·I·PF, signed;
negative means energy flowing back), and — for ground truth — the exact integral of active
power between two times: `energy_j(t0_mono_ns, t1_mono_ns)`, split into forward and reverse
parts by `energy_parts_j`. `describe()` gives a dict for trace metadata; every model says
`"modelled": True` so nobody mistakes its numbers for a measurement.

- `ConstantPower`: one fixed operating point.
- `ScriptedProfile`: piecewise-constant power steps at given offsets from a start time — the
  exact ground truth that tests integrate against.
- `ActivityModel`: this machine's real CPU activity (from /proc/stat) mapped to a Pi-5-like
  wall power (about 2.7 W idle to about 9.5 W at full load). The mapping is a model, not a
  measurement of this machine's power; it is labelled as such.
- `ProcessTreeActivityModel`: the same mapping driven only by the CPU time of the inference
  process tree (the PIDs in a follow file and all their descendants, every thread), so a
  background job on a shared machine is not "inference power": a Pi 5 dedicated to inference.
  `default_activity_model` picks it when the daemon's environment names a follow file
  (`EPI_METER_FOLLOW`, written by the campaign), else the whole-machine model.
"""

from __future__ import annotations

import bisect
import math
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from meter.clock import Clock

NS_PER_S = 1_000_000_000


class PowerModel:
    """Base: a fixed voltage, power factor and frequency; subclasses define `power_w`.

    Current follows from active power: I = |P| / (V · |PF|).
    """

    kind = "base"

    def __init__(
        self, *, voltage_v: float = 230.0, power_factor: float = 1.0, frequency_hz: float = 50.0
    ) -> None:
        if voltage_v <= 0:
            raise ValueError(f"voltage_v must be > 0, got {voltage_v}")
        if not 0.0 < abs(power_factor) <= 1.0:
            raise ValueError(f"power_factor must be in (0, 1], got {power_factor}")
        if not 45.0 <= frequency_hz <= 65.0:
            raise ValueError(f"frequency_hz must be within 45..65 Hz, got {frequency_hz}")
        self._voltage_v = float(voltage_v)
        self._power_factor = float(abs(power_factor))
        self._frequency_hz = float(frequency_hz)

    def power_w(self, t_mono_ns: int) -> float:
        """Active power at a monotonic time (abstract: each model provides it)."""
        raise NotImplementedError(type(self).__name__ + " must implement power_w")

    def energy_j(self, t0_mono_ns: int, t1_mono_ns: int) -> float:
        """Exact integral of active power between two times (abstract: the ground truth)."""
        raise NotImplementedError(type(self).__name__ + " must implement energy_j")

    def energy_parts_j(self, t0_mono_ns: int, t1_mono_ns: int) -> tuple[float, float]:
        """(forward_j, reverse_j) between two times, both >= 0; default: by the net sign."""
        net = self.energy_j(t0_mono_ns, t1_mono_ns)
        return (net, 0.0) if net >= 0 else (0.0, -net)

    def voltage_v(self, t_mono_ns: int) -> float:
        return self._voltage_v

    def power_factor(self, t_mono_ns: int) -> float:
        """Magnitude of the power factor (lagging); the sign of power carries direction."""
        return self._power_factor

    def frequency_hz(self, t_mono_ns: int) -> float:
        return self._frequency_hz

    def current_a(self, t_mono_ns: int) -> float:
        return abs(self.power_w(t_mono_ns)) / (self._voltage_v * self._power_factor)

    def describe(self) -> dict:
        return {
            "kind": self.kind,
            "modelled": True,
            "voltage_v": self._voltage_v,
            "power_factor": self._power_factor,
            "frequency_hz": self._frequency_hz,
        }


class ConstantPower(PowerModel):
    """A load drawing `power_w` at all times (negative = reverse flow)."""

    kind = "constant"

    def __init__(self, power_w: float, **kwargs: float) -> None:
        super().__init__(**kwargs)
        self._power_w = float(power_w)

    def power_w(self, t_mono_ns: int) -> float:
        return self._power_w

    def energy_j(self, t0_mono_ns: int, t1_mono_ns: int) -> float:
        return self._power_w * (t1_mono_ns - t0_mono_ns) / NS_PER_S

    def energy_parts_j(self, t0_mono_ns: int, t1_mono_ns: int) -> tuple[float, float]:
        e = self.energy_j(t0_mono_ns, t1_mono_ns)
        return (e, 0.0) if e >= 0 else (0.0, -e)

    def describe(self) -> dict:
        return {**super().describe(), "power_w": self._power_w}


class _Piecewise(PowerModel):
    """Piecewise-constant power over breakpoints; exact integrals via a cumulative table."""

    def __init__(self, **kwargs: float) -> None:
        super().__init__(**kwargs)
        self._t: list[int] = []  # breakpoints, ascending
        self._p: list[float] = []  # power on [t[i], t[i+1]); the last one holds on
        self._cum: list[float] = []  # signed energy from t[0] to t[i]
        self._cum_fwd: list[float] = []
        self._cum_rev: list[float] = []

    def _append(self, t_ns: int, power_w: float) -> None:
        if self._t:
            if t_ns <= self._t[-1]:
                raise ValueError("breakpoints must increase")
            dt_s = (t_ns - self._t[-1]) / NS_PER_S
            e = self._p[-1] * dt_s
            self._cum.append(self._cum[-1] + e)
            self._cum_fwd.append(self._cum_fwd[-1] + max(e, 0.0))
            self._cum_rev.append(self._cum_rev[-1] + max(-e, 0.0))
        else:
            self._cum.append(0.0)
            self._cum_fwd.append(0.0)
            self._cum_rev.append(0.0)
        self._t.append(int(t_ns))
        self._p.append(float(power_w))

    def _prepare(self, t_mono_ns: int) -> None:
        """Hook for models that extend their history on demand."""

    def _index(self, t_ns: int) -> int:
        return max(bisect.bisect_right(self._t, t_ns) - 1, 0)

    def _cum_at(self, t_ns: int, table: list[float], part: int) -> float:
        """Integral from t[0] to t_ns of power (part 0), its positive (1) or negative (2) part."""
        i = self._index(t_ns)
        e = self._p[i] * (t_ns - self._t[i]) / NS_PER_S
        if part == 1:
            e = max(e, 0.0) if t_ns >= self._t[i] else min(e, 0.0)
        elif part == 2:
            e = max(-e, 0.0) if t_ns >= self._t[i] else min(-e, 0.0)
        return table[i] + e

    def power_w(self, t_mono_ns: int) -> float:
        self._prepare(t_mono_ns)
        return self._p[self._index(t_mono_ns)]

    def energy_j(self, t0_mono_ns: int, t1_mono_ns: int) -> float:
        self._prepare(max(t0_mono_ns, t1_mono_ns))
        return self._cum_at(t1_mono_ns, self._cum, 0) - self._cum_at(t0_mono_ns, self._cum, 0)

    def energy_parts_j(self, t0_mono_ns: int, t1_mono_ns: int) -> tuple[float, float]:
        self._prepare(max(t0_mono_ns, t1_mono_ns))
        fwd_table, rev_table = self._cum_fwd, self._cum_rev
        fwd = self._cum_at(t1_mono_ns, fwd_table, 1) - self._cum_at(t0_mono_ns, fwd_table, 1)
        rev = self._cum_at(t1_mono_ns, rev_table, 2) - self._cum_at(t0_mono_ns, rev_table, 2)
        return max(fwd, 0.0), max(rev, 0.0)


class ScriptedProfile(_Piecewise):
    """Power steps `[(t_offset_s, power_w), ...]` relative to `start_mono_ns`.

    Each power holds from its offset until the next one; the last holds for ever. Before the
    first offset the first power applies (the profile is stationary before it starts).
    `energy_j` is exact (sums of rectangles), which makes this the ground truth for tests.
    """

    kind = "scripted"

    def __init__(
        self,
        steps: Sequence[tuple[float, float]],
        *,
        start_mono_ns: int = 0,
        **kwargs: float,
    ) -> None:
        super().__init__(**kwargs)
        if not steps:
            raise ValueError("a scripted profile needs at least one (t_offset_s, power_w) step")
        self._steps = [(float(t), float(p)) for t, p in steps]
        self._start_mono_ns = int(start_mono_ns)
        last = None
        for t_s, p_w in self._steps:
            if last is not None and t_s <= last:
                raise ValueError(f"step offsets must increase: {t_s} after {last}")
            if not math.isfinite(p_w):
                raise ValueError(f"step power must be finite, got {p_w}")
            self._append(self._start_mono_ns + round(t_s * NS_PER_S), p_w)
            last = t_s

    def describe(self) -> dict:
        return {
            **super().describe(),
            "start_mono_ns": self._start_mono_ns,
            "steps": [[t, p] for t, p in self._steps],
        }


def read_cpu_times(proc_stat: str | Path = "/proc/stat") -> tuple[int, int]:
    """(busy_jiffies, total_jiffies) summed over all CPUs, from the `cpu` line of /proc/stat."""
    with open(proc_stat, encoding="ascii") as f:
        for line in f:
            if line.startswith("cpu "):
                fields = [int(x) for x in line.split()[1:]]
                idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
                total = sum(fields[:8])  # guest time is already inside user/nice
                return total - idle, total
    raise ValueError(f"{proc_stat}: no aggregate 'cpu' line")


def count_cpus(proc_stat: str | Path = "/proc/stat") -> int:
    """The CPUs with a `cpuN` line in /proc/stat (0 when it cannot be read)."""
    try:
        with open(proc_stat, encoding="ascii") as f:
            return sum(1 for line in f if line.startswith("cpu") and line[3:4].isdigit())
    except OSError:
        return 0


class ActivityModel(_Piecewise):
    """This machine's CPU activity mapped to a Pi-5-like wall power — modelled, not measured.

    What it reads: the aggregate `cpu` line of the whole machine's /proc/stat (or any
    `cpu_times()` callable giving cumulative (busy, total) jiffies). Every process counts —
    the meter daemon itself, the inference, any other job — just as a wall meter would see
    the whole machine, not one process.

    Timing: the busy fraction u measured between two readings is the activity *of that
    interval*, so it sets the power of that interval — P = idle_w + (max_w − idle_w) · u on
    [previous reading, this reading) — not of the time after it (that was a lag of one update
    period: 100 % CPU from 1.0 to 1.3 s showed as power from 1.1 to 1.4 s). A reading is taken
    whenever the model is asked about a time at least `update_period_s` after the previous one.
    Times after the latest reading are provisional (the last power held) until the next reading
    replaces them; everything before the latest reading is final. Resolution: /proc/stat counts
    in jiffies (10 ms per CPU).

    Why `update_period_s` is one jiffy (10 ms), not the sample period: the emulated chip
    integrates its energy registers when the daemon's sweep reads them, and what it integrates
    after the latest reading is the provisional power — the chip never re-integrates when a
    later reading revises it. With a 50 ms update period and 20 Hz sweeps, a sweep that came a
    little under 50 ms after the previous reading took none, so that whole sweep interval was
    metered at the previous interval's power: the power edges trailed the activity by ~one
    sample period (48 ms measured with the process tree), an artefact of the emulation that no
    real chip shows. With a minimum spacing below the sweep period every sweep takes a reading
    at its first register access, and the chip meters each interval at its own activity
    (tests/meter/test_activity_model_timing.py checks the energy registers against the closed
    form). Closer readings than one jiffy would carry no new count.

    Defaults follow published Pi 5 figures (≈2.7 W idle, ≈9.5 W with all cores busy, wall
    side of a USB-C supply with a power factor of ≈0.6). The history is kept so `energy_j`
    over any past window is exact for the model; beyond `max_points` the oldest half is dropped
    (earlier times then see the oldest kept power).
    """

    kind = "activity"

    def __init__(
        self,
        clock: Clock,
        *,
        idle_w: float = 2.7,
        max_w: float = 9.5,
        update_period_s: float = 0.01,
        proc_stat: str | Path = "/proc/stat",
        cpu_times: Callable[[], tuple[float, float]] | None = None,
        max_points: int = 50_000,
        voltage_v: float = 230.0,
        power_factor: float = 0.6,
        frequency_hz: float = 50.0,
    ) -> None:
        super().__init__(voltage_v=voltage_v, power_factor=power_factor, frequency_hz=frequency_hz)
        if not 0 < idle_w <= max_w:
            raise ValueError(f"need 0 < idle_w <= max_w, got {idle_w}, {max_w}")
        self._clock = clock
        self._idle_w = float(idle_w)
        self._max_w = float(max_w)
        self._period_ns = max(int(update_period_s * NS_PER_S), 1)
        self._proc_stat = str(proc_stat) if cpu_times is None else "cpu_times()"
        self._cpu_times: Callable[[], tuple[float, float]] = cpu_times or (
            lambda: read_cpu_times(proc_stat))
        self._max_points = int(max_points)
        t0 = clock.monotonic_ns()
        busy, total = self._read(t0)
        self._busy, self._total = float(busy), float(total)
        self._append(t0, self._idle_w)

    def _prepare(self, t_mono_ns: int) -> None:
        """Read the activity since the last reading and give its power to that interval."""
        t_last = self._t[-1]
        if t_mono_ns < t_last + self._period_ns:
            return
        busy, total = self._read(t_mono_ns)
        d_total = total - self._total
        if d_total <= 0:  # no tick counted yet: the interval stays provisional
            return
        raw = (busy - self._busy) / d_total
        util = min(max(raw, 0.0), 1.0)
        # A reading that ran late, or one edge's jitter in the per-thread run times, can give
        # an interval more CPU time than its CPUs × wall time: the power is capped at max_w,
        # and the excess is carried into the next interval instead of being dropped, so the
        # energy over a span stays the CPU time it held (mapped) even at full load.
        self._busy = busy - max(raw - 1.0, 0.0) * d_total
        self._total = total
        # The interval [t_last, now) gets the power of its own activity; the new breakpoint
        # at now holds that power provisionally until the next reading.
        power = self._idle_w + (self._max_w - self._idle_w) * util
        self._p[-1] = power
        self._append(int(t_mono_ns), power)
        if len(self._t) > self._max_points:
            half = len(self._t) // 2
            for table in (self._t, self._p, self._cum, self._cum_fwd, self._cum_rev):
                del table[:half]

    def _read(self, t_mono_ns: int) -> tuple[float, float]:
        """Cumulative (busy, total) CPU time for a reading that ends the interval at
        `t_mono_ns` (this model: both from the CPU-time source)."""
        return self._cpu_times()

    def describe(self) -> dict:
        return {
            **super().describe(),
            "source": self._proc_stat,
            "reads": "whole-machine CPU time (every process counts, as a wall meter sees it)",
            "timing": "each reading's busy fraction sets the power of the interval it measured",
            "mapping": "idle_w + (max_w - idle_w) * cpu_busy_fraction",
            "idle_w": self._idle_w,
            "max_w": self._max_w,
            "update_period_s": self._period_ns / NS_PER_S,
        }


# ---- the inference process tree ------------------------------------------------------------
FOLLOW_ENV = "EPI_METER_FOLLOW"  # path of the follow file: root PIDs, whitespace-separated


@dataclass(frozen=True)
class ProcStat:
    """The fields of /proc/PID/stat the process-tree model uses."""

    ppid: int
    start_ticks: int  # starttime (field 22): with the PID, the process's identity
    cpu_ticks: int  # utime + stime (fields 14, 15): summed over all the process's threads


def read_proc_stat(path: Path) -> ProcStat | None:
    """Parse one /proc/PID/stat (None when the process is gone or the line is malformed).

    The command name (field 2) may hold spaces and parentheses, so the fields are split after
    its last ')'. The kernel sums utime/stime over every thread of the process, live and
    exited, so /proc/PID/stat alone counts llama.cpp's worker threads; /proc/PID/task/*/stat
    would give the same sum per thread.
    """
    try:
        text = path.read_text(encoding="ascii", errors="replace")
    except OSError:
        return None
    try:
        f = text.rsplit(")", 1)[1].split()  # f[0] is field 3 (state)
        return ProcStat(ppid=int(f[1]), start_ticks=int(f[19]),
                        cpu_ticks=int(f[11]) + int(f[12]))
    except (IndexError, ValueError):
        return None


def read_follow_file(path: Path) -> tuple[int, ...]:
    """Root PIDs from a follow file; a missing file or a non-PID word gives no roots for it."""
    try:
        words = path.read_text(encoding="utf-8", errors="replace").split()
    except OSError:
        return ()
    return tuple(dict.fromkeys(int(w) for w in words if w.isdigit() and int(w) > 0))


def _clock_ticks_per_s() -> float:
    return float(os.sysconf("SC_CLK_TCK")) if hasattr(os, "sysconf") else 100.0


def read_thread_run_ns(task_dir: Path) -> dict[int, int] | None:
    """{thread id: run time in ns} from each live thread's schedstat (its first field), or
    None where the kernel gives none (no task directory, no schedstat files)."""
    try:
        tids = [t for t in os.listdir(task_dir) if t.isdigit()]
    except OSError:
        return None
    out: dict[int, int] = {}
    for tid in tids:
        try:
            with open(task_dir / tid / "schedstat", "rb") as f:
                out[int(tid)] = int(f.read().split()[0])
        except (OSError, ValueError, IndexError):
            continue  # the thread exited, or no schedstat
    return out or None


class ProcessTreeCpu:
    """Cumulative CPU ticks of the process trees rooted at the PIDs of a follow file.

    Each call returns a running total that grows by the CPU time the tree used since the
    previous call: for every process in the tree (a root, or any descendant by parent PID,
    keyed by PID and start time so a reused PID starts afresh), the growth of utime + stime.
    A descendant first seen after the previous call is new, so all its CPU time counts; when
    the set of roots changes, every process then in the tree counts only from that moment
    (a root followed late brings no backlog). `exclude_pid` (the meter daemon itself, by
    default this process) and its descendants are never counted even when a root is their
    ancestor — a campaign that starts the daemon is itself a root. A process that exits
    between two calls loses the CPU time of its last interval (at most one update period).

    The tree is rediscovered from all of /proc every `rescan_period_s` (a full scan costs
    ~1 ms per 100 processes); in between only its known members' stat files are read.

    Resolution: utime + stime count in 10 ms clock ticks, truncated, so a window's CPU time
    was off by up to 10 ms at each edge (σ ≈ 4 ms: 2.7 % of the tiny test model's prefill
    CPU per repeat, against a 3 % CV gate). Where the kernel gives it
    (/proc/PID/task/TID/schedstat, CONFIG_SCHED_INFO), each live thread's run time in ns is
    used instead — current to the last scheduler tick (4 ms at HZ=250, σ ≈ 1.2 ms) — summed
    per thread, so a thread that starts counts from its birth and one that exits loses only
    its last interval (as an exiting process does). The total is still given in clock ticks
    (fractional), the unit the model's denominator uses.
    """

    def __init__(self, follow_file: str | Path, *, proc_root: str | Path = "/proc",
                 exclude_pid: int | None = None, rescan_period_s: float = 0.25,
                 monotonic_s: Callable[[], float] = time.monotonic) -> None:
        self.follow_file = Path(follow_file)
        self._proc = Path(proc_root)
        self._exclude = os.getpid() if exclude_pid is None else int(exclude_pid)
        self._rescan_s = float(rescan_period_s)
        self._now = monotonic_s
        self._roots: tuple[int, ...] = ()
        self._follow_sig: tuple[int, int] | None = None
        self._members: list[int] = []
        self._last: dict[tuple[int, int], int] = {}  # (pid, start) → cpu ticks last seen
        # (pid, start) → {tid: run time ns} last seen, for processes read by thread
        self._last_threads: dict[tuple[int, int], dict[int, int]] = {}
        self._scanned_at = -math.inf
        self._total = 0.0
        self._ticks_per_ns = _clock_ticks_per_s() / NS_PER_S

    @property
    def roots(self) -> tuple[int, ...]:
        return self._roots

    def _refresh_roots(self) -> bool:
        """Re-read the follow file when it changed; True when the roots changed."""
        try:
            st = self.follow_file.stat()
            sig: tuple[int, int] | None = (st.st_mtime_ns, st.st_size)
        except OSError:
            sig = None
        if sig == self._follow_sig:
            return False
        self._follow_sig = sig
        roots = read_follow_file(self.follow_file) if sig is not None else ()
        changed = roots != self._roots
        self._roots = roots
        return changed

    def _scan(self) -> dict[int, ProcStat]:
        """The tree's processes from a full /proc scan (parent links from every stat)."""
        stats: dict[int, ProcStat] = {}
        children: dict[int, list[int]] = {}
        try:
            entries = [e for e in os.listdir(self._proc) if e.isdigit()]
        except OSError:
            return {}
        for name in entries:
            st = read_proc_stat(self._proc / name / "stat")
            if st is not None:
                pid = int(name)
                stats[pid] = st
                children.setdefault(st.ppid, []).append(pid)
        tree: dict[int, ProcStat] = {}
        todo = [r for r in self._roots if r in stats]
        while todo:
            pid = todo.pop()
            if pid in tree or pid == self._exclude:
                continue
            tree[pid] = stats[pid]
            todo.extend(children.get(pid, ()))
        return tree

    def _read_members(self) -> dict[int, ProcStat]:
        out = {}
        for pid in self._members:
            st = read_proc_stat(self._proc / str(pid) / "stat")
            if st is not None:
                out[pid] = st
        return out

    def __call__(self) -> float:
        roots_changed = self._refresh_roots()
        now = self._now()
        if roots_changed or now >= self._scanned_at + self._rescan_s:
            tree = self._scan()
            self._scanned_at = now
        else:
            tree = self._read_members()
        self._members = list(tree)
        seen: dict[tuple[int, int], int] = {}
        seen_threads: dict[tuple[int, int], dict[int, int]] = {}
        for pid, st in tree.items():
            key = (pid, st.start_ticks)
            threads = read_thread_run_ns(self._proc / str(pid) / "task")
            if threads is not None:
                before = self._last_threads.get(key)
                if before is None and key in self._last:
                    before = {}  # read by ticks last time: no thread baseline yet
                    threads_new = False
                else:
                    threads_new = True
                grown = 0
                for tid, ns in threads.items():
                    prev_ns = before.get(tid) if before is not None else None
                    if prev_ns is None:  # a thread (or process) new since the last call
                        if roots_changed or not threads_new:
                            continue  # baseline only: no backlog
                        prev_ns = 0
                    grown += max(ns - prev_ns, 0)
                self._total += grown * self._ticks_per_ns
                seen_threads[key] = threads
                seen[key] = st.cpu_ticks
                continue
            prev = self._last.get(key)
            if prev is None:
                prev = st.cpu_ticks if roots_changed else 0  # a new process: all of it counts
            self._total += max(st.cpu_ticks - prev, 0)
            seen[key] = st.cpu_ticks
        self._last = seen
        self._last_threads = seen_threads
        return self._total


class ProcessTreeActivityModel(ActivityModel):
    """The inference process tree's CPU activity mapped to Pi-5-like power — modelled.

    As `ActivityModel` (same mapping, timing and defaults), but the busy fraction counts only
    the CPU time of the processes named in a follow file and their descendants, with all their
    threads (`ProcessTreeCpu`), over the whole machine's elapsed CPU time (its CPUs × the
    wall time between readings, exact; /proc/stat's total moves in whole jiffies): all
    cores busy with inference → max_w; the tree asleep → idle_w, whatever else runs beside it.
    That is the wall power of a Pi 5 that runs nothing but the inference; a background job
    on a shared development machine no longer shows as inference power. A missing or empty
    follow file means no inference: the idle floor.
    """

    kind = "activity_process_tree"

    def __init__(self, clock: Clock, follow_file: str | Path, *,
                 proc_root: str | Path = "/proc", exclude_pid: int | None = None,
                 rescan_period_s: float = 0.25, idle_w: float = 2.7, max_w: float = 9.5,
                 update_period_s: float = 0.01) -> None:
        proc = Path(proc_root)
        self._tree = ProcessTreeCpu(follow_file, proc_root=proc, exclude_pid=exclude_pid,
                                    rescan_period_s=rescan_period_s)
        self._n_cpu = count_cpus(proc / "stat") or os.cpu_count() or 1
        self._machine_ticks_per_ns = _clock_ticks_per_s() * self._n_cpu / NS_PER_S

        # every reading comes from `_read` (below), never from the base class's /proc/stat
        super().__init__(clock, idle_w=idle_w, max_w=max_w, update_period_s=update_period_s)
        self._proc_stat = (f"{proc}/PID/task/TID/schedstat run time (ns) of the tree's threads, "
                           f"else {proc}/PID/stat utime + stime")

    def _read(self, t_mono_ns: int) -> tuple[float, float]:
        """The tree's ticks, and the machine's elapsed CPU time as its CPUs × the time of the
        breakpoint this reading sets: exact, where /proc/stat's total moves in whole jiffies
        per CPU (±1 of the ~10 a 50 ms interval holds on 2 CPUs: ±10 % on each interval's
        power). Taking it at the breakpoint (not at the clock when /proc was read) makes each
        interval's energy (max_w − idle_w) × its ticks / (ticks per second × CPUs), so the
        energy over any span is the tree's CPU time mapped, however late a reading ran
        (measured before, at load 18: twice the child's CPU time, when the poller was
        preempted between choosing the time and reading /proc)."""
        return float(self._tree()), t_mono_ns * self._machine_ticks_per_ns

    def describe(self) -> dict:
        return {
            **super().describe(),
            "reads": ("CPU time (each thread's schedstat run time in ns where the kernel "
                      "gives it, else utime + stime) of the inference process tree: "
                      "the PIDs in the follow file and their descendants, the meter daemon "
                      "excluded; the machine's elapsed CPU time (CPUs × wall time) as the "
                      "denominator"),
            "n_cpu": self._n_cpu,
            "follow_file": str(self._tree.follow_file),
            "roots": list(self._tree.roots),
            "mapping": "idle_w + (max_w - idle_w) * tree_cpu_time / machine_cpu_time",
        }


class RegisteredTreeActivityModel(ProcessTreeActivityModel):
    """The whole machine's CPU activity until a run registers, then that run's process tree
    — modelled.

    An emulated daemon started by hand has nobody to name the inference's PIDs at start, so
    it follows the whole machine (as `ActivityModel`) while its follow file is empty; `epi run
    --meter URL` on the same machine (same boot id) writes its own PID into the follow file
    that the daemon's /status names, and from the next reading on the busy fraction counts
    only that run's process tree (as `ProcessTreeActivityModel`). A hand-run then meters the
    run alone, as a campaign's daemon does, with no environment to export.

    Both modes share one denominator, the machine's elapsed CPU time (CPUs × wall time), so
    the busy count is one cumulative series: when the mode changes (a run registers, or its
    file is emptied) the reading that sees it takes a new baseline and counts nothing of
    that interval (one update period, 10 ms), never a jump between the two counters.
    """

    kind = "activity_registered_tree"

    def __init__(self, clock: Clock, follow_file: str | Path, *,
                 proc_root: str | Path = "/proc", exclude_pid: int | None = None,
                 **kwargs: float) -> None:
        self._machine_stat = Path(proc_root) / "stat"
        self._following: bool | None = None
        self._prev_count = 0.0
        self._busy_count = 0.0
        super().__init__(clock, follow_file, proc_root=proc_root, exclude_pid=exclude_pid,
                         **kwargs)

    @property
    def following(self) -> bool:
        """True once a run has registered (the follow file names a PID)."""
        return bool(self._tree.roots)

    def _read(self, t_mono_ns: int) -> tuple[float, float]:
        tree_ticks = float(self._tree())  # also re-reads the follow file
        following = self.following
        count = tree_ticks if following else float(read_cpu_times(self._machine_stat)[0])
        if following != self._following:
            self._following = following
            self._prev_count = count  # a new baseline: nothing of the switch counts
        self._busy_count += max(count - self._prev_count, 0.0)
        self._prev_count = count
        return self._busy_count, t_mono_ns * self._machine_ticks_per_ns

    def describe(self) -> dict:
        return {
            **super().describe(),
            "reads": ("the whole machine's CPU time (/proc/stat) until a run registers its "
                      "PID in the follow file (epi run --meter does, on the same machine), "
                      "then the CPU time of that run's process tree (each thread's schedstat "
                      "run time where the kernel gives it, else utime + stime), the meter "
                      "daemon excluded; the machine's elapsed CPU time (CPUs × wall time) as "
                      "the denominator"),
            "mapping": "idle_w + (max_w - idle_w) * cpu_time / machine_cpu_time",
        }


#: forces the whole-machine model (a campaign's `activity = "machine"`)
ACTIVITY_ENV = "EPI_METER_ACTIVITY"


def _private_follow_file() -> Path:
    """An empty follow file in a directory only this user can write, removed at exit."""
    import atexit
    import shutil
    import tempfile

    directory = Path(tempfile.mkdtemp(prefix="epi-meter-follow-"))
    atexit.register(shutil.rmtree, directory, True)
    path = directory / "follow.pids"
    path.touch(mode=0o600)
    return path


def default_activity_model(clock: Clock) -> ActivityModel:
    """Channel 0's model: the process tree when `EPI_METER_FOLLOW` names a follow file; the
    whole machine when `EPI_METER_ACTIVITY=machine`; else the whole machine until a run
    registers (`RegisteredTreeActivityModel`)."""
    follow = os.environ.get(FOLLOW_ENV)
    if follow:
        return ProcessTreeActivityModel(clock, follow)
    if os.environ.get(ACTIVITY_ENV) == "machine":
        return ActivityModel(clock)
    return RegisteredTreeActivityModel(clock, _private_follow_file())
