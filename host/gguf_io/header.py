"""A GGUF header's scalar metadata and tensor element count, read without the `gguf` package.

gguf.GGUFReader materialises every array (a 49k-token vocabulary takes seconds); this skips
arrays and reads only the scalars a run records, in milliseconds. Layout: the gguf spec
(magic, version, tensor count, key/value count, key/values, tensor infos).
"""

from __future__ import annotations

import io
import struct
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
                self.fh.seek(count * struct.calcsize("<" + _SCALAR[etype]), 1)
            elif etype == _STRING:
                for _ in range(count):
                    self.fh.seek(self.uint("Q"), 1)
            else:
                for _ in range(count):
                    self.value(etype)
            return None  # arrays are skipped
        raise ValueError(f"unknown GGUF value type {vtype}")


def read_gguf_header(path: Path) -> tuple[dict[str, Scalar], int]:
    """Scalar metadata of a GGUF (arrays skipped) and its total number of tensor elements.

    A truncated or malformed header raises ValueError; the caller names the file.
    """
    with open(path, "rb") as raw:
        fh = io.BufferedReader(raw, buffer_size=1 << 16)
        r = _HeaderReader(fh)
        if fh.read(4) != GGUF_MAGIC:
            raise ValueError("not a GGUF file")
        version = r.uint("I")
        if version < 2:
            raise ValueError(f"GGUF version {version} is too old")
        n_tensors, n_kv = r.uint("Q"), r.uint("Q")
        meta: dict[str, Scalar] = {}
        for _ in range(n_kv):
            key = r.string()
            meta[key] = r.value(r.uint("I"))
        n_elements = 0
        for _ in range(n_tensors):
            r.string()
            n_dims = r.uint("I")
            count = 1
            for _ in range(n_dims):
                count *= r.uint("Q")
            r.uint("I")  # type
            r.uint("Q")  # offset
            n_elements += count
    return meta, n_elements
