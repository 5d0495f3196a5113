"""A llama.cpp context that evaluates several perplexity windows in one decode call.

llama-perplexity puts `n_seq = n_batch / n_ctx` windows into each `llama_decode`, each under
its own sequence id with its own KV stream (`kv_unified` off), so every window attends only
over its own `n_ctx` cells. The branching context used for multiple choice shares one unified
cache between sequences (a shared prefix is stored once); for windows that share nothing a
unified cache would make every token attend over all `n_seq · n_ctx` masked cells, so this
context keeps the streams apart. Scoring, decoding and output collection are the branching
context's: only the context's shape differs.

Flash attention is on, as llama-perplexity runs by default: its `-fa auto` resolves to on for
the CPU backend, so its default figure is the flash-attention one (40.7854 against 40.7863
with it off, on the demo's Q4_1 model), and the windows measured faster with it
(docs/bench.md).
"""

from __future__ import annotations

from types import ModuleType

import numpy as np

from epi.core.errors import UserError
from host.accuracy.branching import BranchingContext, FlashAttention, flash_attn_type

#: llama-perplexity's default logical batch (tokens per decode call), which sets its n_seq.
DEFAULT_BATCH_TOKENS = 2048


def windows_per_decode(window: int, batch_tokens: int) -> int:
    """llama-perplexity's rule: n_seq = max(1, n_batch / n_ctx) windows per decode call."""
    return max(1, batch_tokens // window)


class WindowContext(BranchingContext):
    """`n_seq` streams of `window` tokens each, evaluated in one decode of n_seq·window tokens."""

    FLASH_ATTENTION = FlashAttention.ON

    def __init__(self, llama_cpp: ModuleType, model: object, window: int, n_seq: int,
                 threads: int, label: str = "model") -> None:
        self._lc = llama_cpp
        self.label = label
        p = llama_cpp.llama_context_default_params()
        p.n_ctx = window * n_seq
        p.n_batch = window * n_seq
        p.n_ubatch = min(512, window * n_seq)
        p.n_seq_max = n_seq
        p.n_threads = threads
        p.n_threads_batch = threads
        p.flash_attn_type = flash_attn_type(llama_cpp, self.FLASH_ATTENTION)
        p.kv_unified = False  # one KV stream per window: attention never spans windows
        p.no_perf = True
        self.ctx = llama_cpp.llama_init_from_model(model, p)
        if not self.ctx:
            raise UserError(f"{label}: could not create a llama.cpp context of {n_seq} "
                            f"windows of {window} tokens")
        self.n_ctx = int(llama_cpp.llama_n_ctx(self.ctx))
        self.n_batch = int(llama_cpp.llama_n_batch(self.ctx))
        self.n_seq_max = n_seq
        self.n_vocab = int(llama_cpp.llama_vocab_n_tokens(llama_cpp.llama_model_get_vocab(model)))
        self._mem = llama_cpp.llama_get_memory(self.ctx)
        self._batch = llama_cpp.llama_batch_init(self.n_batch, 0, n_seq)
        self._prefix: tuple[int, ...] = ()  # no resident prefix: each window is its own
        self._scratch: np.ndarray | None = None  # log_sum_exp_rows's, kept between decodes
