"""Perplexity of a text file: token-level cross-entropy over windows of a stated size.

The text (UTF-8, one trailing newline dropped, as llama-perplexity reads `-f`) is tokenized
once with BOS when the model adds one. Windows of `n_ctx` tokens start every `stride` tokens;
each window's first token is replaced by BOS when the model adds one, and the last
`m = min(stride, n_ctx − ⌊n_ctx/2⌋ − 1)` tokens of each window are scored. With
`stride = n_ctx` (the default) this is exactly llama-perplexity's rule — non-overlapping
chunks, second half scored, so every scored token sees at least n_ctx/2 tokens of context;
with `stride ≤ n_ctx/2` it is the usual sliding window, every token after the first window
scored once with at least `n_ctx − stride` tokens before it.

Windows are evaluated `n_seq = max(1, batch_tokens // n_ctx)` at a time, each under its own
sequence id with its own KV stream, in one llama.cpp decode call: llama-perplexity's rule,
and by default its default batch of 2048 tokens (4 windows of 512 per call). The perplexity
is bit-identical to one window per call (SmolLM2-135M, 8 windows of 512: 40.7863233277 both
ways) and the CPU time within noise of it (2.20 against 2.26 CPU s per window, 4 runs each on
the loaded 2-core VM, 2026-11-29): llama.cpp still computes in micro-batches of 512 tokens,
one window each, as llama-perplexity does, so the two tools do the same work per window.
Logits are requested only for the rows that predict a scored token, as llama-perplexity
requests them; the KV cache is cleared before each batch of windows, as llama-perplexity
clears it per batch of chunks.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from epi.core.errors import UserError
from host.accuracy.branching import Group
from host.accuracy.scorer import Scorer
from host.accuracy.stats import perplexity_stats
from host.accuracy.window_context import DEFAULT_BATCH_TOKENS, WindowContext, windows_per_decode


def read_text(path: Path) -> str:
    """The text llama-perplexity would read from `-f path`."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"{path}: perplexity text file not found")
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UserError(f"{path}: not UTF-8 text (byte {exc.start})") from exc
    if text.endswith("\n"):
        text = text[:-1]
    if not text.strip():
        raise UserError(f"{path}: perplexity text file is empty")
    return text


def scored_per_window(n_ctx: int, stride: int) -> int:
    """Tokens scored at the end of each window (see module docstring)."""
    return min(stride, n_ctx - n_ctx // 2 - 1)


def window_starts(n_tokens: int, n_ctx: int, stride: int, max_windows: int | None) -> list[int]:
    """Start index of every window that fits, at most `max_windows` (None or 0: all)."""
    if n_ctx < 4:
        raise UserError(f"--ctx: context of {n_ctx} tokens is too small (at least 4)")
    if not 1 <= stride <= n_ctx:
        raise UserError(f"--stride: must be between 1 and the context ({n_ctx}), got {stride}")
    if n_tokens < n_ctx:
        raise UserError(
            f"perplexity text has {n_tokens} tokens, fewer than one window of --ctx {n_ctx}"
        )
    count = (n_tokens - n_ctx) // stride + 1
    if max_windows:
        count = min(count, max_windows)
    return [k * stride for k in range(count)]


def perplexity_tokens(
    scorer: Scorer,
    tokens: Sequence[int],
    n_ctx: int,
    stride: int,
    max_windows: int | None,
    progress: Callable[[int], None] | None = None,
    batch_tokens: int | None = DEFAULT_BATCH_TOKENS,
) -> dict[str, Any]:
    """Perplexity and its standard error over the windows of `tokens`.

    `batch_tokens` sets how many windows share one decode call (llama-perplexity's `-b`, and
    its default, window_context.DEFAULT_BATCH_TOKENS); None or a value below `n_ctx` means
    one window per call."""
    m = scored_per_window(n_ctx, stride)
    nll_sum = 0.0
    nll2_sum = 0.0
    count = 0
    starts = window_starts(len(tokens), n_ctx, stride, max_windows)
    n_seq = min(windows_per_decode(n_ctx, batch_tokens or n_ctx), len(starts))
    ctx = scorer.window_context(n_ctx, n_seq)
    try:
        for lo in range(0, len(starts), n_seq):
            groups = []
            for s in starts[lo:lo + n_seq]:
                window = list(tokens[s : s + n_ctx])
                if scorer.add_bos:
                    window[0] = scorer.bos
                groups.append(Group((tuple(window),), (n_ctx - m,)))
            # each batch of windows from scratch (score clears the KV cache)
            for scored in ctx.score(groups):
                nll = -scored[0]
                nll_sum += float(nll.sum())
                nll2_sum += float(np.square(nll).sum())
                count += len(nll)
            if progress is not None:
                progress(len(groups))
    finally:
        ctx.close()
    out = perplexity_stats(nll_sum, nll2_sum, count)
    out.update(n_tokens_scored=count, n_windows=len(starts))
    return out


def settings(n_ctx: int, stride: int, max_windows: int | None) -> dict[str, Any]:
    """The settings block stated with every perplexity."""
    return {
        "n_ctx": n_ctx,
        "stride": stride,
        "max_windows": max_windows or None,
        "scored_per_window": scored_per_window(n_ctx, stride),
        "flash_attn": str(WindowContext.FLASH_ATTENTION),
        "rule": "windows of n_ctx tokens every stride tokens, first token -> BOS when the "
        "model adds BOS, last scored_per_window tokens of each window scored",
    }
