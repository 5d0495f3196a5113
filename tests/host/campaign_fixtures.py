"""Shared pieces of the end-to-end campaign tests (test_campaign_resume.py,
test_campaign_adaptive_e2e.py): a short prompt set, and the [run] and [thermal] tables that
keep each measured run short without starving the analysis of samples.

A run's wall time is its process start and model load (~0.5 s), an idle window before each
repeat, and the decode of every prompt. The shipped prompt set has four prompts (32 to 256
prompt tokens); these tests measure mechanics (resume, adaptive rounds), not prompt length, so
they use its two shortest: with 2 repeats a run has 4 requests, enough edges for `lag = "auto"`
to estimate the load lag per run (host/analysis/lag.py needs 3). The decode length stays at
128 tokens: at the tests' meter rates (20–40 Hz) a 128-token decode window holds 3+ samples on
an idle machine, where the analysis needs 2 (host/analysis/align.py); fewer tokens would leave
the fast idle machine's windows short of samples. The idle window (0.35 s) holds 7+ samples at
20 Hz, and at the modelled idle power (2.7 W at least) 0.95 J, so the emulated board's energy
counter resolution (0.0036 J) stays under the analysis' 0.5 % limit for it (0.25 s did not).
"""

from __future__ import annotations

import json
from pathlib import Path

N_PROMPTS = 2  # the shipped set's shortest prompts a run sends (see the module docstring)
TOKENS = 128  # generated tokens per request (see the module docstring)
IDLE_S = 0.35  # idle window before each repeat (see the module docstring)
SETTLE_S = 0.05  # the fixed thermal wait before each run: a real wait, journaled, kept short


def write_short_prompts(path: Path, n: int) -> Path:
    """The shipped default prompt set cut to its `n` shortest prompts (texts, ids and token
    lengths as shipped), written to `path` as a prompt set file of its own version."""
    from host.run.prompts import default_prompts_path

    doc = json.loads(default_prompts_path().read_text())
    doc["prompts"] = sorted(doc["prompts"], key=lambda p: p["n_tokens"])[:n]
    doc["version"] = f"{doc['version']}-shortest-{n}"
    doc["description"] = f"the {n} shortest prompts of {doc['name']} (tests)"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=1))
    return path


def run_tables(prompts: Path) -> str:
    """The study file's [run] and [thermal] tables for these tests (2 repeats per run, one
    thread, no warm-up, no cool-down, a short fixed settle)."""
    return f"""
[run]
tokens = {TOKENS}
repeats_per_run = 2
warmups = 0
threads = 1
prompts = "{prompts}"
idle_s = {IDLE_S}
cooldown_s = 0

[thermal]
rule = "fixed"
wait_s = {SETTLE_S}
"""
