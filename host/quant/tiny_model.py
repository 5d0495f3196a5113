"""Random-weight GGUF models with a real tokenizer, for tests and benchmarks (no downloads).

Three architectures: dense `llama`; `qwen3moe`, the mixture-of-experts architecture of the
study's Qwen3-30B-A3B (per layer: router `ffn_gate_inp` [n_embd, n_expert] in F32 as
llama.cpp's converter writes it, 3-D expert tensors `ffn_{gate,up,down}_exps`, Q/K norms);
and `qwen2moe`, which adds a shared expert (`ffn_{gate,up,down}_shexp` and its 1-D gate
`ffn_gate_inp_shexp`). The metadata keys are those llama.cpp reads for each architecture
(`expert_count`, `expert_used_count`, `expert_feed_forward_length`,
`expert_shared_feed_forward_length`). Widths are multiples of 256 so every K-quant applies to
every tensor, which is what the quantizer tests need to check per-tensor types exactly. The
tokenizer is llama.cpp's own vocab-only SPM file, shipped inside the llama-cpp-python source
and installed next to the bindings by scripts/build_llama.sh.
"""

from __future__ import annotations

import copy
import functools
from pathlib import Path
from typing import TypeVar

import numpy as np

from epi.core.errors import UserError
from epi.formats.json_types import JSON
from host.llama.install import vocab_path

_T = TypeVar("_T")

DEFAULT_LAYERS = 8
DEFAULT_WIDTH = 256
DEFAULT_FFN = 512
ARCHITECTURES = ("llama", "qwen3moe", "qwen2moe")
MOE_ARCHITECTURES = ("qwen3moe", "qwen2moe")


_VOCAB_FIELDS = (
    "tokenizer.ggml.model",
    "tokenizer.ggml.tokens",
    "tokenizer.ggml.scores",
    "tokenizer.ggml.token_type",
    "tokenizer.ggml.bos_token_id",
    "tokenizer.ggml.eos_token_id",
)


@functools.lru_cache(maxsize=2)
def _vocab_fields(path: str) -> dict[str, JSON]:
    """The tokenizer fields of llama.cpp's vocab-only file, read once per process: the gguf
    package's reader materialises the 32k-token arrays (about a second of CPU), and a test
    session writes a dozen models."""
    import gguf

    reader = gguf.GGUFReader(path)
    return {name: reader.fields[name].contents() for name in _VOCAB_FIELDS}


