"""The same evaluations through llama.cpp's own evaluator, `llama-perplexity`.

Given the model, text/items and settings epi used, run the native tool and parse its figures:
- perplexity: `-f TEXT -c N_CTX -b N_CTX --chunks WINDOWS` → `Final estimate: PPL = x +/- y`
  (epi's default stride = n_ctx is llama-perplexity's chunking rule);
- HellaSwag: the subset written as llama.cpp's 6-line task file, `--hellaswag
  --hellaswag-tasks N` (all N tasks are used; the tool only shuffles their order);
- ARC / MMLU: the subset written as the binary task file, `--multiple-choice`.
The tool ranks choices by mean log-probability per token, so it is compared with epi's
`accuracy_token_norm`. Flash attention is set as epi's own context sets it, never left at the
tool's `auto` (which turns it on for the CPU): on for perplexity (epi's window contexts, and
the tool's default figure), off for multiple choice (epi's branching contexts). Left to `auto`
against epi's off, it once moved the 135M model's perplexity by 0.09 %. Agreement:
perplexity within 0.5 % (relative), accuracy within 0.5 percentage points.

llama.cpp prints through an asynchronous logger that is never drained at exit (its
common/log.cpp says so: "this design may cause logs to be lost if not flushed before the program
exits", ggml-org/llama.cpp#22142), so a run can exit 0 with its last lines, the final figure
among them, missing: seen here 2 times in 25 on a loaded 2-core machine, and once 3 times in a
row while the whole test suite loaded both cores (the losses come together when the machine is
busy). Such a run is repeated (the figures are deterministic), at most `ATTEMPTS` times, and
the number of attempts is kept in the result.
"""

from __future__ import annotations

import re
import subprocess
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TypedDict

from host.accuracy.branching import BranchingContext, FlashAttention
from host.accuracy.items import Item
from host.accuracy.readers import write_hellaswag_txt, write_multiple_choice_bin
from host.accuracy.results import figure
from host.accuracy.window_context import WindowContext
from host.llama.install import tool_env, tool_path

PPL_REL_TOLERANCE = 0.005
ACC_ABS_TOLERANCE = 0.005
TIMEOUT_S = 3600
ATTEMPTS = 6  # runs of the tool when it exits 0 but its output lacks the final figure

_PPL_RE = re.compile(r"Final estimate: PPL = ([0-9.]+) \+/- ([0-9.]+)")
_HS_RE = re.compile(r"^(\d+)\t([0-9.]+)%\t\[", re.MULTILINE)
_MC_RE = re.compile(r"^(\d+)\t([0-9.]+)$", re.MULTILINE)


def _run_once(args: Sequence[str], model: Path, threads: int,
              flash_attn: FlashAttention) -> tuple[str, float, int]:
    argv = [str(tool_path("llama-perplexity")), "-m", str(model), "-t", str(threads),
            "-tb", str(threads), "-fa", str(flash_attn), *args]
    t0 = time.monotonic()
    proc = subprocess.run(argv, env=tool_env(), stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, errors="replace",
                          timeout=TIMEOUT_S, check=False)
    return proc.stdout, time.monotonic() - t0, proc.returncode


def _run(args: Sequence[str], model: Path, threads: int, complete: Callable[[str], bool],
         flash_attn: FlashAttention = BranchingContext.FLASH_ATTENTION,
         ) -> tuple[str, float, int, int]:
    """Run the tool until its output is `complete`, repeating a run that exited 0 without its
    final figure (the lost-log race above); a non-zero exit is never repeated. Returns the last
    output, its seconds, its exit status and the number of attempts."""
    attempts = 0
    while True:
        attempts += 1
        out, seconds, rc = _run_once(args, model, threads, flash_attn)
        if rc != 0 or complete(out) or attempts >= ATTEMPTS:
            return out, seconds, rc, attempts


def _last_row_is(pattern: re.Pattern[str], output: str, n: int) -> bool:
    rows = pattern.findall(output)
    return bool(rows) and int(rows[-1][0]) == n


class _ToolRunBase(TypedDict):
    ok: bool
    attempts: int


class ToolRun(_ToolRunBase, total=False):
    """One llama-perplexity run: its figure (`ppl` and `ppl_se`, or `accuracy` over `n` items)
    and `seconds` when `ok`, else the `reason` in one line."""

    reason: str
    ppl: float
    ppl_se: float
    accuracy: float
    n: int
    seconds: float


def _failure(output: str, rc: int, attempts: int = 1) -> ToolRun:
    lines = [ln.strip() for ln in output.splitlines() if ln.strip()]
    errors = [ln for ln in lines if "error" in ln.lower() or "failed" in ln.lower()]
    last = (errors or lines or ["no output"])[-1]
    status = f"exit {rc}" if rc >= 0 else f"killed by signal {-rc}"
    if rc == 0:
        status += f", no final figure in its output after {attempts} attempt(s)"
    return {"ok": False, "reason": f"llama-perplexity: {status}; last line: {last[:300]}",
            "attempts": attempts}


