"""Model hashes, and the accuracy results store as evaluate.py calls it.

A result is stored under a key of everything that determines it — model sha256, benchmark,
item-set hash (subset and seed), settings, scorer version, and the llama.cpp build that scored
it — so a changed model, data file, subset, setting or build never reads an old result, and
the same question asked on another machine finds it (host/accuracy/store.py: entries keyed by
content, checked on every read). Model hashes are remembered per (path, size, mtime) so a
270 MB model is hashed once, not on every run.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from epi.core.files import write_json_atomic
from epi.core.paths import epi_home
from epi.formats.json_types import JSON
from host.accuracy import store
from host.gguf_io.file import sha256_file

SCORER_VERSION = 2  # bump when a change to the scoring could change a cached number


def cache_root() -> Path:
    return epi_home() / "cache"


def atomic_write_json(path: Path, obj: object) -> None:
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


def load_result(key: Mapping[str, JSON]) -> dict[str, Any] | None:
    """The stored result for exactly this key plus the scoring llama.cpp build (store.py),
    None when there is none; a foreign or inconsistent entry is a one-line `StoreError`.

    Typed `Any` at this boundary: a result's shape depends on its kind (records, perplexity
    figures, a tool run); store.check_entry has checked the benchmark shape, and each caller
    in evaluate.py reads the fields of its own kind."""
    return store.load(store.full_key(key))


def store_result(key: Mapping[str, JSON], result: Mapping[str, object]) -> Path:
    """Keep `result` in the store under `key` plus the scoring llama.cpp build."""
    return store.save(store.full_key(key), result)
