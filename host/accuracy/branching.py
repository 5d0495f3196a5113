"""Score many choices at once: a shared prefix evaluated once, the KV cache branched per choice.

A multiple-choice item is a context followed by several endings. Evaluating every ending as
its own sequence re-reads the context each time (or at best re-computes its logits); here
the context's tokens enter one `llama_decode` carrying the sequence ids of *all* the
item's choices, so their KV cells are computed once and shared (a unified KV cache), and
each ending's tokens follow with the one sequence id of its choice — the KV cache branches
at the end of the context, which is what `llama_memory_seq_cp` after a single-sequence
prefix would do, without a second pass. Logits are requested only for the rows that score a
token (the last context token and the ending tokens but the last), as llama-perplexity
does, instead of for every position.

Several items can go into one decode ("packing", `pack=True`), as llama-perplexity can pack
them; each item keeps its own sequence ids, so attention never crosses items. Packing
changes which rows a token shares its matrix products with, and llama.cpp's CPU kernels then
round slightly differently; it also makes every token attend over the whole (masked) cache
of the pack, and measured slower here, so it is off by default. docs/accuracy.md states the
measured logit differences.

Units: log-probabilities are natural-log (nats).
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from dataclasses import dataclass
from types import ModuleType

import numpy as np

from epi.core.errors import UserError
from epi.core.vocabulary import Word

#: One token of a batch: (token id, position, sequence ids, (group, sequence or -1 for a
#: shared prefix, position) of an output row wanted from it, or None).
Entry = tuple[int, int, tuple[int, ...], tuple[int, int, int] | None]


class FlashAttention(Word):
    """llama.cpp's flash-attention setting of a context (`-fa` of its tools).

    It changes the float32 rounding of attention (a perplexity by ~2e-5 relative on the
    135M model), so it is part of what a stored figure and its cross-check are keyed on."""

    ON = "on"
    OFF = "off"


# llama-perplexity packs at most 32 tasks of 4 endings into one batch (max_seq 128).
MAX_SEQUENCES = 128


@dataclass(frozen=True)
class Group:
    """Sequences sharing a prefix; `starts[k]` is the first scored token of `seqs[k]`."""

    seqs: tuple[tuple[int, ...], ...]
    starts: tuple[int, ...]

    @property
    def prefix_len(self) -> int:
        """Tokens evaluated once for all sequences: their common prefix, never past a start."""
        n = min(self.starts)
        first = self.seqs[0]
        for seq in self.seqs[1:]:
            i = 0
            limit = min(n, len(seq))
            while i < limit and seq[i] == first[i]:
                i += 1
            n = i
        return n

    @property
    def n_tokens(self) -> int:
        """KV cells the group occupies (prefix once, every tail)."""
        c = self.prefix_len
        return c + sum(len(s) - c for s in self.seqs)


#: rows of logits turned into exponentials at a time: a (64, 49 152) float32 scratch is 12.6 MB
LSE_CHUNK_ROWS = 64


def log_sum_exp_rows(rows: np.ndarray, scratch: np.ndarray | None = None) -> np.ndarray:
    """log Σ exp(row) per row (float32 exponentials, pairwise-summed; result in float64).

    Within 2·10⁻⁷ nats of a float64 computation on the 135M model's logits (49 152-token
    vocabulary), and within 10⁻⁶ on any row (float32 exponentials, summed pairwise: a
    relative error of a few ε·log₂ 49 152 at most).

    The rows go through `scratch` (LSE_CHUNK_ROWS rows, kept by the caller) a chunk at a
    time: a fresh temporary the size of all rows (200 MB for four perplexity windows) is new
    memory at every decode, and its page faults made this step 5x slower in place than on
    its own (90 against 16 ms a window, 2-core VM). Each row's figure is the same whatever
    the chunking (numpy reduces every row on its own)."""
    n, width = rows.shape
    if scratch is None or scratch.shape[1] != width:
        scratch = np.empty((min(max(n, 1), LSE_CHUNK_ROWS), width), np.float32)
    out = np.empty(n, np.float64)
    step = scratch.shape[0]
    for lo in range(0, n, step):
        part = rows[lo:lo + step]
        x = scratch[: len(part)]
        mx = part.max(axis=1)
        np.subtract(part, mx[:, None], out=x)
        np.exp(x, out=x)
        out[lo:lo + len(part)] = mx.astype(np.float64) + np.log(x.sum(axis=1).astype(np.float64))
    return out


def flash_attn_type(llama_cpp: ModuleType, setting: FlashAttention) -> int:
    """The llama.cpp context parameter for `setting` (never `auto`: a figure's key must say
    which arithmetic made it, whatever the backend would choose)."""
    if setting == FlashAttention.ON:
        return int(llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED)
    return int(llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED)


class BranchingContext:
    """A second llama.cpp context on an already loaded model, with many sequence ids.

    Flash attention is off, llama-cpp-python's default: turning it on changes every
    benchmark figure (their stored keys, the cross-check and the split scorer's bit-for-bit
    handover with them) for a gain measured on HellaSwag's 10 shots only (docs/bench.md)."""

    FLASH_ATTENTION = FlashAttention.OFF

    def __init__(self, llama_cpp: ModuleType, model: object, n_ctx: int, threads: int,
                 n_seq_max: int = MAX_SEQUENCES, label: str = "model") -> None:
        self._lc = llama_cpp
        self.label = label
        p = llama_cpp.llama_context_default_params()
        p.n_ctx = n_ctx
        p.n_batch = n_ctx
        p.n_ubatch = min(512, n_ctx)
        p.n_seq_max = n_seq_max
        p.n_threads = threads
        p.n_threads_batch = threads
        p.flash_attn_type = flash_attn_type(llama_cpp, self.FLASH_ATTENTION)
        p.kv_unified = True  # one cache shared by all sequences: a shared prefix is stored once
        p.no_perf = True
        self.ctx = llama_cpp.llama_init_from_model(model, p)
        if not self.ctx:
            raise UserError(f"{label}: could not create a llama.cpp context of {n_ctx} tokens "
                            f"with {n_seq_max} sequences")
        self.n_ctx = int(llama_cpp.llama_n_ctx(self.ctx))
        self.n_batch = int(llama_cpp.llama_n_batch(self.ctx))
        self.n_seq_max = n_seq_max
        self.n_vocab = int(llama_cpp.llama_vocab_n_tokens(llama_cpp.llama_model_get_vocab(model)))
        self._mem = llama_cpp.llama_get_memory(self.ctx)
        self._batch = llama_cpp.llama_batch_init(self.n_batch, 0, n_seq_max)
        # a resident prefix (a few-shot context) in the last sequence id, kept between items
        self._prefix: tuple[int, ...] = ()
        self._scratch: np.ndarray | None = None  # log_sum_exp_rows's, kept between decodes

    @property
    def prefix_seq(self) -> int:
        """The sequence id that holds the resident prefix."""
        return self.n_seq_max - 1

    @property
    def prefix(self) -> tuple[int, ...]:
        return self._prefix

    def load_prefix(self, tokens: Sequence[int]) -> None:
        """Decode `tokens` once into the reserved sequence; every later group whose
        sequences start with them copies its cells (llama_memory_seq_cp) instead of
        decoding them again. An empty prefix drops the resident one."""
        self._lc.llama_memory_clear(self._mem, True)
        self._prefix = ()
        if not tokens:
            return
        if len(tokens) >= self.n_ctx:
            raise UserError(f"{self.label}: a shared prefix of {len(tokens)} tokens does not "
                            f"fit the context of {self.n_ctx}")
        entries: list[Entry] = [(t, p, (self.prefix_seq,), None) for p, t in enumerate(tokens)]
        for lo in range(0, len(entries), self.n_batch):
            self._decode(entries[lo:lo + self.n_batch])
        self._prefix = tuple(tokens)

    def _resident(self, group: Group) -> int:
        """How many leading tokens of `group` the resident prefix holds (0: none)."""
        n = len(self._prefix)
        if n and n < min(group.starts) and n <= group.prefix_len and all(
                tuple(seq[:n]) == self._prefix for seq in group.seqs):
            return n
        return 0

    def close(self) -> None:
        """Free the batch and the context."""
        if getattr(self, "ctx", None):
            self._lc.llama_batch_free(self._batch)
            self._lc.llama_free(self.ctx)
            self.ctx = None

    def score(self, groups: Sequence[Group]) -> list[list[np.ndarray]]:
        """log p of every scored token of every sequence of every group, from one KV cache.

        The groups' tokens must fit the context together (see `fits`); the result is
        `[group][sequence] -> array of len(seq) - start log-probabilities`.
        """
        entries: list[Entry] = []
        out: list[list[np.ndarray]] = []
        seq_base = 0
        seq_limit = self.n_seq_max - (1 if self._prefix else 0)
        copies: list[tuple[int, int]] = []  # (sequence id, resident tokens copied into it)
        for g, group in enumerate(groups):
            n = len(group.seqs)
            if seq_base + n > seq_limit:
                raise ValueError("more sequences than the context holds")
            c = group.prefix_len
            ids = tuple(range(seq_base, seq_base + n))
            first = group.seqs[0]
            last_needed = c == min(group.starts)
            resident = self._resident(group)
            copies += [(i, resident) for i in ids if resident]
            for p in range(resident, c):
                want = p == c - 1 and last_needed
                entries.append((first[p], p, ids, (g, -1, p) if want else None))
            for k, seq in enumerate(group.seqs):
                s = group.starts[k]
                if not 1 <= s < len(seq) + 1:
                    raise ValueError(f"start {s} outside 1..{len(seq)}")
                for p in range(c, len(seq)):
                    want = s - 1 <= p <= len(seq) - 2
                    entries.append((seq[p], p, (seq_base + k,), (g, k, p) if want else None))
            out.append([np.empty(len(seq) - group.starts[k]) for k, seq in
                        enumerate(group.seqs)])
            seq_base += n
        if len(entries) + len(self._prefix) > self.n_ctx:
            raise ValueError("groups do not fit the context")
        self._clear_items(seq_base)
        try:
            for seq_id, n_resident in copies:
                self._lc.llama_memory_seq_cp(self._mem, self.prefix_seq, seq_id, 0, n_resident)
            for lo in range(0, len(entries), self.n_batch):
                chunk = entries[lo:lo + self.n_batch]
                self._decode(chunk)
                self._collect(chunk, groups, out)
        finally:
            self._clear_items(seq_base)
        return out

    def _clear_items(self, n_seqs: int) -> None:
        """Drop the items' cells; a resident prefix stays (its cells are shared, so only the
        items' own sequence ids leave them)."""
        if not self._prefix:
            self._lc.llama_memory_clear(self._mem, True)
            return
        for seq in range(n_seqs):
            self._lc.llama_memory_seq_rm(self._mem, seq, -1, -1)

    def fits(self, groups: Sequence[Group]) -> bool:
        """True when the groups' tokens and sequences fit one KV cache together (beside a
        resident prefix, stored once)."""
        seqs = self.n_seq_max - (1 if self._prefix else 0)
        return (sum(g.n_tokens - self._resident(g) for g in groups) + len(self._prefix)
                <= self.n_ctx and sum(len(g.seqs) for g in groups) <= seqs)

    def _decode(self, chunk: Sequence[Entry]) -> None:
        b = self._batch
        for i, (tok, pos, ids, want) in enumerate(chunk):
            b.token[i] = tok
            b.pos[i] = pos
            b.n_seq_id[i] = len(ids)
            row = b.seq_id[i]
            for j, s in enumerate(ids):
                row[j] = s
            b.logits[i] = want is not None
        b.n_tokens = len(chunk)
        rc = self._lc.llama_decode(self.ctx, b)
        if rc != 0:
            raise UserError(f"{self.label}: llama_decode failed (code {rc})")

    def _collect(self, chunk: Sequence[Entry],
                 groups: Sequence[Group], out: list[list[np.ndarray]]) -> None:
        """Turn this decode's output rows into log-probabilities of the tokens they predict."""
        wants = [w for _, _, _, w in chunk if w is not None]
        if not wants:
            return
        ptr = self._lc.llama_get_logits(self.ctx)
        rows = np.ctypeslib.as_array(
            ctypes.cast(ptr, ctypes.POINTER(ctypes.c_float)), shape=(len(wants), self.n_vocab))
        if self._scratch is None:
            self._scratch = np.empty((LSE_CHUNK_ROWS, self.n_vocab), np.float32)
        lse = log_sum_exp_rows(rows, self._scratch)
        # every output row predicts the next token of its sequence(s); a shared prefix's last
        # row predicts each choice's own first token
        row_idx: list[int] = []
        targets: list[int] = []
        dest: list[tuple[int, int, int]] = []
        for r, (g, k, p) in enumerate(wants):
            group = groups[g]
            for kk in (range(len(group.seqs)) if k < 0 else (k,)):
                seq, s = group.seqs[kk], group.starts[kk]
                if s - 1 <= p <= len(seq) - 2:
                    row_idx.append(r)
                    targets.append(seq[p + 1])
                    dest.append((g, kk, p + 1 - s))
        ri = np.asarray(row_idx)
        lp = rows[ri, np.asarray(targets)].astype(np.float64) - lse[ri]
        for (g, k, j), v in zip(dest, lp.tolist(), strict=True):
            out[g][k][j] = v
