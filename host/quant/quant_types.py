"""Quantization type names and llama.cpp's per-tensor rules for its file types.

Two kinds of names appear in mix maps:
- *tensor types* (ggml types: Q4_K, Q6_K, Q8_0, F16, ...) — every tensor of the group gets it;
- *file types* (llama.cpp mixtures: Q4_K_M, Q3_K_S, ...) — each tensor of the group gets the type
  llama.cpp itself gives that tensor when it quantizes a whole model to that file type
  (`llama_tensor_get_type_impl` in llama.cpp's src/llama-quant.cpp, version pinned by epi).

`rule_type` reproduces those rules for dense llama-family models and for mixture-of-experts
models (qwen3moe: expert tensors `*_exps`, router `ffn_gate_inp`, shared experts `*_shexp`). It
is checked against llama.cpp's own non-pure quantization in the tests, tensor by tensor.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from epi.core.errors import UserError

# ggml tensor types a mix map may request: name -> (ggml id, block size in weights, bytes per block)
TENSOR_TYPES: dict[str, tuple[int, int, int]] = {
    "F32": (0, 1, 4),
    "F16": (1, 1, 2),
    "Q4_0": (2, 32, 18),
    "Q4_1": (3, 32, 20),
    "Q5_0": (6, 32, 22),
    "Q5_1": (7, 32, 24),
    "Q8_0": (8, 32, 34),
    "Q2_K": (10, 256, 84),
    "Q3_K": (11, 256, 110),
    "Q4_K": (12, 256, 144),
    "Q5_K": (13, 256, 176),
    "Q6_K": (14, 256, 210),
    "IQ4_NL": (20, 32, 18),
    "BF16": (30, 1, 2),
}
TYPE_BY_ID = {v[0]: k for k, v in TENSOR_TYPES.items()}

# llama.cpp file types (mixtures) -> the default tensor type of that mixture
FILE_TYPES: dict[str, str] = {
    "F16": "F16",
    "BF16": "BF16",
    "Q4_0": "Q4_0",
    "Q4_1": "Q4_1",
    "Q5_0": "Q5_0",
    "Q5_1": "Q5_1",
    "Q8_0": "Q8_0",
    "Q2_K": "Q2_K",
    "Q3_K_S": "Q3_K",
    "Q3_K_M": "Q3_K",
    "Q3_K_L": "Q3_K",
    "Q4_K_S": "Q4_K",
    "Q4_K_M": "Q4_K",
    "Q5_K_S": "Q5_K",
    "Q5_K_M": "Q5_K",
    "Q6_K": "Q6_K",
}

# llama.cpp's fallback when a tensor's row length is not a multiple of the type's block size
FALLBACK: dict[str, str] = {
    "Q2_K": "Q4_0",
    "Q3_K": "Q4_0",
    "Q4_K": "Q5_0",
    "Q5_K": "Q5_1",
    "Q6_K": "Q8_0",
}

EXPERT_KINDS = ("ffn_gate_exps", "ffn_up_exps", "ffn_down_exps")
SHARED_EXPERT_KINDS = ("ffn_gate_shexp", "ffn_up_shexp", "ffn_down_shexp")
ROUTER_KIND = "ffn_gate_inp"
TENSOR_KINDS = (
    "attn_q",
    "attn_k",
    "attn_v",
    "attn_output",
    "attn_qkv",
    "ffn_gate",
    "ffn_up",
    "ffn_down",
    *EXPERT_KINDS,
    *SHARED_EXPERT_KINDS,
    ROUTER_KIND,
)
# Families a map may name instead of single kinds, narrowest first: a kind beats its family,
# and a narrow family (experts) beats a broad one (ffn) that also holds the kind.
KIND_FAMILIES = {
    "router": (ROUTER_KIND,),
    "experts": EXPERT_KINDS,
    "shared_experts": SHARED_EXPERT_KINDS,
    "attn": ("attn_q", "attn_k", "attn_v", "attn_output", "attn_qkv"),
    "ffn": ("ffn_gate", "ffn_up", "ffn_down", *EXPERT_KINDS, *SHARED_EXPERT_KINDS),
}

_BLOCK_RE = re.compile(r"^blk\.(\d+)\.([a-z_]+)\.weight$")


def known_type(name: str) -> bool:
    """True if `name` is a tensor type or a llama.cpp file type epi can apply."""
    return name in TENSOR_TYPES or name in FILE_TYPES


def type_size(type_name: str) -> tuple[int, int]:
    """(weights per block, bytes per block) of a ggml tensor type; an unknown name is a
    one-line UserError."""
    try:
        _, block, nbytes = TENSOR_TYPES[type_name]
    except KeyError:
        raise UserError(f"unknown tensor type {type_name!r}") from None
    return block, nbytes


def bits_per_weight(type_name: str) -> float:
    """Storage bits per weight of a ggml tensor type, block overhead included (Q4_0: 4.5)."""
    block, nbytes = type_size(type_name)
    return nbytes * 8 / block


def block_size(type_name: str) -> int:
    """Number of weights per quantization block: a row length must be a multiple of it."""
    return type_size(type_name)[0]


def split_tensor_name(name: str) -> tuple[int | None, str]:
    """('blk.3.attn_v.weight') -> (3, 'attn_v'); non-block tensors -> (None, stem)."""
    m = _BLOCK_RE.match(name)
    if m:
        return int(m.group(1)), m.group(2)
    return None, name.removesuffix(".weight")


def is_quantizable(name: str, n_dims: int) -> bool:
    """Whether a map assigns this tensor a type (2-D and 3-D weights, not norms).

    The expert router is included so a map can name its type and the manifest can show what
    llama.cpp did with it; llama.cpp itself never quantizes it (see `llama_keeps_type`).
    """
    return name.endswith("weight") and "_norm.weight" not in name and n_dims >= 2


def llama_keeps_type(name: str) -> bool:
    """True for tensors llama-quantize always writes in their stored type, whatever is asked.

    `tensor_allows_quantization` in llama.cpp's src/llama-quant.cpp excludes expert gating
    (router) tensors: any name containing `ffn_gate_inp.weight`.
    """
    return "ffn_gate_inp.weight" in name


def tensor_role(name: str, n_dims: int) -> str:
    """What a tensor is, for manifests: expert, shared_expert, router, attention, ffn, ..."""
    layer, kind = split_tensor_name(name)
    if kind in EXPERT_KINDS:
        return "expert"
    if kind in SHARED_EXPERT_KINDS or kind == "ffn_gate_inp_shexp":
        return "shared_expert"
    if kind.startswith(ROUTER_KIND):
        return "router"
    if n_dims < 2 or "_norm" in kind:
        return "norm"
    if layer is None:
        return {"token_embd": "token_embd", "output": "output"}.get(kind, "other")
    if kind.startswith("attn"):
        return "attention"
    if kind.startswith("ffn"):
        return "ffn"
    return "other"


@dataclass(frozen=True)
class ModelShape:
    """What llama.cpp's type rules need to know about a model."""

    n_layers: int
    n_head: int
    n_head_kv: int
    has_output: bool  # False when the output projection is tied to the token embedding
    n_expert: int = 0  # `{arch}.expert_count`; 0 for dense models

    @property
    def n_gqa(self) -> int:
        return self.n_head // max(1, self.n_head_kv)


