"""Import llama-cpp-python with ggml's OpenMP threads spinning briefly, then sleeping, at
every barrier.

llama.cpp's CPU backend is built with OpenMP (libgomp); ggml meets an OpenMP barrier after
every graph op. libgomp's default wait spins a thread that reaches a barrier for ~3 ms
(`GOMP_SPINCOUNT` 300,000) before it sleeps. With the cores shared (another process runnable
on them), a spinning thread burns the time slice its partner needs, so scoring many small
decodes (one multiple-choice item each) took 3x the CPU time: measured beside a busy loop on
the 2-core VM, 6 HellaSwag items, 2 threads, 9.3-10.0 s CPU (12-17 s wall) with the default
against 3.3 s CPU (6.8-8.0 s wall) with `OMP_WAIT_POLICY=passive`, same answers (2026-11-28,
load 4-5).

A fully passive wait (no spin: every barrier a futex sleep and wake) costs on an idle machine
what the default's spin costs on a busy one. A short spin, `GOMP_SPINCOUNT=300` (a few
microseconds: two threads at a barrier of ggml's small ops usually arrive that close
together), keeps both: SmolLM2-135M F16, 2 threads, 2-core VM, HellaSwag items and 512-token
perplexity windows, t(2N) - t(N) over N, two rounds each (2026-11-29):

| machine | wait | HellaSwag s/item | perplexity s/window |
|---|---|---|---|
| idle | passive (no spin) | 0.285, 0.274 | 0.65, 0.71 |
| idle | spin 300 | 0.230, 0.236 | 0.60, 0.67 |
| idle | spin 3,000 | 0.230, 0.230 | 0.68, 0.68 |
| one core kept busy | passive | 0.455, 0.462 | 1.25, 1.23 |
| one core kept busy | spin 300 | 0.448, 0.430 | 1.19, 1.23 |
| one core kept busy | spin 3,000 | 0.580, 0.610 | 1.28, 1.27 |

So the wait is passive with a 300-iteration spin (libgomp takes an explicit `GOMP_SPINCOUNT`
over the policy's own count): 17 % less time per multiple-choice item on an idle machine, the
same as passive beside a busy core, where a 3,000 spin already costs a third more. Thread
placement is the same as llama-perplexity's (no OpenMP binding, no CPU mask; with OpenMP,
ggml's own thread-pool polling settings are unused).

libgomp reads both variables once, when the library is loaded, so they are set for the import
only and the environment is put back: subprocesses (llama-perplexity in a cross-check) keep
the user's own setting. A wait the user chose (either variable set) is never overridden.
"""

from __future__ import annotations

import os
from types import ModuleType

WAIT_POLICY = "OMP_WAIT_POLICY"
SPIN_COUNT = "GOMP_SPINCOUNT"
# libgomp's wait at a barrier, unless the user chose one: sleep after a short spin
EPI_WAIT = {WAIT_POLICY: "passive", SPIN_COUNT: "300"}


def import_llama_cpp() -> ModuleType:
    """`import llama_cpp` with libgomp's wait set to `EPI_WAIT` while the library loads,
    unless the user set either variable."""
    mine = not any(name in os.environ for name in EPI_WAIT)
    if mine:
        os.environ.update(EPI_WAIT)
    try:
        import llama_cpp
    finally:
        if mine:
            for name in EPI_WAIT:
                os.environ.pop(name, None)
    return llama_cpp
