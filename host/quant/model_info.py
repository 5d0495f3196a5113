"""What the runner must know about a GGUF before running it: is it one, its identity and shape.

Reads only the file header, never loads weights into llama.cpp, so every problem with the model
path is found before a run directory is created.
"""

from __future__ import annotations

import io
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from epi.core.errors import UserError
from epi.formats.manifests import quant_manifest_beside
from host.quant.gguf_info import sha256_file

GGUF_MAGIC = b"GGUF"


@dataclass(frozen=True)
class ModelFacts:
    """Identity and shape of one GGUF model."""

    path: Path
    sha256: str
    architecture: str
    n_layers: int
    n_params: int
    context_length: int
    map_id: str | None


def check_gguf(path: Path) -> Path:
    """The resolved path of an existing GGUF file, or a one-line UserError."""
    path = Path(path)
    if not path.exists():
        raise UserError(f"{path}: model file not found")
    if not path.is_file():
        raise UserError(f"{path}: model path is not a file")
    try:
        with open(path, "rb") as fh:
            magic = fh.read(4)
    except OSError as exc:
        raise UserError(f"{path}: cannot read model file ({exc.strerror})") from None
    if magic != GGUF_MAGIC:
        raise UserError(f"{path}: not a GGUF file (starts with {magic!r}, expected b'GGUF')")
    return path.resolve()




def manifest_map_id(model: Path) -> str | None:
    """The map id from `epi quantize`'s manifest next to the model (`STEM.manifest.json`);
    None when there is none or it is a model manifest."""
    try:
        manifest = quant_manifest_beside(model)
    except UserError as exc:
        raise UserError(f"{exc}; fix it or pass --map-id") from None
    return None if manifest is None else str(manifest["map_id"])


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
    """Just enough of a GGUF parser for metadata scalars and tensor shapes.

    gguf.GGUFReader materialises every array (a 49k-token vocabulary takes seconds); this
    skips arrays and reads only what the runner records, in milliseconds.
    """

    def __init__(self, fh: BinaryIO) -> None:
        self.fh = fh

    def _unpack(self, fmt: str) -> Any:
        size = struct.calcsize("<" + fmt)
        data = self.fh.read(size)
        if len(data) != size:
            raise ValueError("file ends inside the GGUF header")
        return struct.unpack("<" + fmt, data)[0]

    def string(self) -> str:
        n = self._unpack("Q")
        data = self.fh.read(n)
        if len(data) != n:
            raise ValueError("file ends inside a GGUF string")
        return data.decode("utf-8", errors="replace")

    def value(self, vtype: int) -> Any:
        if vtype in _SCALAR:
            return self._unpack(_SCALAR[vtype])
        if vtype == _STRING:
            return self.string()
        if vtype == _ARRAY:
            etype, count = self._unpack("I"), self._unpack("Q")
            if etype in _SCALAR:
                self.fh.seek(count * struct.calcsize("<" + _SCALAR[etype]), 1)
            elif etype == _STRING:
                for _ in range(count):
                    self.fh.seek(self._unpack("Q"), 1)
            else:
                for _ in range(count):
                    self.value(etype)
            return None  # arrays are skipped
        raise ValueError(f"unknown GGUF value type {vtype}")


def read_gguf_header(path: Path) -> tuple[dict[str, Any], int]:
    """Scalar metadata of a GGUF (arrays skipped) and its total number of tensor elements."""
    with open(path, "rb") as raw:
        fh = io.BufferedReader(raw, buffer_size=1 << 16)
        r = _HeaderReader(fh)
        if fh.read(4) != GGUF_MAGIC:
            raise ValueError("not a GGUF file")
        version = r._unpack("I")
        if version < 2:
            raise ValueError(f"GGUF version {version} is too old")
        n_tensors, n_kv = r._unpack("Q"), r._unpack("Q")
        meta: dict[str, Any] = {}
        for _ in range(n_kv):
            key = r.string()
            meta[key] = r.value(r._unpack("I"))
        n_elements = 0
        for _ in range(n_tensors):
            r.string()
            n_dims = r._unpack("I")
            count = 1
            for _ in range(n_dims):
                count *= r._unpack("Q")
            r._unpack("I")  # type
            r._unpack("Q")  # offset
            n_elements += count
    return meta, n_elements


def model_facts(path: Path, map_id: str | None = None) -> ModelFacts:
    """Check and describe a GGUF: sha256, architecture, layer count, parameters, context."""
    path = check_gguf(path)
    try:
        meta, n_params = read_gguf_header(path)
    except (ValueError, OSError, UnicodeDecodeError) as exc:
        raise UserError(f"{path}: unreadable GGUF header ({exc})") from None

    def field(name: str) -> Any:
        if meta.get(name) is None:
            raise UserError(f"{path}: GGUF metadata key {name!r} is missing")
        return meta[name]

    arch = str(field("general.architecture"))
    return ModelFacts(
        path=path,
        sha256=sha256_file(path),
        architecture=arch,
        n_layers=int(field(f"{arch}.block_count")),
        n_params=n_params,
        context_length=int(field(f"{arch}.context_length")),
        map_id=map_id if map_id is not None else manifest_map_id(path),
    )
