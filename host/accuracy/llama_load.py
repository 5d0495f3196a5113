"""Import llama-cpp-python with ggml's OpenMP threads sleeping, not spinning, between ops.

llama.cpp's CPU backend is built with OpenMP (libgomp). libgomp's default wait policy spins
a thread that reaches a barrier for a while before it sleeps; ggml meets a barrier after
every graph op. With the cores shared (another process runnable on them), a spinning thread
burns the time slice its partner needs, so scoring many small decodes (one multiple-choice
item each) took 3x the CPU time: measured beside a busy loop on the 2-core VM, 6 HellaSwag
items, 2 threads, 9.3-10.0 s CPU (12-17 s wall) with the default against 3.3 s CPU
(6.8-8.0 s wall) with `OMP_WAIT_POLICY=passive`, same answers (2026-11-28, load 4-5).

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