def write_test_model(
    out: Path,
    *,
    n_layers: int = DEFAULT_LAYERS,
    n_embd: int = DEFAULT_WIDTH,
    n_ff: int = DEFAULT_FFN,
    n_head: int = 4,
    n_head_kv: int | None = None,
    seed: int = 0,
    arch: str = "llama",
    n_expert: int = 4,
    n_expert_used: int = 2,
    n_ff_exp: int = 256,
    n_ff_shexp: int = 512,
) -> Path:
    """Write a small F16 GGUF of `arch` to `out` and return its path.

    `n_expert`, `n_expert_used`, `n_ff_exp` and `n_ff_shexp` apply to the MoE architectures
    only (`n_ff` is then the nominal dense width llama.cpp records but does not use).
    """
    import gguf

    if arch not in ARCHITECTURES:
        raise UserError(f"test model: unknown architecture {arch!r} (known: {ARCHITECTURES})")
    moe = arch in MOE_ARCHITECTURES
    if moe and not 0 < n_expert_used <= n_expert:
        raise UserError(
            f"test model: expert_used_count {n_expert_used} must be in 1..{n_expert} experts"
        )
    if n_embd % n_head:
        raise UserError(f"test model: n_embd {n_embd} is not a multiple of n_head {n_head}")
    vocab = _vocab_fields(str(vocab_path()))

    def field(name: str, kind: type[_T]) -> _T:
        value = vocab[name]
        if not isinstance(value, kind):
            raise UserError(f"{vocab_path()}: {name} is not a {kind.__name__}")
        return copy.copy(value)  # the cached lists stay as read

    tokens = field("tokenizer.ggml.tokens", list)
    n_vocab = len(tokens)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    w = gguf.GGUFWriter(str(out), arch)
    w.add_name(f"epi-test-{arch}")
    w.add_block_count(n_layers)
    w.add_context_length(512)
    w.add_embedding_length(n_embd)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(n_head)
    n_head_kv = n_head if n_head_kv is None else n_head_kv
    if n_head % n_head_kv:
        raise UserError(f"test model: n_head {n_head} is not a multiple of n_head_kv {n_head_kv}")
    w.add_head_count_kv(n_head_kv)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_dimension_count(n_embd // n_head)
    if moe:
        w.add_expert_count(n_expert)
        w.add_expert_used_count(n_expert_used)
        w.add_expert_feed_forward_length(n_ff_exp)
        if arch == "qwen2moe":
            w.add_expert_shared_feed_forward_length(n_ff_shexp)
    w.add_vocab_size(n_vocab)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    w.add_tokenizer_model(field("tokenizer.ggml.model", str))
    w.add_token_list(tokens)
    w.add_token_scores(field("tokenizer.ggml.scores", list))
    w.add_token_types(field("tokenizer.ggml.token_type", list))
    w.add_bos_token_id(field("tokenizer.ggml.bos_token_id", int))
    w.add_eos_token_id(field("tokenizer.ggml.eos_token_id", int))
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)

    rng = np.random.default_rng(seed)

    def matrix(rows: int, cols: int) -> np.ndarray:
        return (rng.standard_normal((rows, cols), dtype=np.float32) * 0.05).astype(np.float16)

    def norm(n: int) -> np.ndarray:
        return np.ones(n, dtype=np.float32)

    def experts(rows: int, cols: int) -> np.ndarray:
        # numpy (n_expert, rows, cols) is ggml's ne = [cols, rows, n_expert]
        return (rng.standard_normal((n_expert, rows, cols), dtype=np.float32) * 0.05).astype(
            np.float16
        )

    def router() -> np.ndarray:
        return rng.standard_normal((n_expert, n_embd), dtype=np.float32) * 0.05

    w.add_tensor("token_embd.weight", matrix(n_vocab, n_embd))
    for i in range(n_layers):
        p = f"blk.{i}."
        w.add_tensor(p + "attn_norm.weight", norm(n_embd))
        kv_width = n_embd // n_head * n_head_kv
        w.add_tensor(p + "attn_q.weight", matrix(n_embd, n_embd))
        w.add_tensor(p + "attn_k.weight", matrix(kv_width, n_embd))
        w.add_tensor(p + "attn_v.weight", matrix(kv_width, n_embd))
        w.add_tensor(p + "attn_output.weight", matrix(n_embd, n_embd))
        if arch == "qwen3moe":
            w.add_tensor(p + "attn_q_norm.weight", norm(n_embd // n_head))
            w.add_tensor(p + "attn_k_norm.weight", norm(n_embd // n_head))
        w.add_tensor(p + "ffn_norm.weight", norm(n_embd))
        if not moe:
            w.add_tensor(p + "ffn_gate.weight", matrix(n_ff, n_embd))
            w.add_tensor(p + "ffn_up.weight", matrix(n_ff, n_embd))
            w.add_tensor(p + "ffn_down.weight", matrix(n_embd, n_ff))
            continue
        w.add_tensor(p + "ffn_gate_inp.weight", router())
        w.add_tensor(p + "ffn_gate_exps.weight", experts(n_ff_exp, n_embd))
        w.add_tensor(p + "ffn_up_exps.weight", experts(n_ff_exp, n_embd))
        w.add_tensor(p + "ffn_down_exps.weight", experts(n_embd, n_ff_exp))
        if arch == "qwen2moe":
            w.add_tensor(p + "ffn_gate_inp_shexp.weight", norm(n_embd) * 0.05)
            w.add_tensor(p + "ffn_gate_shexp.weight", matrix(n_ff_shexp, n_embd))
            w.add_tensor(p + "ffn_up_shexp.weight", matrix(n_ff_shexp, n_embd))
            w.add_tensor(p + "ffn_down_shexp.weight", matrix(n_embd, n_ff_shexp))
    w.add_tensor("output_norm.weight", norm(n_embd))
    w.add_tensor("output.weight", matrix(n_vocab, n_embd))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out