def _use_more_bits(i_layer: int, n_layers: int) -> bool:
    return (
        i_layer < n_layers // 8
        or i_layer >= 7 * n_layers // 8
        or (i_layer - n_layers // 8) % 3 == 2
    )


def _category(kind: str) -> str:
    """llama.cpp's `tensor_get_category` by substring: `ffn_down_exps` is an ffn_down tensor."""
    for cat in ("attn_qkv", "attn_v", "attn_k", "attn_q", "attn_output"):
        if kind == cat:
            return cat
    for cat in ("ffn_up", "ffn_gate", "ffn_down"):
        if cat in kind:
            return cat
    return kind


# File types for which llama.cpp gives attn_output Q5_K in an 8-expert model (Mixtral rule).
_EIGHT_EXPERT_ATTN_OUTPUT_Q5K = ("Q2_K", "Q3_K_S", "Q3_K_M", "Q4_K_S", "Q4_K_M")


def rule_type(file_type: str, tensor: str, shape: ModelShape, row_len: int) -> str:
    """The tensor type llama.cpp gives `tensor` in a whole-model quantization to `file_type`.

    Before the block-size fallback (see `apply_fallback`). A tensor type name is returned as is.
    Expert tensors follow the rule of their category (`ffn_down_exps` and `ffn_down_shexp` are
    ffn_down tensors, with the layer read from the name); models with exactly 8 experts get
    llama.cpp's Mixtral rules (attn_v and attn_k Q8_0, attn_output Q5_K).
    """
    if file_type in TENSOR_TYPES and file_type not in FILE_TYPES:
        return file_type
    base = FILE_TYPES[file_type]
    if base in ("F16", "BF16", "F32"):
        return base
    layer, kind = split_tensor_name(tensor)
    is_output = kind == "output" or (not shape.has_output and kind == "token_embd")
    if is_output:
        if row_len % block_size(base) != 0:
            return "Q8_0"
        return base if base == "Q8_0" else "Q6_K"
    if kind == "token_embd" or layer is None:
        return base
    n = shape.n_layers
    eight_experts = shape.n_expert == 8
    category = _category(kind)
    if category in ("attn_v", "attn_qkv"):  # llama.cpp: category_is_attn_v
        new = base
        if file_type == "Q2_K":
            new = "Q4_K" if shape.n_gqa >= 4 else "Q3_K"
        elif file_type == "Q3_K_M":
            new = "Q5_K" if layer < 2 else "Q4_K"
        elif file_type == "Q3_K_L":
            new = "Q5_K"
        elif file_type in ("Q4_K_M", "Q5_K_M") and _use_more_bits(layer, n):
            new = "Q6_K"
        elif file_type == "Q4_K_S" and layer < 4:
            new = "Q5_K"
        return "Q8_0" if eight_experts else new
    if category == "attn_k":
        return "Q8_0" if eight_experts else base
    if category == "ffn_down":
        if file_type == "Q2_K":
            return "Q3_K"
        if file_type == "Q3_K_M":
            return "Q5_K" if layer < n // 16 else "Q4_K"
        if file_type == "Q3_K_L":
            return "Q5_K"
        if file_type in ("Q4_K_M", "Q5_K_M") and _use_more_bits(layer, n):
            return "Q6_K"
        if file_type == "Q4_K_S" and layer < n // 8:
            return "Q5_K"
        return base
    if category == "attn_output":
        if eight_experts:
            return "Q5_K" if file_type in _EIGHT_EXPERT_ATTN_OUTPUT_Q5K else base
        if file_type == "Q2_K":
            return "Q3_K"
        if file_type == "Q3_K_M":
            return "Q4_K"
        if file_type == "Q3_K_L":
            return "Q5_K"
        return base
    return base


def apply_fallback(type_name: str, row_len: int) -> str:
    """The type llama.cpp actually writes when `row_len` does not fit the requested type."""
    if row_len % block_size(type_name) == 0:
        return type_name
    fallback = FALLBACK.get(type_name)
    if fallback is None or row_len % block_size(fallback) != 0:
        return "F16"
    return fallback
