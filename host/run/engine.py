"""The generation engine: load a model with llama-cpp-python and time every token it yields.

`timed_request` is the measured loop. It stamps CLOCK_MONOTONIC and CLOCK_REALTIME around
`Llama.generate`: before the call (request start), as each token is yielded (token 0 = end of
prefill) and after the last one (request end). Nothing else happens inside the loop — the
stamps go into preallocated lists and are written to the token log after the request ends.

Decoding is greedy and end-of-generation tokens (EOS, EOT, ...) are suppressed with llama.cpp's
own logit-bias sampler (−inf), so every request generates exactly N tokens without a Python
callback per token. `EpiLlama` plugs that sampler chain into `Llama.generate` by overriding
`Llama._init_sampler` (llama-cpp-python is pinned to 0.3.36, where generate() builds its
sampler through that method); the KV cache is reset before every request so repeats of one
prompt all pay the full prefill.
"""

from __future__ import annotations

import time
from collections.abc import Generator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from epi.core.errors import UserError
from host.cluster.placement import LoadLog, parse_load_log
from host.run.llama_log import captured_llama_log
from host.run.perf_counters import RequestCounters


def _llama_class() -> type:
    import llama_cpp
    import llama_cpp._internals as internals
    from llama_cpp import Llama

    class EpiLlama(Llama):
        """Llama whose generate() samples greedily with the given token ids banned."""

        _epi_bias: object = None  # a ctypes array of llama_logit_bias
        _epi_n_bias: int = 0

        def epi_ban_tokens(self, token_ids: list[int]) -> None:
            arr = (llama_cpp.llama_logit_bias * len(token_ids))(
                *[llama_cpp.llama_logit_bias(t, float("-inf")) for t in token_ids]
            )
            self._epi_bias, self._epi_n_bias = arr, len(token_ids)

        def _init_sampler(self, *_args: object, **_kwargs: object) -> internals.LlamaSampler:
            sampler = internals.LlamaSampler()
            if self._epi_n_bias:
                bias = llama_cpp.llama_sampler_init_logit_bias(
                    self.n_vocab(), self._epi_n_bias, self._epi_bias
                )
                llama_cpp.llama_sampler_chain_add(sampler.sampler, bias)
            sampler.add_greedy()
            return sampler

    if not callable(getattr(Llama, "_init_sampler", None)):
        raise RuntimeError("llama-cpp-python lacks Llama._init_sampler; epi needs 0.3.36")
    return EpiLlama


class SamplerChain(Protocol):
    """llama-cpp-python's `LlamaSampler`: the chain `EpiLlama._init_sampler` builds."""

    @property
    def sampler(self) -> object: ...  # the llama_sampler pointer, for llama_cpp's C functions


class GenerationModel(Protocol):
    """What epi calls on a loaded `EpiLlama` (llama-cpp-python ships no type information)."""

    n_tokens: int  # the Python wrapper's count of tokens in the context

    @property
    def model(self) -> object: ...  # the llama_model pointer, for llama_cpp's C functions

    @property
    def ctx(self) -> object: ...  # the llama_context pointer

    def n_vocab(self) -> int: ...

    def reset(self) -> None: ...

    def generate(self, tokens: Sequence[int]) -> Generator[int, None, None]: ...

    def epi_ban_tokens(self, token_ids: list[int]) -> None: ...

    def _init_sampler(self) -> SamplerChain: ...  # greedy, the banned ids biased to -inf


@dataclass
class LoadedModel:
    """A loaded model, the ids banned from generation and what llama.cpp logged while loading."""

    llm: GenerationModel  # an EpiLlama
    eog_ids: list[int]
    load_log: LoadLog
    n_params: int


def eog_token_ids(llm: GenerationModel) -> list[int]:
    """Every end-of-generation token id of the model's vocabulary (EOS, EOT, <|im_end|>, ...)."""
    import llama_cpp

    vocab = llama_cpp.llama_model_get_vocab(llm.model)
    return [i for i in range(llm.n_vocab()) if llama_cpp.llama_vocab_is_eog(vocab, i)]


