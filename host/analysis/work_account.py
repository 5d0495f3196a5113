"""The bytes of weights one decoded token streams, from a GGUF's tensor table.

Decoding one token reads, once each:
- every weight of a dense model's blocks and its output matrix;
- one row of the token embedding (a lookup), unless the embedding is tied to the output (no
  `output.weight`): then the whole matrix is read as the output projection;
- in a mixture-of-experts model, the shared tensors (attention, norms, router, shared experts)
  plus the `n_expert_used` experts the router picks out of `n_expert` in each layer. Which
  experts are picked depends on the token, so the expert term is an **expectation**: with every
  expert equally likely, each expert tensor (`*_exps`, all experts of a layer in one tensor)
  contributes `n_expert_used / n_expert` of its bytes. Real routers are not uniform; over many
  tokens each expert's share is its routing frequency, which this account does not measure.

Norm vectors and biases are counted in full (they are read every token). The KV cache's reads,
which grow with the context, are not weights and are not counted here.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from epi.core.errors import UserError
from host.gguf_io.header import parse_gguf_header
from host.quant.gguf_info import read_model

EMBEDDING = "token_embd.weight"
OUTPUT = "output.weight"


@dataclass(frozen=True)
class WorkAccount:
    """Bytes streamed per decoded token, by kind, for one model file."""

    model: str
    bytes_per_token: float  # the total (an expectation for MoE models)
    dense_bytes: int  # tensors read in full every token
    embedding_row_bytes: float  # the one embedding row (0 when the embedding is tied)
    expert_bytes: int  # all expert tensors' bytes (every expert of every layer)
    n_expert: int  # 0: a dense model
    n_expert_used: int
    tied_embedding: bool

    @property
    def is_expectation(self) -> bool:
        """True when the figure depends on routing (a mixture-of-experts model)."""
        return self.n_expert > 0 and self.expert_bytes > 0

    def method(self) -> str:
        """One line on how the figure was made, for the report."""
        if self.is_expectation:
            return (f"shared tensors in full + {self.n_expert_used}/{self.n_expert} of the expert "
                    "tensors (expectation under uniform routing)")
        return "every weight once per token (dense), one embedding row"


def is_expert_tensor(name: str) -> bool:
    """The merged per-layer expert tensors llama.cpp names `blk.N.ffn_{gate,up,down}_exps.*`."""
    return "_exps." in name


def work_account(path: Path | str) -> WorkAccount:
    """The work account of the GGUF at `path` (header only: no weights are read)."""
    path = Path(path)
    info = read_model(path)
    try:
        meta = parse_gguf_header(path).meta
    except (ValueError, OSError) as exc:
        raise UserError(f"{path}: cannot read GGUF header: {exc}") from None
    n_expert = info.shape.n_expert
    used = meta.get(f"{info.arch}.expert_used_count", 0)
    n_used = used if isinstance(used, int) and not isinstance(used, bool) else 0
    if n_expert > 0 and not 0 < n_used <= n_expert:
        raise UserError(f"{path}: {info.arch}.expert_used_count {used!r:.20} is not in "
                        f"1..{n_expert} (expert_count)")
    tied = OUTPUT not in info.tensor_bytes
    dense = expert = 0
    row = 0.0
    for name, size in info.tensor_bytes.items():
        if is_expert_tensor(name):
            expert += size
        elif name == EMBEDDING and not tied:
            n_rows = next((t.n_elements // t.row_len for t in info.tensors
                           if t.name == name and t.row_len > 0), 0)
            row = size / n_rows if n_rows else float(size)
        else:
            dense += size
    share = n_used / n_expert if n_expert else 0.0
    total = dense + row + expert * share
    return WorkAccount(path.name, float(total), dense, row, expert, n_expert, n_used, tied)