def perplexity(model: Path, text: Path, n_ctx: int, max_windows: int | None,
               threads: int, batch: int | None = -1) -> ToolRun:
    """llama-perplexity's perplexity of `text` (non-overlapping chunks of n_ctx).

    `batch` is its `-b`: -1 (the default here) one chunk per decode (`-b n_ctx`), None its
    own default (2048, so n_batch / n_ctx chunks per decode), else that many tokens."""
    args = ["-f", str(text), "-c", str(n_ctx), "--chunks", str(max_windows or -1)]
    if batch is not None:
        args += ["-b", str(n_ctx if batch == -1 else batch)]
    out, seconds, rc, attempts = _run(args, model, threads, lambda o: bool(_PPL_RE.search(o)),
                                      WindowContext.FLASH_ATTENTION)
    m = _PPL_RE.search(out)
    if rc != 0 or not m:
        return _failure(out, rc, attempts)
    return {"ok": True, "ppl": float(m[1]), "ppl_se": float(m[2]), "seconds": seconds,
            "attempts": attempts}


def hellaswag(model: Path, items: Sequence[Item], n_ctx: int, threads: int) -> ToolRun:
    """llama-perplexity's HellaSwag accuracy (per-token mean) on exactly `items`."""
    with tempfile.TemporaryDirectory(prefix="epi-xcheck-") as tmp:
        task = write_hellaswag_txt(items, Path(tmp) / "hellaswag.txt")
        out, seconds, rc, attempts = _run(
            ["-f", str(task), "--hellaswag", "--hellaswag-tasks", str(len(items)),
             "-c", str(n_ctx)], model, threads, lambda o: _last_row_is(_HS_RE, o, len(items)))
    if rc != 0 or not _last_row_is(_HS_RE, out, len(items)):
        return _failure(out, rc, attempts)
    rows = _HS_RE.findall(out)
    return {"ok": True, "accuracy": float(rows[-1][1]) / 100, "n": int(rows[-1][0]),
            "seconds": seconds, "attempts": attempts}


def multiple_choice(model: Path, items: Sequence[Item], n_ctx: int, threads: int) -> ToolRun:
    """llama-perplexity's multiple-choice accuracy (per-token mean) on exactly `items`."""
    with tempfile.TemporaryDirectory(prefix="epi-xcheck-") as tmp:
        task = write_multiple_choice_bin(items, Path(tmp) / "tasks.bin")
        n_seq = max(4, max(it.n_choices for it in items))  # one sequence per choice
        out, seconds, rc, attempts = _run(
            ["-bf", str(task), "--multiple-choice", "--multiple-choice-tasks", "0",
             "-c", str(n_ctx), "-np", str(n_seq)], model, threads,
            lambda o: _last_row_is(_MC_RE, o, len(items)))
    if rc != 0 or not _last_row_is(_MC_RE, out, len(items)):
        return _failure(out, rc, attempts)
    rows = _MC_RE.findall(out)
    return {"ok": True, "accuracy": float(rows[-1][1]) / 100, "n": int(rows[-1][0]),
            "seconds": seconds, "attempts": attempts}


def _number(run: Mapping[str, object], key: str) -> float:
    """A figure of a tool run (fresh, or read back from the result store)."""
    return figure(run, key, "llama-perplexity result")


def compare_ppl(ours: float, theirs: Mapping[str, object]) -> dict[str, object]:
    """Our perplexity next to llama-perplexity's, with the verdict."""
    if not theirs.get("ok"):
        return {"ours": ours, "llama_perplexity": None, "rel_diff": None, "agree": None,
                "reason": theirs.get("reason")}
    ppl = _number(theirs, "ppl")
    rel = abs(ours - ppl) / ppl
    return {"ours": ours, "llama_perplexity": ppl, "rel_diff": rel,
            "agree": rel <= PPL_REL_TOLERANCE, "tolerance_rel": PPL_REL_TOLERANCE,
            "tool_seconds": _number(theirs, "seconds")}


def compare_accuracy(ours: float, theirs: Mapping[str, object]) -> dict[str, object]:
    """Our per-token-normalised accuracy next to llama-perplexity's, with the verdict."""
    if not theirs.get("ok"):
        return {"ours": ours, "llama_perplexity": None, "abs_diff": None, "agree": None,
                "reason": theirs.get("reason")}
    accuracy = _number(theirs, "accuracy")
    diff = abs(ours - accuracy)
    return {"ours": ours, "llama_perplexity": accuracy, "abs_diff": diff,
            "agree": diff <= ACC_ABS_TOLERANCE + 1e-9, "tolerance_abs": ACC_ABS_TOLERANCE,
            "metric": "accuracy_token_norm", "tool_seconds": _number(theirs, "seconds")}
