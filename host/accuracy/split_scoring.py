"""Accuracy of a split configuration: the context on the prefill model, the rest on the decode one.

A split configuration (host/run/split.py) prefills on one quantization of a model and decodes on
another. Its accuracy is scored the way a split run generates:

- an item's context (the few-shot prefix, the question, and for a partial item such as
  WinoGrande each choice's own context) is decoded on the **prefill** model, and the logits of
  the context's last token — which predict the continuation's first token — are the prefill
  model's, as a split run samples its first generated token from the prefill model;
- the KV cells of every sequence are then handed over to a context of the **decode** model with
  llama.cpp's sequence-state API (`llama_state_seq_get_data` / `llama_state_seq_set_data` for
  all sequences at once, seq id -1, so cells shared by an item's choices stay shared);
- every continuation token is decoded on the decode model, which computes the logits of every
  later scored token.

Perplexity windows follow the same rule: the window's unscored first part on the prefill model
(its last row predicts the first scored token), the scored part decoded on the decode model.

With one GGUF for both phases the figures equal the unsplit scorer's (tested); with two maps of
one base model both sets of weights and both KV caches are resident at once.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

import numpy as np

from epi.core.errors import UserError
from host.accuracy.branching import BranchingContext, Entry, Group
from host.accuracy.scorer import Scorer
from host.accuracy.window_context import WindowContext

#: every sequence of the context at once (llama.cpp's "all sequences" seq id)
ALL_SEQUENCES = -1
HANDOVER = "llama_state_seq_get_data/llama_state_seq_set_data (all sequences)"
SEMANTICS = ("context (and the prediction of the continuation's first token) on the prefill "
             "model; KV cells handed over; continuation decoded and scored on the decode model")


def read_state(lc: ModuleType, ctx: object) -> bytes:
    """Every sequence's KV cells of `ctx`, as llama.cpp serializes them."""
    size = int(lc.llama_state_seq_get_size(ctx, ALL_SEQUENCES))
    buf = (ctypes.c_uint8 * size)()
    n = int(lc.llama_state_seq_get_data(ctx, buf, size, ALL_SEQUENCES))
    if n != size:
        raise RuntimeError(f"llama_state_seq_get_data wrote {n} of {size} bytes")
    return bytes(buf)


def write_state(lc: ModuleType, ctx: object, state: bytes) -> None:
    """Replace `ctx`'s KV cells by `state` (llama.cpp clears the cache first)."""
    buf = (ctypes.c_uint8 * len(state)).from_buffer_copy(state)
    n = int(lc.llama_state_seq_set_data(ctx, buf, len(state), ALL_SEQUENCES))
    if n != len(state):
        raise UserError(f"split: the decode context read {n} of {len(state)} bytes of the "
                        "handed-over state (the two models' KV layouts differ)")


def score_across(pre: BranchingContext, dec: BranchingContext,
                 groups: Sequence[Group]) -> list[list[np.ndarray]]:
    """`BranchingContext.score` with the handover: same groups, same result shape.

    Tokens before a sequence's first scored index go to `pre` (its resident prefix, if any, is
    copied as the unsplit scorer copies it); the state of every sequence is handed to `dec`,
    which decodes the scored tokens.
    """
    # per group: its tokens on the prefill model, then its continuation tokens on the decode one
    pre_parts: list[list[Entry]] = []
    dec_parts: list[list[Entry]] = []
    out: list[list[np.ndarray]] = []
    seq_base = 0
    seq_limit = pre.n_seq_max - (1 if pre.prefix else 0)
    copies: list[tuple[int, int]] = []
    for g, group in enumerate(groups):
        n = len(group.seqs)
        if seq_base + n > seq_limit:
            raise ValueError("more sequences than the context holds")
        c = group.prefix_len
        ids = tuple(range(seq_base, seq_base + n))
        first = group.seqs[0]
        last_needed = c == min(group.starts)
        resident = pre._resident(group)
        copies += [(i, resident) for i in ids if resident]
        pre_entries: list[Entry] = []
        dec_entries: list[Entry] = []
        for p in range(resident, c):
            want = p == c - 1 and last_needed
            pre_entries.append((first[p], p, ids, (g, -1, p) if want else None))
        for k, seq in enumerate(group.seqs):
            s = group.starts[k]
            if not 1 <= s < len(seq) + 1:
                raise ValueError(f"start {s} outside 1..{len(seq)}")
            for p in range(c, len(seq)):
                want = s - 1 <= p <= len(seq) - 2
                entry = (seq[p], p, (seq_base + k,), (g, k, p) if want else None)
                (pre_entries if p < s else dec_entries).append(entry)
        out.append([np.empty(len(seq) - group.starts[k]) for k, seq in enumerate(group.seqs)])
        _matrix_path(pre_entries, dec_entries)
        pre_parts.append(pre_entries)
        dec_parts.append(dec_entries)
        seq_base += n
    if sum(map(len, pre_parts + dec_parts)) + len(pre.prefix) > pre.n_ctx:
        raise ValueError("groups do not fit the context")
    lc = pre._lc
    pre._clear_items(seq_base)
    lc.llama_memory_clear(dec._mem, True)
    try:
        for seq_id, n_resident in copies:
            lc.llama_memory_seq_cp(pre._mem, pre.prefix_seq, seq_id, 0, n_resident)
        for ctx, parts in ((pre, pre_parts), (dec, dec_parts)):
            if ctx is dec:
                write_state(lc, dec.ctx, read_state(lc, pre.ctx))
            # one group (an item, a perplexity window) per decode call: llama.cpp then cuts
            # its micro-batches as the unsplit scorer's one-window calls do, so the figures
            # stay the unsplit ones with one map for both phases (several windows in one
            # call would share micro-batches, which round differently)
            for entries in parts:
                for lo in range(0, len(entries), ctx.n_batch):
                    chunk = entries[lo:lo + ctx.n_batch]
                    ctx._decode(chunk)
                    ctx._collect(chunk, groups, out)
    finally:
        pre._clear_items(seq_base)
        lc.llama_memory_clear(dec._mem, True)
    return out


