"""A GGUF reader for the quantization tests that shares no code with epi, and shared models.

`gguf_view` parses a GGUF header from the spec (magic, version, counts, key/values, tensor
infos, aligned data section). gguf.GGUFReader materialises every metadata array (a 32k-token
vocabulary, about a second of CPU a read) and took most of these tests' time. Type names and
block sizes come from the gguf package (GGMLQuantizationType, GGML_QUANT_SIZES). Each tensor's
byte size by that table must be what the file lays out: the tensors tile the data section in
offset order, each aligned and followed by less than one alignment of padding, the last ending
within one alignment of the file's end. So a type name that does not describe the stored data
fails here.

`shared_model` writes a test model once per set of arguments for the session; callers only
read it (llama-quantize and read_model open it read-only).
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

# GGUF value types (gguf spec): id -> struct format of one scalar; 8 = string, 9 = array
_GGUF_SCALAR = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q",
                11: "q", 12: "d"}


@dataclass(frozen=True)
class GGUFView:
    """What a GGUF file says, read without epi: metadata scalars (arrays are None), and per
    tensor its type name, ggml shape (ne) and data size in bytes."""

    meta: dict[str, Any]
    types: dict[str, str]
    shapes: dict[str, list[int]]
    nbytes: dict[str, int]


def gguf_view(path: Path) -> GGUFView:
    """Parse `path`'s header and check that every tensor's size tiles the data section."""
    import gguf

    with open(path, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        pos = 0

        def take(fmt: str) -> Any:
            nonlocal pos
            (value,) = struct.unpack_from("<" + fmt, buf, pos)
            pos += struct.calcsize("<" + fmt)
            return value

        def string() -> bytes:
            nonlocal pos
            n = take("Q")
            pos += n
            return bytes(buf[pos - n:pos])

        def value(vtype: int) -> Any:
            nonlocal pos
            if vtype in _GGUF_SCALAR:
                return take(_GGUF_SCALAR[vtype])
            if vtype == 8:
                return string().decode()
            assert vtype == 9, vtype
            etype, count = take("I"), take("Q")
            if etype in _GGUF_SCALAR:
                pos += count * struct.calcsize("<" + _GGUF_SCALAR[etype])
            else:
                for _ in range(count):
                    value(etype)
            return None

        assert buf[:4] == b"GGUF"
        pos = 4
        assert take("I") >= 2
        n_tensors, n_kv = take("Q"), take("Q")
        meta = {}
        for _ in range(n_kv):
            key = string().decode()
            meta[key] = value(take("I"))
        infos = []
        for _ in range(n_tensors):
            name = string().decode()
            dims = [take("Q") for _ in range(take("I"))]
            infos.append((name, dims, take("I"), take("Q")))
        align = int(meta.get("general.alignment") or 32)
        data_start = -(-pos // align) * align
        size = len(buf) - data_start
    types, shapes, nbytes = {}, {}, {}
    spans = []
    for name, dims, type_id, offset in infos:
        qtype = gguf.GGMLQuantizationType(type_id)
        block, type_size = gguf.GGML_QUANT_SIZES[qtype]
        assert dims[0] % block == 0, (name, qtype.name)
        n_elements = 1
        for d in dims:
            n_elements *= d
        assert offset % align == 0, (name, offset)
        spans.append((offset, n_elements // block * type_size, name))
        types[name] = qtype.name
        shapes[name] = dims
        nbytes[name] = n_elements // block * type_size
    spans.sort()
    ends = [nxt for nxt, _, _ in spans[1:]] + [size]
    assert spans[0][0] == 0
    for (offset, n_bytes, name), end in zip(spans, ends, strict=True):
        assert 0 <= end - (offset + n_bytes) < align, (name, offset, n_bytes, end)
    return GGUFView(meta, types, shapes, nbytes)


def independent_types(path: Path) -> dict[str, str]:
    """Every tensor's stored type as the gguf package names it (no epi code involved)."""
    return gguf_view(path).types


_MADE: dict[tuple[Path, tuple[tuple[str, Any], ...]], Path] = {}


def shared_model(factory: pytest.TempPathFactory, **kwargs: Any) -> Path:
    """write_test_model(**kwargs), written once per distinct kwargs for the session (the
    factory's base folder). Callers only read it: they quantize it into their own folders."""
    from host.quant.tiny_model import write_test_model

    key = (factory.getbasetemp(), tuple(sorted(kwargs.items())))
    if key not in _MADE:
        name = "-".join(f"{k}{v}" for k, v in key[1]) or "default"
        _MADE[key] = write_test_model(factory.mktemp("shared") / f"{name}.gguf", **kwargs)
    return _MADE[key]
