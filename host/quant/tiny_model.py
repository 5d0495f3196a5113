"""A random-weight llama GGUF with a real tokenizer, for tests and benchmarks (no downloads).

Widths are multiples of 256 so every K-quant applies to every tensor, which is what the
quantizer tests need to check per-tensor types exactly. The tokenizer is llama.cpp's own
vocab-only SPM file, shipped inside the llama-cpp-python source and installed next to the
bindings by scripts/build_llama.sh.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from epi.core.errors import UserError
from host.run.llama_env import vocab_path

DEFAULT_LAYERS = 8
DEFAULT_WIDTH = 256
DEFAULT_FFN = 512


def write_test_model(
    out: Path,
    *,
    n_layers: int = DEFAULT_LAYERS,
    n_embd: int = DEFAULT_WIDTH,
    n_ff: int = DEFAULT_FFN,
    n_head: int = 4,
    n_head_kv: int | None = None,
    seed: int = 0,
) -> Path:
    """Write a small llama-architecture F16 GGUF to `out` and return its path."""
    import gguf

    if n_embd % n_head:
        raise UserError(f"test model: n_embd {n_embd} is not a multiple of n_head {n_head}")
    vocab = gguf.GGUFReader(str(vocab_path()))

    def field(name: str):
        return vocab.fields[name].contents()

    tokens = field("tokenizer.ggml.tokens")
    n_vocab = len(tokens)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    w = gguf.GGUFWriter(str(out), "llama")
    w.add_name("epi-test-llama")
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
    w.add_vocab_size(n_vocab)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    w.add_tokenizer_model(field("tokenizer.ggml.model"))
    w.add_token_list(tokens)
    w.add_token_scores(field("tokenizer.ggml.scores"))
    w.add_token_types(field("tokenizer.ggml.token_type"))
    w.add_bos_token_id(field("tokenizer.ggml.bos_token_id"))
    w.add_eos_token_id(field("tokenizer.ggml.eos_token_id"))
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)

    rng = np.random.default_rng(seed)

    def matrix(rows: int, cols: int) -> np.ndarray:
        return (rng.standard_normal((rows, cols), dtype=np.float32) * 0.05).astype(np.float16)

    def norm(n: int) -> np.ndarray:
        return np.ones(n, dtype=np.float32)

    w.add_tensor("token_embd.weight", matrix(n_vocab, n_embd))
    for i in range(n_layers):
        p = f"blk.{i}."
        w.add_tensor(p + "attn_norm.weight", norm(n_embd))
        kv_width = n_embd // n_head * n_head_kv
        w.add_tensor(p + "attn_q.weight", matrix(n_embd, n_embd))
        w.add_tensor(p + "attn_k.weight", matrix(kv_width, n_embd))
        w.add_tensor(p + "attn_v.weight", matrix(kv_width, n_embd))
        w.add_tensor(p + "attn_output.weight", matrix(n_embd, n_embd))
        w.add_tensor(p + "ffn_norm.weight", norm(n_embd))
        w.add_tensor(p + "ffn_gate.weight", matrix(n_ff, n_embd))
        w.add_tensor(p + "ffn_up.weight", matrix(n_ff, n_embd))
        w.add_tensor(p + "ffn_down.weight", matrix(n_embd, n_ff))
    w.add_tensor("output_norm.weight", norm(n_embd))
    w.add_tensor("output.weight", matrix(n_vocab, n_embd))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out
