"""Model hashes and cached results under `epi_home()/cache`.

A result is stored under a key of everything that determines it — model sha256, benchmark,
data+subset hash, settings, scorer version — so a changed model, data file, subset or setting
never reads an old result. Model hashes are remembered per (path, size, mtime) so a 270 MB
model is hashed once, not on every run.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from pathlib import Path
from typing import Any

from epi.core.files import write_json_atomic
from epi.core.paths import epi_home
from host.gguf_io.file import sha256_file

SCORER_VERSION = 2  # bump when a change to the scoring could change a cached number


def cache_root() -> Path:
    return epi_home() / "cache"


def atomic_write_json(path: Path, obj: Any) -> None:
    """Create the directory, then write JSON atomically (epi.core.files.write_json_atomic)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(path, obj)


file_sha256 = sha256_file  # the project's one streamed file hash (host.gguf_io.file)


def model_sha256(path: Path) -> str:
    """sha256 of a model file, remembered per (real path, size, mtime_ns)."""
    path = Path(path)
    st = path.stat()
    memo_path = cache_root() / "sha256.json"
    key = f"{path.resolve()}|{st.st_size}|{st.st_mtime_ns}"
    try:
        memo = json.loads(memo_path.read_text())
    except (OSError, ValueError):
        memo = {}
    if isinstance(memo.get(key), str):
        return memo[key]
    digest = file_sha256(path)
    memo[key] = digest
    # the memo is an optimisation; a read-only cache must not stop an evaluation
    with contextlib.suppress(OSError):
        atomic_write_json(memo_path, memo)
    return digest


def key_hash(key: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()


def result_path(key: dict[str, Any]) -> Path:
    model = str(key.get("model_sha256", "nomodel"))[:16]
    kind = str(key.get("benchmark") or key.get("kind") or "result")
    return cache_root() / "accuracy" / model / f"{kind}-{key_hash(key)[:24]}.json"


def load_result(key: dict[str, Any]) -> dict[str, Any] | None:
    """The cached result for exactly this key, or None."""
    path = result_path(key)
    try:
        stored = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(stored, dict) or stored.get("key") != key:
        return None
    result = stored.get("result")
    return result if isinstance(result, dict) else None


def store_result(key: dict[str, Any], result: dict[str, Any]) -> Path:
    path = result_path(key)
    atomic_write_json(path, {"key": key, "result": result})
    return path
