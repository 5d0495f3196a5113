"""Is a path a GGUF file, and what is its content hash (models are compared and joined by it)."""

from __future__ import annotations

import hashlib
from pathlib import Path

from epi.core.errors import UserError

GGUF_MAGIC = b"GGUF"


def check_gguf(path: Path | str) -> Path:
    """The resolved path of an existing GGUF file, or a one-line UserError naming the problem."""
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
        raise UserError(f"{path}: not a GGUF file (starts with {magic!r}, expected {GGUF_MAGIC!r})")
    return path.resolve()


def sha256_file(path: Path | str, chunk_bytes: int = 1 << 22) -> str:
    """Content hash of a file, streamed in `chunk_bytes` pieces."""
    h = hashlib.sha256()
    with Path(path).open("rb") as f:
        while block := f.read(chunk_bytes):
            h.update(block)
    return h.hexdigest()
