"""Import llama-cpp-python with ggml's OpenMP threads sleeping, not spinning, between ops.

llama.cpp's CPU backend is built with OpenMP (libgomp). libgomp's default wait policy spins
a thread that reaches a barrier for a while before it sleeps; ggml meets a barrier after
every graph op. With the cores shared (another process runnable on them), a spinning thread
burns the time slice its partner needs, so scoring many small decodes (one multiple-choice
item each) took 3x the CPU time: measured beside a busy loop on the 2-core VM, 6 HellaSwag
items, 2 threads, 9.3-10.0 s CPU (12-17 s wall) with the default against 3.3 s CPU
(6.8-8.0 s wall) with `OMP_WAIT_POLICY=passive`, same answers (2026-11-28, load 4-5).

The policy is also what separates epi from llama-perplexity (which keeps libgomp's spinning
default) at two threads, where at one thread the two are at par. Perplexity, SmolLM2-135M F16,
8 windows of 512, 2 threads, same libraries (2026-11-29): on the idle VM (load 0.3) epi
1.147 s/window passive against 1.003 s/window with the default, CPU 2.13 against 1.98 s per
window, llama-perplexity 0.96 s/window; beside other agents' work (load 4-5) the default's
spinning took 4.6 CPU s per window against 2.25 passive, and a short spin
(`GOMP_SPINCOUNT=3000`) 2.36. Thread placement is the same on both sides (no OpenMP binding,
no CPU mask; with OpenMP, ggml's own thread-pool polling settings are unused). Passive stays
the default: it costs ~14 % of wall time on an idle machine and saves half the CPU on a busy
one; `OMP_WAIT_POLICY=active` in the environment buys the idle-machine speed back.

libgomp reads the policy once, when the library is loaded, so it is set for the import only
and the environment is put back: subprocesses (llama-perplexity in a cross-check) keep the
user's own setting. A policy the user set is never overridden.
"""

from __future__ import annotations

import os
from types import ModuleType

WAIT_POLICY = "OMP_WAIT_POLICY"


def import_llama_cpp() -> ModuleType:
    """`import llama_cpp`, with a passive OpenMP wait policy unless the user chose one."""
    mine = WAIT_POLICY not in os.environ
    if mine:
        os.environ[WAIT_POLICY] = "passive"
    try:
        import llama_cpp
    finally:
        if mine:
            os.environ.pop(WAIT_POLICY, None)
    return llama_cpp
