"""A GGUF header (metadata, tensor infos), read without the `gguf` package.

gguf.GGUFReader materialises every array (a 49k-token vocabulary takes seconds); this skips
arrays and reads only the scalars a run records, in milliseconds. Layout: the gguf spec
(magic, version, tensor count, key/value count, key/values, tensor infos).
"""

from __future__ import annotations

import io
import math
import os
import struct
from collections.abc import Container
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Union

from host.gguf_io.file import GGUF_MAGIC

# A metadata value as read here: arrays are skipped and read as None.
Scalar = Union[int, float, bool, str, None]

# GGUF value types (gguf spec): id → struct format of one scalar; 8 = string, 9 = array.
_SCALAR = {
    0: "B",
    1: "b",
    2: "H",
    3: "h",
    4: "I",
    5: "i",
    6: "f",
    7: "?",
    10: "Q",
    11: "q",
    12: "d",
}
_STRING, _ARRAY = 8, 9


class _HeaderReader:
    """Just enough of a GGUF parser for metadata scalars and tensor shapes."""

    def __init__(self, fh: BinaryIO) -> None:
        self.fh = fh
        self.size = os.fstat(fh.fileno()).st_size

    def _room(self, n: int, what: str) -> None:
        """Refuse a length that runs past the end of the file before reading or seeking it:
        a hostile 2**63 would otherwise be a MemoryError or an OverflowError, not one line."""
        if n > self.size - self.fh.tell():
            raise ValueError(f"a GGUF {what} of {n} bytes runs past the end of the file")

    def _skip(self, n: int, what: str) -> None:
        self._room(n, what)
        self.fh.seek(n, 1)

    def _unpack(self, fmt: str) -> int | float | bool:
        size = struct.calcsize("<" + fmt)
        data = self.fh.read(size)
        if len(data) != size:
            raise ValueError("file ends inside the GGUF header")
        value: int | float | bool = struct.unpack("<" + fmt, data)[0]
        return value

    def uint(self, fmt: str) -> int:
        """An unsigned count or id (fmt "I" or "Q")."""
        return int(self._unpack(fmt))

    def string(self) -> str:
        n = self.uint("Q")
        self._room(n, "string")
        data = self.fh.read(n)
        if len(data) != n:
            raise ValueError("file ends inside a GGUF string")
        return data.decode("utf-8", errors="replace")

    def value(self, vtype: int) -> Scalar:
        if vtype in _SCALAR:
            return self._unpack(_SCALAR[vtype])
        if vtype == _STRING:
            return self.string()
        if vtype == _ARRAY:
            etype, count = self.uint("I"), self.uint("Q")
            if etype in _SCALAR:
                self._skip(count * struct.calcsize("<" + _SCALAR[etype]), "array")
            elif etype == _STRING:
                for _ in range(count):
                    self._skip(self.uint("Q"), "string")
            else:
                for _ in range(count):
                    self.value(etype)
            return None  # arrays are skipped
        raise ValueError(f"unknown GGUF value type {vtype}")


class SkippedArray:
    """Stands for a metadata array, which is skipped, not read."""

    def __repr__(self) -> str:
        return "<array>"


SKIPPED_ARRAY = SkippedArray()


@dataclass(frozen=True)
class RawTensor:
    """One tensor info of the header, as stored."""

    name: str
    dims: list[int]  # ggml order: dims[0] is the row length
    type_id: int
    offset: int  # from the start of the data section


@dataclass(frozen=True)
class GgufHeader:
    """A GGUF header: metadata (arrays as SKIPPED_ARRAY), tensor infos, where it ends."""

    version: int
    meta: dict[str, Scalar | SkippedArray]
    tensors: list[RawTensor]
    end_of_header: int  # byte offset just after the last tensor info


def parse_gguf_header(path: Path, versions: Container[int] = range(2, 1 << 32)) -> GgufHeader:
    """The header of the GGUF at `path`, arrays skipped: the one header parser of epi
    (read_gguf_header's scalars and host.quant.gguf_info's tensor table both come from it).

    A version outside `versions` is refused before anything after it is read (version 1 laid
    out its counts differently). A truncated or malformed header, or a metadata key given
    twice, raises ValueError; the caller names the file.
    """
    with open(path, "rb") as raw:
        fh = io.BufferedReader(raw, buffer_size=1 << 16)
        r = _HeaderReader(fh)
        if fh.read(4) != GGUF_MAGIC:
            raise ValueError("not a GGUF file")
        version = r.uint("I")
        if version not in versions:
            raise ValueError(f"GGUF version {version} cannot be read")
        n_tensors, n_kv = r.uint("Q"), r.uint("Q")
        meta: dict[str, Scalar | SkippedArray] = {}
        for _ in range(n_kv):
            key = r.string()
            if key in meta:
                raise ValueError(f"duplicate metadata key {key!r}")
            vtype = r.uint("I")
            value = r.value(vtype)
            meta[key] = SKIPPED_ARRAY if vtype == _ARRAY else value
        tensors = []
        for _ in range(n_tensors):
            name = r.string()
            dims = [r.uint("Q") for _ in range(r.uint("I"))]
            tensors.append(RawTensor(name, dims, r.uint("I"), r.uint("Q")))
        return GgufHeader(version, meta, tensors, fh.tell())


def read_gguf_header(path: Path) -> tuple[dict[str, Scalar], int]:
    """Scalar metadata of a GGUF (arrays read as None) and its total number of tensor elements.

    A truncated or malformed header raises ValueError; the caller names the file.
    """
    header = parse_gguf_header(path)
    meta = {k: (None if isinstance(v, SkippedArray) else v) for k, v in header.meta.items()}
    return meta, sum(math.prod(t.dims) for t in header.tensors)
