"""A loaded GGUF model that returns per-token log-probabilities from llama.cpp logits.

llama-cpp-python's `Llama(logits_all=True)` keeps the logits of every evaluated position in
`Llama.scores`; `eval` continues from `Llama.n_tokens`, so a sequence that shares a prefix
with what was evaluated last (the context of a multiple-choice item) reuses its KV cache and
logits instead of recomputing them; perplexity windows use this path.

Multiple-choice items use `branching()`: a second context on the same loaded model with
many sequence ids, where an item's context is evaluated once and the KV cache branches per
ending (host/accuracy/branching.py).
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from epi.core.errors import UserError
from host.accuracy.branching import BranchingContext
from host.accuracy.llama_load import import_llama_cpp
from host.accuracy.window_context import WindowContext
from host.gguf_io.file import check_gguf

GPU_LAYERS_ENV = "EPI_GPU_LAYERS"


def gpu_layers() -> int:
    """Layers to offload to a GPU (`$EPI_GPU_LAYERS`, -1 = all; default 0: the CPU). Only a
    GPU build of llama.cpp uses it (docs/accuracy.md, "A GPU host as a worker")."""
    text = os.environ.get(GPU_LAYERS_ENV, "0").strip() or "0"
    try:
        return int(text)
    except ValueError:
        raise UserError(f"{GPU_LAYERS_ENV}: expected an integer (-1 = all layers), "
                        f"got {text!r}") from None


def common_prefix_len(a: Sequence[int], b: Sequence[int]) -> int:
    """Number of leading tokens two sequences share."""
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


def log_softmax_at(rows: np.ndarray, targets: Sequence[int]) -> np.ndarray:
    """log p(target_j | row_j) for logits rows, in float64."""
    x = rows.astype(np.float64, copy=False)
    mx = x.max(axis=1)
    lse = mx + np.log(np.exp(x - mx[:, None]).sum(axis=1))
    return x[np.arange(len(targets)), np.asarray(targets)] - lse


class Scorer:
    """A model loaded once with a fixed context size; scores token sequences."""

    def __init__(self, model_path: Path, n_ctx: int, threads: int, n_batch: int = 512) -> None:
        check_gguf(model_path)
        self.path = Path(model_path)
        self.threads = threads
        self._branching: BranchingContext | None = None
        try:
            llama_cpp = import_llama_cpp()  # OpenMP threads that sleep under contention
        except ImportError as exc:
            raise UserError(f"llama-cpp-python is not installed ({exc}); run `make setup`") from exc
        self._llama_cpp = llama_cpp
        try:
            self.llm = llama_cpp.Llama(
                model_path=str(model_path),
                n_ctx=n_ctx,
                n_batch=min(n_batch, n_ctx),
                n_threads=threads,
                n_threads_batch=threads,
                logits_all=True,
                n_gpu_layers=gpu_layers(),
                verbose=False,
            )
        except Exception as exc:  # llama-cpp-python raises ValueError/RuntimeError/OSError
            text = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise UserError(f"{model_path}: model failed to load ({text})") from exc
        self.n_ctx = int(self.llm.n_ctx())
        self.n_vocab = int(self.llm.n_vocab())
        self._vocab = llama_cpp.llama_model_get_vocab(self.llm.model)
        self.add_bos = bool(llama_cpp.llama_vocab_get_add_bos(self._vocab))
        self.bos = int(llama_cpp.llama_vocab_bos(self._vocab))
        self._current: list[int] = []
        self._piece_len: dict[int, int] = {}

    def tokenize(self, text: str) -> list[int]:
        """Tokens of `text` with BOS when the model adds one (llama.cpp's common_tokenize)."""
        return self.llm.tokenize(text.encode("utf-8"), add_bos=True, special=False)

    def tokenize_after(self, head: tuple[list[int], str] | None, text: str) -> list[int]:
        """`tokenize(text)` for a text that starts with a known head: the head's tokens
        (`head` = (tokens, the text they cover), checked by the caller to equal the full
        tokenization's start) and the rest tokenized alone — a long few-shot prefix is then
        tokenized once, not once per choice of every item."""
        if head is None or not text.startswith(head[1]):
            return self.tokenize(text)
        tail = text[len(head[1]):].encode("utf-8")
        return head[0] + self.llm.tokenize(tail, add_bos=False, special=False)

    def piece_bytes(self, token: int) -> int:
        """UTF-8 byte length of one token's text."""
        n = self._piece_len.get(token)
        if n is None:
            buf = ctypes.create_string_buffer(256)
            n = self._llama_cpp.llama_token_to_piece(self._vocab, token, buf, 256, 0, False)
            n = abs(int(n))
            self._piece_len[token] = n
        return n

    def _evaluate(self, seq: Sequence[int]) -> None:
        """Make `scores[:len(seq)]` hold the logits of `seq`, reusing the shared prefix."""
        n = len(seq)
        if n > self.n_ctx:
            raise UserError(
                f"{self.path}: a sequence of {n} tokens does not fit the context of {self.n_ctx}"
            )
        lcp = common_prefix_len(self._current, seq)
        if lcp >= n:
            return
        self.llm.n_tokens = lcp
        try:
            self.llm.eval(list(seq[lcp:]))
        except RuntimeError as exc:
            self._current = []
            raise UserError(f"{self.path}: llama_decode failed ({exc})") from exc
        self._current = list(seq)

    def reset(self) -> None:
        """Forget the evaluated tokens: the next sequence is evaluated from its first token.

        Called at the start of every item and window, so a figure never depends on what was
        evaluated before it.
        """
        self.llm.reset()
        self._current = []

    def logprobs(self, seq: Sequence[int], start: int) -> np.ndarray:
        """log p(seq[j] | seq[:j]) for j = start … len(seq) − 1 (start ≥ 1)."""
        if not 1 <= start <= len(seq):
            raise ValueError(f"start {start} outside 1..{len(seq)}")
        self._evaluate(seq)
        rows = self.llm.scores[start - 1 : len(seq) - 1]
        return log_softmax_at(rows, seq[start:])

    def branching(self) -> BranchingContext:
        """The many-sequence context for multiple-choice scoring (created on first use)."""
        if self._branching is None:
            self._branching = BranchingContext(self._llama_cpp, self.llm.model, self.n_ctx,
                                               self.threads, label=str(self.path))
        return self._branching

    def window_context(self, window: int, n_seq: int) -> WindowContext:
        """A context evaluating `n_seq` perplexity windows of `window` tokens per decode call
        (the caller closes it)."""
        return WindowContext(self._llama_cpp, self.llm.model, window, n_seq, self.threads,
                             label=str(self.path))

    def close(self) -> None:
        """Free the model and contexts now (instead of at garbage collection)."""
        branching: BranchingContext | None = getattr(self, "_branching", None)
        if branching is not None:
            branching.close()
            self._branching = None
        llm = getattr(self, "llm", None)
        if llm is not None:
            llm.close()
            del self.llm  # freed; a second close() finds no attribute

    def __enter__(self) -> Scorer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