def load_model(
    path: Path,
    *,
    threads: int,
    n_ctx: int,
    seed: int = 0,
    n_gpu_layers: int = 0,
    tensor_split: list[float] | None = None,
    log_path: Path | None = None,
) -> LoadedModel:
    """Load `path` with explicit threads; offload `n_gpu_layers` to registered RPC devices.

    llama.cpp's load log (debug lines included) is captured for placement and mirrored to
    `log_path` when given.
    """
    import llama_cpp

    cls = _llama_class()
    with captured_llama_log(log_path) as log:
        llm = cls(
            str(path),
            n_ctx=n_ctx,
            n_threads=threads,
            n_threads_batch=threads,
            n_gpu_layers=n_gpu_layers,
            tensor_split=tensor_split,
            seed=seed,
            verbose=False,
        )
    eog = eog_token_ids(llm)
    llm.epi_ban_tokens(eog)
    n_params = int(llama_cpp.llama_model_n_params(llm.model))
    return LoadedModel(llm, eog, parse_load_log(log.text), n_params)


@dataclass
class Timing:
    """Clock readings of one request (ns): start, one per token, end."""

    t_start_mono_ns: int
    t_start_real_ns: int
    token_ids: list[int]
    token_mono_ns: list[int]
    token_real_ns: list[int]
    t_end_mono_ns: int
    t_end_real_ns: int


def timed_request(llm: GenerationModel, prompt: list[int], n_tokens: int,
                  counters: RequestCounters | None = None) -> Timing:
    """Generate exactly `n_tokens` tokens after `prompt` (full prefill), stamping each one;
    `counters` (perf events) are read just before the start and just after the first token's
    and the end's stamps, never between a token and its stamp."""
    mono, real = time.monotonic_ns, time.time_ns
    ids = [0] * n_tokens
    monos = [0] * n_tokens
    reals = [0] * n_tokens
    llm.reset()  # n_tokens = 0: generate() re-evaluates the whole prompt (no prefix reuse)
    i = 0
    if counters is not None:
        counters.start()
    t0m, t0r = mono(), real()
    gen = llm.generate(prompt)
    for tok in gen:
        monos[i] = mono()
        reals[i] = real()
        ids[i] = tok
        i += 1
        if i == 1 and counters is not None:
            counters.first_token()
        if i == n_tokens:
            break
    t1m, t1r = mono(), real()
    if counters is not None:
        counters.end()
    gen.close()
    if i != n_tokens:
        raise RuntimeError(f"llama.cpp stopped after {i} of {n_tokens} tokens")
    return Timing(t0m, t0r, ids, monos, reals, t1m, t1r)


def perf_context(llm: GenerationModel) -> dict[str, float]:
    """llama.cpp's own counters since the last reset (prompt/eval ms and token counts)."""
    import llama_cpp

    data = llama_cpp.llama_perf_context(llm.ctx)
    return {
        "prompt_eval_ms": float(data.t_p_eval_ms),
        "n_prompt_eval": int(data.n_p_eval),
        "eval_ms": float(data.t_eval_ms),
        "n_eval": int(data.n_eval),
    }


def tokenize_texts(path: Path, texts: list[str]) -> list[list[int]]:
    """Tokenize texts with a model's own tokenizer (vocab only, no weights, no context).

    BOS (and any other special prefix) is added exactly when the model says to.
    """
    import llama_cpp

    params = llama_cpp.llama_model_default_params()
    params.vocab_only = True
    with captured_llama_log() as log:
        model = llama_cpp.llama_model_load_from_file(str(path).encode(), params)
    if not model:
        last = next((ln for ln in reversed(log.lines()) if ln.strip()), "no reason logged")
        raise UserError(f"{path}: llama.cpp cannot load this model's vocabulary ({last.strip()})")
    try:
        vocab = llama_cpp.llama_model_get_vocab(model)
        out = []
        for text in texts:
            data = text.encode("utf-8")
            cap = len(data) + 8
            buf = (llama_cpp.llama_token * cap)()
            n = llama_cpp.llama_tokenize(vocab, data, len(data), buf, cap, True, False)
            if n < 0:
                raise RuntimeError(f"llama_tokenize needs {-n} tokens, buffer had {cap}")
            out.append(list(buf[:n]))
        return out
    finally:
        llama_cpp.llama_model_free(model)
