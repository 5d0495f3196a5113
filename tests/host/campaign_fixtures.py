"""Shared pieces of the end-to-end campaign tests (test_campaign_resume.py,
test_campaign_adaptive_e2e.py): a short prompt set, and the [run] and [thermal] tables that
keep each measured run short without starving the analysis of samples.

A run's wall time is its process start and model load (~0.5 s), an idle window before each
repeat, and the decode of every prompt. The shipped prompt set has four prompts (32 to 256
prompt tokens); these tests measure mechanics (resume, adaptive rounds), not prompt length, so
they send two of them: with 2 repeats a run has 4 requests, enough edges for `lag = "auto"` to
estimate the load lag per run (host/analysis/lag.py needs 3). The two longest, because the
analysis flags a run whose clock offset uncertainty exceeds 1 % of its median prefill: with the
two shortest (median prefill ~15 ms) a loaded machine's 0.15 ms uncertainty did; the longest
two (~40 ms) leave more room than the whole set (~23 ms). The decode length stays at
128 tokens: an idle 2-core VM decodes them in 0.12–0.15 s, so the tests' meter runs at 40 Hz
(5+ samples a decode window; at 20 Hz 2–3, no margin over the 2 the analysis needs,
host/analysis/align.py); fewer tokens would leave a fast idle machine's windows short. The idle
window (0.35 s) holds 7+ samples at
20 Hz, and at the modelled idle power (2.7 W at least) 0.95 J, so the emulated board's energy
counter resolution (0.0036 J) stays under the analysis' 0.5 % limit for it (0.25 s did not).
"""

from __future__ import annotations

import json
from pathlib import Path

PROMPT_IDS = ("p128-letter", "p256-notes")  # of the shipped set (see the module docstring)
N_PROMPTS = len(PROMPT_IDS)
TOKENS = 128  # generated tokens per request (see the module docstring)
IDLE_S = 0.35  # idle window before each repeat (see the module docstring)
SETTLE_S = 0.05  # the fixed thermal wait before each run: a real wait, journaled, kept short


def write_prompts(path: Path) -> Path:
    """The shipped default prompt set cut to PROMPT_IDS (texts, ids and token lengths as
    shipped), written to `path` as a prompt set file of its own version."""
    from host.run.prompts import default_prompts_path

    doc = json.loads(default_prompts_path().read_text())
    doc["prompts"] = [p for p in doc["prompts"] if p["id"] in PROMPT_IDS]
    assert [p["id"] for p in doc["prompts"]] == list(PROMPT_IDS), "shipped prompt set changed"
    doc["version"] = f"{doc['version']}-{'-'.join(PROMPT_IDS)}"
    doc["description"] = f"prompts {', '.join(PROMPT_IDS)} of {doc['name']} (tests)"
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
