"""Per-phase precision: prefill on one quantization map, decode on another, as one configuration.

A split configuration names two GGUFs of the same base model (`SplitConfig`). Both are loaded
in one process, each with its own llama.cpp context of the same size and the same KV-cache type
(llama.cpp's default, F16, for both), so both sets of weights and both KV caches are resident at
once (`resident_bytes`).

One request (`timed_split_request`):
  1. prefill: the prompt is decoded on the prefill model and token 0 is sampled from its logits
     (token 0's stamp ends prefill, exactly as in an unsplit request);
  2. handover: the sequence's state (its KV cells) is read from the prefill context with
     `llama_state_seq_get_data` and written into the freshly cleared decode context with
     `llama_state_seq_set_data`; this interval is stamped (`handover_start`/`handover_end`) and
     lies inside the request, so its time and energy count in the request;
  3. decode: token 0 and every later token are evaluated on the decode model.

Sampling is the runner's (greedy, end-of-generation tokens banned: `EpiLlama._init_sampler`),
driven here through llama.cpp's C API so the two contexts can share one sequence. With one map
for both phases the decode context holds byte-for-byte the cells the prefill context computed,
so the tokens and logits equal the unsplit request's.

Distributed runs over RPC are refused: a sequence's state lives in the KV cells of every node
holding a layer, and the handover would have to move the cells between two placements at once.
"""

from __future__ import annotations

import ctypes
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from epi.core.errors import UserError
from epi.formats.json_types import JSON
from host.run.engine import GenerationModel, LoadedModel, Timing, load_model
from host.run.perf_counters import RequestCounters

PHASES = ("prefill", "decode")
SEQ_ID = 0


@dataclass(frozen=True)
class SplitConfig:
    """One split configuration: `{"config_id": ID, "phases": {"prefill": MAP, "decode": MAP}}`.

    A MAP is a map id (a study resolves it to the map's GGUF) or, for `epi run`, a GGUF path.
    """

    config_id: str
    prefill: str
    decode: str

    def to_json(self) -> dict[str, JSON]:
        return {"config_id": self.config_id,
                "phases": {"prefill": self.prefill, "decode": self.decode}}

    @classmethod
    def from_json(cls, data: object, where: str = "split configuration") -> SplitConfig:
        """Parse and check the form; one-line UserError naming the field otherwise."""
        if not isinstance(data, dict):
            raise UserError(f"{where}: must be an object with config_id and phases")
        cid = data.get("config_id")
        if not isinstance(cid, str) or not cid:
            raise UserError(f"{where}: config_id must be a non-empty string, not {cid!r}")
        phases = data.get("phases")
        if not isinstance(phases, dict):
            raise UserError(f"{where} {cid!r}: phases must be an object "
                            '{"prefill": MAP, "decode": MAP}')
        extra = sorted(set(phases) - set(PHASES))
        if extra:
            raise UserError(f"{where} {cid!r}: phases has unknown phase(s) {extra}; "
                            "known: prefill, decode")
        maps = []
        for phase in PHASES:
            value = phases.get(phase)
            if not isinstance(value, str) or not value:
                raise UserError(f"{where} {cid!r}: phases.{phase} must name a map, not {value!r}")
            maps.append(value)
        extra_keys = sorted(set(data) - {"config_id", "phases"})
        if extra_keys:
            raise UserError(f"{where} {cid!r}: unknown field(s) {extra_keys}")
        return cls(cid, maps[0], maps[1])

    @property
    def same_map(self) -> bool:
        return self.prefill == self.decode


def check_same_base(prefill: Path, decode: Path) -> None:
    """Refuse two GGUFs that are not quantizations of one base model (one line).

    Same architecture, layer count and parameter count: what llama.cpp's sequence state needs
    to fit (one KV cell layout per layer). The vocabularies are compared once both are loaded
    (`load_split`).
    """
    from host.quant.model_info import model_facts

    a, b = model_facts(prefill, None), model_facts(decode, None)
    for name in ("architecture", "n_layers", "n_params"):
        va, vb = getattr(a, name), getattr(b, name)
        if va != vb:
            raise UserError(
                f"split: prefill map {prefill.name} and decode map {decode.name} are not "
                f"quantizations of one base model ({name} {va} vs {vb})")


