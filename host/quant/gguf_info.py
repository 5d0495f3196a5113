"""Read what epi needs from a GGUF file's header (no weights are loaded, no arrays are read).

The header is parsed with host.gguf_io's reader, which skips metadata arrays: gguf.GGUFReader
materialises every array (a 32k-token vocabulary costs about a second of CPU a read, and
`epi quantize` reads every output back). Each tensor's byte size follows from its type's
block layout (the gguf package's GGML_QUANT_SIZES), as the gguf package computes it; a
tensor whose data would run past the end of the file is refused, as the package refuses it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Union

from epi.core.errors import UserError
from host.gguf_io.file import check_gguf
from host.gguf_io.header import RawTensor, Scalar, SkippedArray, parse_gguf_header
from host.quant.mixmap import TensorInfo
from host.quant.quant_types import TYPE_BY_ID, ModelShape

_VERSIONS = (2, 3)  # those the gguf package reads
_DEFAULT_ALIGNMENT = 32


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


Meta = dict[str, Union[Scalar, SkippedArray]]


def _parse_header(path: Path) -> tuple[Meta, list[RawTensor], int]:
    """(metadata, tensor infos, start of the data section); ValueError on a malformed header."""
    header = parse_gguf_header(path, _VERSIONS)
    alignment = header.meta.get("general.alignment", _DEFAULT_ALIGNMENT)
    if isinstance(alignment, bool) or not isinstance(alignment, int) or alignment <= 0 or (
        alignment & (alignment - 1)
    ):
        raise ValueError(f"general.alignment {alignment!r:.40} is not a power of two")
    return header.meta, header.tensors, -(-header.end_of_header // alignment) * alignment


def _count(meta: Meta, path: Path, key: str, default: int | None = None) -> int:
    """A whole-number metadata field; missing is `default`, or a one-line UserError."""
    value = meta.get(key, default)
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
        meta, raw_tensors, data_start = _parse_header(path)
        file_size = path.stat().st_size
        tensors: list[TensorInfo] = []
        types: dict[str, str] = {}
        nbytes: dict[str, int] = {}
        n_params = 0
        for t in raw_tensors:
            if t.name in types:
                raise ValueError(f"duplicated tensor {t.name}")
            if not t.dims:
                raise ValueError(f"tensor {t.name} has no dimensions")
            qtype = gguf.GGMLQuantizationType(t.type_id)  # ValueError if unknown
            block, type_size = gguf.GGML_QUANT_SIZES[qtype]
            n_elements = 1
            for d in t.dims:
                n_elements *= d
            size = n_elements * type_size // block
            if data_start + t.offset + size > file_size:
                raise ValueError(f"tensor {t.name}: data runs past the end of the file")
            types[t.name] = TYPE_BY_ID.get(t.type_id, qtype.name)
            tensors.append(TensorInfo(t.name, t.dims[0], n_elements, len(t.dims), types[t.name]))
            nbytes[t.name] = size
            n_params += n_elements
    except (ValueError, KeyError, OSError) as exc:
        raise UserError(f"{path}: cannot read GGUF header: {exc}") from None
    arch = meta.get("general.architecture")
    if not arch or not isinstance(arch, str):
        raise UserError(f"{path}: general.architecture: missing from GGUF metadata")
    n_layers = _count(meta, path, f"{arch}.block_count")
    n_head = _count(meta, path, f"{arch}.attention.head_count", 1)
    n_head_kv = _count(meta, path, f"{arch}.attention.head_count_kv", n_head)
    n_expert = _count(meta, path, f"{arch}.expert_count", 0)
    shape = ModelShape(n_layers, n_head, n_head_kv, "output.weight" in types, n_expert)
    return ModelInfo(
        path,
        arch,
        shape,
        tensors,
        types,
        nbytes,
        n_params,
        _count(meta, path, f"{arch}.embedding_length", 0),
        None if "general.file_type" not in meta else _count(meta, path, "general.file_type"),
    )
