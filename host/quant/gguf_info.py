"""Read what epi needs from a GGUF file's header (no weights are loaded)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from epi.core.errors import UserError
from host.quant.mixmap import TensorInfo
from host.quant.quant_types import TYPE_BY_ID, ModelShape

GGUF_MAGIC = b"GGUF"


@dataclass
class ModelInfo:
    """Architecture, shape and tensor list of a GGUF model."""

    path: Path
    arch: str
    shape: ModelShape
    tensors: list[TensorInfo]
    tensor_types: dict[str, str]  # tensor name -> ggml type name as stored
    tensor_bytes: dict[str, int]
    n_params: int
    n_embd: int
    file_type: int | None


def check_gguf(path: Path) -> None:
    """Raise a one-line UserError unless `path` is a readable GGUF file."""
    if not path.exists():
        raise UserError(f"{path}: no such model file")
    if not path.is_file():
        raise UserError(f"{path}: not a file")
    with path.open("rb") as f:
        magic = f.read(4)
    if magic != GGUF_MAGIC:
        raise UserError(f"{path}: not a GGUF file (magic {magic!r}, expected b'GGUF')")


def _field(reader, key: str, default=None):
    f = reader.fields.get(key)
    return default if f is None else f.contents()


def read_model(path: Path | str) -> ModelInfo:
    """Header facts of a GGUF model: layer count, heads, every tensor's row length and type."""
    import gguf

    path = Path(path)
    check_gguf(path)
    try:
        reader = gguf.GGUFReader(str(path))
    except Exception as exc:  # the gguf package raises bare ValueErrors on corrupt files
        raise UserError(f"{path}: cannot read GGUF header: {exc}") from None
    arch = _field(reader, "general.architecture")
    if not arch:
        raise UserError(f"{path}: general.architecture: missing from GGUF metadata")
    n_layers = _field(reader, f"{arch}.block_count")
    if n_layers is None:
        raise UserError(f"{path}: {arch}.block_count: missing from GGUF metadata")
    n_head = _field(reader, f"{arch}.attention.head_count", 1)
    n_head_kv = _field(reader, f"{arch}.attention.head_count_kv", n_head)
    n_expert = _field(reader, f"{arch}.expert_count", 0)
    tensors, types, nbytes = [], {}, {}
    n_params = 0
    for t in reader.tensors:
        dims = [int(d) for d in t.shape]
        types[t.name] = TYPE_BY_ID.get(int(t.tensor_type), t.tensor_type.name)
        tensors.append(
            TensorInfo(t.name, dims[0], int(t.n_elements), len(dims), types[t.name])
        )
        nbytes[t.name] = int(t.n_bytes)
        n_params += int(t.n_elements)
    names = set(types)
    shape = ModelShape(
        int(n_layers), int(n_head), int(n_head_kv), "output.weight" in names, int(n_expert)
    )
    return ModelInfo(
        path,
        str(arch),
        shape,
        tensors,
        types,
        nbytes,
        n_params,
        int(_field(reader, f"{arch}.embedding_length", 0)),
        _field(reader, "general.file_type"),
    )


def sha256_file(path: Path, chunk: int = 1 << 22) -> str:
    """Content hash of a file (models are compared and joined by it)."""
    h = hashlib.sha256()
    with Path(path).open("rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()