def _matrix_path(pre_entries: list[Entry], dec_entries: Sequence[Entry]) -> None:
    """Keep a lone prefill output row on the kernels the unsplit batch uses.

    llama.cpp's CPU backend computes a single output row (one vector) on another kernel than
    several (a matrix), and the two round differently (measured: up to 5e-5 nats on the tiny
    model's first continuation token). The unsplit scorer computes the context's last row in
    one batch with the continuation rows; when the prefill part alone would output one row
    while the whole would output several, one more context row is requested — it predicts no
    scored token, so `_collect` drops it — and the row computed is the unsplit one, bit for bit.
    """
    wanted = [i for i, e in enumerate(pre_entries) if e[3] is not None]
    if len(wanted) != 1 or not any(e[3] is not None for e in dec_entries) or wanted[0] == 0:
        return
    _, last_pos, last_ids, want = pre_entries[wanted[0]]
    tok, pos, ids, _ = pre_entries[wanted[0] - 1]
    if want is None or ids != last_ids or pos != last_pos - 1:
        return  # not the same sequence's previous token: leave the batch as it is
    pre_entries[wanted[0] - 1] = (tok, pos, ids, (want[0], want[1], pos))


class _HandsOver(BranchingContext):
    """A prefill-model context that scores through `score_across` with its paired
    decode-model context `decode` (set by the subclass), and closes both."""

    decode: BranchingContext

    def score(self, groups: Sequence[Group]) -> list[list[np.ndarray]]:
        return score_across(self, self.decode, groups)

    def close(self) -> None:
        self.decode.close()
        super().close()


class SplitBranching(_HandsOver):
    """The prefill model's many-sequence context (few-shot prefix resident there), paired with
    a decode-model context of the same shape that scores the continuations."""

    def __init__(self, llama_cpp: ModuleType, prefill_model: object, decode_model: object,
                 n_ctx: int, threads: int, label: str) -> None:
        super().__init__(llama_cpp, prefill_model, n_ctx, threads, label=label)
        self.decode = BranchingContext(llama_cpp, decode_model, n_ctx, threads,
                                       label=f"{label} (decode)")


class SplitWindows(_HandsOver, WindowContext):
    """Perplexity windows: the unscored part on the prefill model, the scored part on the
    decode model (one stream per window on both)."""

    def __init__(self, llama_cpp: ModuleType, prefill_model: object, decode_model: object,
                 window: int, n_seq: int, threads: int, label: str) -> None:
        super().__init__(llama_cpp, prefill_model, window, n_seq, threads, label=label)
        self.decode = WindowContext(llama_cpp, decode_model, window, n_seq, threads,
                                    label=f"{label} (decode)")


class SplitScorer(Scorer):
    """A Scorer on the prefill model (tokenizer, few-shot prefix) whose contexts hand every
    item over to the decode model; both GGUFs stay loaded while it lives."""

    def __init__(self, prefill_path: Path, decode_path: Path, n_ctx: int, threads: int,
                 n_batch: int = 512) -> None:
        check_split(prefill_path, decode_path)
        super().__init__(prefill_path, n_ctx, threads, n_batch)
        try:
            self.decode_scorer = Scorer(decode_path, n_ctx, threads, n_batch)
        except BaseException:
            super().close()
            raise
        self.decode_path = Path(decode_path)
        if _vocab(self) != _vocab(self.decode_scorer):
            self.close()
            raise UserError(f"--decode-model: {decode_path} is not a quantization of the base "
                            f"model of {prefill_path} (their vocabularies differ)")

    def logprobs(self, seq: Sequence[int], start: int) -> np.ndarray:
        """Not offered: the single-sequence path has no handover (use the contexts)."""
        raise NotImplementedError("a split scorer scores through branching()/window_context()")

    def branching(self) -> BranchingContext:
        if self._branching is None:
            self._branching = SplitBranching(self._llama_cpp, self.llm.model,
                                             self.decode_scorer.llm.model, self.n_ctx,
                                             self.threads, label=str(self.path))
        return self._branching

    def window_context(self, window: int, n_seq: int) -> WindowContext:
        return SplitWindows(self._llama_cpp, self.llm.model, self.decode_scorer.llm.model,
                            window, n_seq, self.threads, label=str(self.path))

    def close(self) -> None:
        decode = getattr(self, "decode_scorer", None)
        if decode is not None:
            decode.close()
            del self.decode_scorer
        super().close()


def _vocab(scorer: Scorer) -> list[bytes]:
    lc = scorer._llama_cpp
    return [lc.llama_vocab_get_text(scorer._vocab, i) for i in range(scorer.n_vocab)]


def check_split(prefill: Path, decode: Path) -> None:
    """Both files are GGUFs of one base model (architecture, layers, parameters), else one
    line naming the option and the difference."""
    from host.gguf_io.file import check_gguf
    from host.run.split import check_same_base

    check_gguf(Path(prefill))
    if not Path(decode).is_file():
        raise UserError(f"--decode-model: {decode}: file not found")
    try:
        check_gguf(Path(decode))
        check_same_base(Path(prefill), Path(decode))
    except UserError as exc:
        raise UserError(f"--decode-model: {exc}") from None