def refuse_rpc(n_workers: int) -> None:
    """A split over RPC workers is refused with the reason (see the module docstring)."""
    if n_workers:
        raise UserError(
            "split: a split configuration runs on one node only; over RPC the sequence's KV "
            "cells are spread across the workers and llama.cpp's sequence-state handover "
            "would have to move them between two placements (drop --workers)")


@dataclass
class SplitModels:
    """Both phases' models, loaded in one process."""

    prefill: LoadedModel
    decode: LoadedModel
    resident_bytes: int  # both GGUFs' weights + both KV caches (contexts of n_ctx cells)
    kv_bytes_per_context: int


def load_split(prefill: Path, decode: Path, *, threads: int, n_ctx: int, seed: int = 0,
               log_path: Path | None = None, prefill_loaded: LoadedModel | None = None
               ) -> SplitModels:
    """Load both GGUFs (same n_ctx, same default KV type) after checking they share a base;
    `prefill_loaded`: the prefill model already loaded with these settings (the runner's)."""
    check_same_base(prefill, decode)
    a = prefill_loaded or load_model(prefill, threads=threads, n_ctx=n_ctx, seed=seed,
                                     log_path=log_path)
    b = load_model(decode, threads=threads, n_ctx=n_ctx, seed=seed, log_path=log_path)
    if _vocab(a.llm) != _vocab(b.llm):
        raise UserError(f"split: prefill map {prefill.name} and decode map {decode.name} are "
                        "not quantizations of one base model (their vocabularies differ)")
    weights = prefill.stat().st_size + decode.stat().st_size
    kv = _kv_bytes_allocated(a.llm)
    return SplitModels(a, b, weights + 2 * kv, kv)


def _vocab(llm: GenerationModel) -> list[bytes]:
    import llama_cpp

    vocab = llama_cpp.llama_model_get_vocab(llm.model)
    return [llama_cpp.llama_vocab_get_text(vocab, i) for i in range(llm.n_vocab())]


def _kv_bytes_allocated(llm: GenerationModel) -> int:
    """The KV cache's allocated bytes: 2 (K and V) × layers × n_ctx × n_embd_kv × 2 bytes (F16,
    llama.cpp's default cache type, the one both contexts use)."""
    import llama_cpp

    model = llm.model
    n_layer = int(llama_cpp.llama_model_n_layer(model))
    n_embd = int(llama_cpp.llama_model_n_embd(model))
    n_head = int(llama_cpp.llama_model_n_head(model))
    n_head_kv = int(llama_cpp.llama_model_n_head_kv(model))
    n_ctx = int(llama_cpp.llama_n_ctx(llm.ctx))
    n_embd_kv = n_embd // n_head * n_head_kv
    return 2 * n_layer * n_ctx * n_embd_kv * 2


# --- the C-level loop -------------------------------------------------------------------------

def clear(llm: GenerationModel) -> None:
    """Empty the context's KV cache (data too) and the Python wrapper's token count."""
    import llama_cpp

    llama_cpp.llama_memory_clear(llama_cpp.llama_get_memory(llm.ctx), True)
    llm.n_tokens = 0


def decode_tokens(llm: GenerationModel, tokens: Sequence[int]) -> None:
    """Decode `tokens` at the sequence's next positions, in chunks of the context's n_batch."""
    import llama_cpp

    n_batch = int(llama_cpp.llama_n_batch(llm.ctx))
    for i in range(0, len(tokens), n_batch):
        chunk = list(tokens[i:i + n_batch])
        arr = (llama_cpp.llama_token * len(chunk))(*chunk)
        rc = llama_cpp.llama_decode(llm.ctx, llama_cpp.llama_batch_get_one(arr, len(chunk)))
        if rc != 0:
            raise RuntimeError(f"llama_decode returned {rc}")


def last_logits(llm: GenerationModel) -> list[float]:
    """A copy of the logits of the last decoded token."""
    import llama_cpp

    ptr = llama_cpp.llama_get_logits_ith(llm.ctx, -1)
    return list(ptr[:llm.n_vocab()])


class Sampler:
    """The runner's sampler (greedy, end-of-generation banned) on one model's context."""

    def __init__(self, llm: GenerationModel) -> None:
        self.llm = llm
        self._sampler = llm._init_sampler()  # kept alive: llama.cpp holds no reference

    def sample(self) -> int:
        import llama_cpp

        return int(llama_cpp.llama_sampler_sample(self._sampler.sampler, self.llm.ctx, -1))


