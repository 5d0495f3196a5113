"""Read what epi needs from a GGUF file's header (no weights are loaded)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from epi.core.errors import UserError
from host.gguf_io.file import check_gguf
from host.quant.mixmap import TensorInfo
from host.quant.quant_types import TYPE_BY_ID, ModelShape


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


class _Field(Protocol):
    def contents(self) -> object: ...


class _Reader(Protocol):
    """What is used of gguf.GGUFReader (the gguf package ships no types)."""

    @property
    def fields(self) -> Mapping[str, _Field]: ...


def _count(reader: _Reader, path: Path, key: str, default: int | None = None) -> int:
    """A whole-number metadata field; missing is `default`, or a one-line UserError."""
    f = reader.fields.get(key)
    value = default if f is None else f.contents()
    if value is None:
        raise UserError(f"{path}: {key}: missing from GGUF metadata")
    if isinstance(value, bool) or not isinstance(value, int):
        raise UserError(f"{path}: {key}: expected a whole number, got {value!r:.40}")
    return value


def read_model(path: Path | str) -> ModelInfo:
    """Header facts of a GGUF model: layer count, heads, every tensor's row length and type."""
    import gguf

    path = Path(path)
    check_gguf(path)
    try:
        reader = gguf.GGUFReader(str(path))
    except Exception as exc:  # the gguf package raises bare ValueErrors on corrupt files
        raise UserError(f"{path}: cannot read GGUF header: {exc}") from None
    arch_field = reader.fields.get("general.architecture")
    arch = None if arch_field is None else arch_field.contents()
    if not arch or not isinstance(arch, str):
        raise UserError(f"{path}: general.architecture: missing from GGUF metadata")
    n_layers = _count(reader, path, f"{arch}.block_count")
    n_head = _count(reader, path, f"{arch}.attention.head_count", 1)
    n_head_kv = _count(reader, path, f"{arch}.attention.head_count_kv", n_head)
    n_expert = _count(reader, path, f"{arch}.expert_count", 0)
    tensors: list[TensorInfo] = []
    types: dict[str, str] = {}
    nbytes: dict[str, int] = {}
    n_params = 0
    for t in reader.tensors:
        dims = [int(d) for d in t.shape]
        types[t.name] = TYPE_BY_ID.get(int(t.tensor_type), t.tensor_type.name)
        tensors.append(
            TensorInfo(t.name, dims[0], int(t.n_elements), len(dims), types[t.name])
        )
        nbytes[t.name] = int(t.n_bytes)
        n_params += int(t.n_elements)
    shape = ModelShape(n_layers, n_head, n_head_kv, "output.weight" in types, n_expert)
    file_type = reader.fields.get("general.file_type")
    return ModelInfo(
        path,
        arch,
        shape,
        tensors,
        types,
        nbytes,
        n_params,
        _count(reader, path, f"{arch}.embedding_length", 0),
        None if file_type is None else _count(reader, path, "general.file_type"),
    )
