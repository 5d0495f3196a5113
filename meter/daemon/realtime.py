"""Real-time scheduling for the sampler thread, where the system allows it.

Why: a sweep is due every period (50 ms at 20 Hz) and, on the emulated bus, waits for its
frames in several short sleeps. On a machine whose cores are all busy (the inference, an
unrelated job), each wake-up of a normal-priority thread waits for a core: measured on a
2-core VM at load 12, sweeps ran up to 66 ms late, some were skipped, and the trace had sample
gaps the analysis rightly refuses (> 3 periods). The same daemon under SCHED_FIFO had a p99
sample interval of 50.7 ms and no late sweep. A real meter has the same need whenever its
host runs anything else: the sampler's deadlines, not its CPU share, decide the data.

The sampler thread (the calling thread: on Linux, `sched_setscheduler(0, …)` applies to the
calling thread only) gets SCHED_FIFO at a low real-time priority; the sampler sleeps between
sweeps (about 7 % of a core for four emulated chips), and the kernel's real-time throttling
bounds a runaway. Without the permission (no CAP_SYS_NICE, no RLIMIT_RTPRIO) or on a
platform without it, sampling goes on at normal priority and the returned note says so.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager, suppress

SAMPLER_RT_PRIORITY = 10  # low among real-time priorities: kernel threads above it stay above


@contextmanager
def realtime_sampling(priority: int = SAMPLER_RT_PRIORITY) -> Iterator[str]:
    """Run the body with the calling thread under SCHED_FIFO when permitted; yields a note
    for the log, and restores the thread's previous policy afterwards."""
    setter = getattr(os, "sched_setscheduler", None)
    getter = getattr(os, "sched_getscheduler", None)
    fifo = getattr(os, "SCHED_FIFO", None)
    if setter is None or getter is None or fifo is None:
        yield "sampler at normal priority (no real-time scheduling on this platform)"
        return
    try:
        before = (getter(0), os.sched_getparam(0))
        setter(0, fifo, os.sched_param(priority))
    except OSError as exc:
        yield (f"sampler at normal priority (SCHED_FIFO refused: {exc.strerror or exc}); "
               "sweeps may run late while every core is busy")
        return
    try:
        yield f"sampler thread at real-time priority (SCHED_FIFO {priority})"
    finally:
        with suppress(OSError):
            setter(0, before[0], before[1])