def read_seq_state(llm: GenerationModel, seq_id: int = SEQ_ID) -> bytes:
    """The sequence's state as llama.cpp serializes it (its KV cells)."""
    import llama_cpp

    size = int(llama_cpp.llama_state_seq_get_size(llm.ctx, seq_id))
    buf = (ctypes.c_uint8 * size)()
    n = int(llama_cpp.llama_state_seq_get_data(llm.ctx, buf, size, seq_id))
    if n != size:
        raise RuntimeError(f"llama_state_seq_get_data wrote {n} of {size} bytes")
    return bytes(buf)


def write_seq_state(llm: GenerationModel, state: bytes, seq_id: int = SEQ_ID) -> None:
    """Load a sequence state into an (empty) context; llama.cpp refuses a layout that differs."""
    import llama_cpp

    buf = (ctypes.c_uint8 * len(state)).from_buffer_copy(state)
    n = int(llama_cpp.llama_state_seq_set_data(llm.ctx, buf, len(state), seq_id))
    if n != len(state):
        raise RuntimeError(
            f"llama_state_seq_set_data read {n} of {len(state)} bytes (KV layouts differ)")


@dataclass
class SplitTiming(Timing):
    """An unsplit request's clock readings plus the handover interval (between token 0 and
    token 1: the prefill model's token 0 is fed to the decode model after the handover)."""

    t_handover_start_mono_ns: int = 0
    t_handover_start_real_ns: int = 0
    t_handover_end_mono_ns: int = 0
    t_handover_end_real_ns: int = 0
    state_bytes: int = 0


def timed_split_request(models: SplitModels, prompt: list[int], n_tokens: int,
                        counters: RequestCounters | None = None,
                        *, keep_logits: list[list[float]] | None = None,
                        keep_state: list[bytes] | None = None) -> SplitTiming:
    """Generate exactly `n_tokens` tokens: prefill on one model, handover, decode on the other.

    `keep_logits` (tests) receives the logits each token was sampled from; `keep_state` the
    handed-over bytes. Both are filled outside the stamped intervals' ends only where noted:
    copying logits costs time, so the runner passes neither.
    """
    mono, real = time.monotonic_ns, time.time_ns
    pre, dec = models.prefill.llm, models.decode.llm
    ids = [0] * n_tokens
    monos = [0] * n_tokens
    reals = [0] * n_tokens
    pre_sampler, dec_sampler = Sampler(pre), Sampler(dec)
    clear(pre)
    clear(dec)
    if counters is not None:
        counters.start()
    t0m, t0r = mono(), real()
    decode_tokens(pre, prompt)
    tok = pre_sampler.sample()
    monos[0], reals[0], ids[0] = mono(), real(), tok
    if counters is not None:  # the handover is counted with the decode phase, as it is timed
        counters.first_token()
    if keep_logits is not None:
        keep_logits.append(last_logits(pre))
    hs_m, hs_r = mono(), real()
    state = read_seq_state(pre)
    write_seq_state(dec, state)
    he_m, he_r = mono(), real()
    if keep_state is not None:
        keep_state.append(state)
    for i in range(1, n_tokens):
        decode_tokens(dec, [tok])
        tok = dec_sampler.sample()
        monos[i], reals[i], ids[i] = mono(), real(), tok
        if keep_logits is not None:
            keep_logits.append(last_logits(dec))
    t1m, t1r = mono(), real()
    if counters is not None:
        counters.end()
    return SplitTiming(t0m, t0r, ids, monos, reals, t1m, t1r,
                       hs_m, hs_r, he_m, he_r, len(state))


def unsplit_request(llm: GenerationModel, prompt: list[int], n_tokens: int,
                    keep_logits: list[list[float]]) -> list[int]:
    """The same C-level loop on one context, no handover: the reference a split run with one
    map for both phases must equal (tokens and logits)."""
    sampler = Sampler(llm)
    clear(llm)
    decode_tokens(llm, prompt)
    ids: list[int] = []
    for i in range(n_tokens):
        if i:
            decode_tokens(llm, [ids[-1]])
        ids.append(sampler.sample())
        keep_logits.append(last_logits(llm))
    return ids
