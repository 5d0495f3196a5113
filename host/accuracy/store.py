"""The accuracy results store: one self-checking file per result, found by its content key.

A result (a benchmark's per-item scores, a perplexity, a cross-check run) is determined by
what went into it: the GGUF's sha256, the benchmark and the sha256 of its item set (which
carries the subset's seed), the scoring method (format, scorer version, context) and the
llama.cpp build that scored it. The store keys every entry by exactly that, never by a path
or a host, so a result scored on any machine — a Dask worker, a GPU host, another lab — is
used on every other one that asks the same question: point `EPI_ACCURACY_STORE` at a shared
directory, or copy entries between stores (they are plain files, each carrying its key).

Because an entry may come from elsewhere, it is checked on every read: its format, that its
key is the one asked for and matches its recorded hash, that its result matches its recorded
sha256, and that a benchmark result is consistent with its key (one record per item, gold
inside the choices). A foreign or inconsistent entry is refused with one line naming the
file and the problem (`StoreError`), never used.
"""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
import json
import math
import os
import socket
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

from epi import __version__
from epi.core.files import write_json_atomic
from epi.formats.json_types import JSON
from host.errors import StoreError

FORMAT = "epi-accuracy-store"
FORMAT_VERSION = 1
ENV = "EPI_ACCURACY_STORE"
#: an entry larger than this is refused unread (the largest real one, 14,042 MMLU items with
#: 4 choices, is about 1 MB)
MAX_ENTRY_BYTES = 64 * 1024 * 1024

Key = Mapping[str, JSON]


#: the llama.cpp build that scores benchmark items, when it is not this process's (a Dask
#: cluster's workers); None: this process's own build
_benchmark_build: contextvars.ContextVar[dict[str, JSON] | None] = contextvars.ContextVar(
    "benchmark_build", default=None)


def store_root() -> Path:
    """`$EPI_ACCURACY_STORE`, else `epi_home()/cache/store`."""
    env = os.environ.get(ENV)
    if env:
        return Path(env)
    from epi.core.paths import epi_home

    return epi_home() / "cache" / "store"


def build_identity() -> dict[str, JSON]:
    """The llama.cpp build of this process: llama-cpp-python version, CMake flags, and the
    layers it offloads to a GPU (which change the arithmetic too)."""
    from host.accuracy.scorer import gpu_layers
    from host.llama.install import build_flags

    try:
        from host.accuracy.llama_load import import_llama_cpp

        llama_cpp = import_llama_cpp()

        version = str(getattr(llama_cpp, "__version__", "unknown"))
    except ImportError:
        version = "missing"
    return {"llama_cpp_python": version, "build_flags": list(build_flags()),
            "gpu_layers": gpu_layers()}


@contextlib.contextmanager
def benchmark_build(build: dict[str, JSON]) -> Iterator[None]:
    """Within this block, benchmark results are keyed by `build` (the workers' llama.cpp
    that scored them), not by this process's own."""
    token = _benchmark_build.set(dict(build))
    try:
        yield
    finally:
        _benchmark_build.reset(token)


def full_key(key: Key) -> dict[str, JSON]:
    """`key` with the scoring build added under `llama_build` (unless it names one)."""
    out = dict(key)
    if "llama_build" not in out:
        override = _benchmark_build.get()
        use = override if override is not None and out.get("kind") == "benchmark" else None
        out["llama_build"] = use if use is not None else build_identity()
    return out


def canonical(obj: object) -> bytes:
    """The one byte form that is hashed: sorted keys, no spaces, no NaN."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), allow_nan=False).encode()


def digest(obj: object) -> str:
    return hashlib.sha256(canonical(obj)).hexdigest()


def entry_path(key: Key, root: Path | None = None) -> Path:
    """Where the entry for a full key lives: by model, then kind and key hash."""
    model = str(key.get("model_sha256") or "nomodel")[:16]
    kind = str(key.get("benchmark") or key.get("kind") or "result")
    safe = "".join(c if c.isalnum() or c in "_-" else "_" for c in kind)[:40]
    return (root or store_root()) / model / f"{safe}-{digest(key)[:32]}.json"


def _differing_field(want: Key, got: object) -> str:
    if not isinstance(got, dict):
        return "key is not an object"
    for name in sorted(set(want) | set(got)):
        if want.get(name) != got.get(name):
            return f"key field {name!r} is {got.get(name)!r}, asked for {want.get(name)!r}"
    return "key differs"


def _check_benchmark(result: Mapping[str, object], key: Key) -> str | None:
    """The first inconsistency of a benchmark result with its key, or None."""
    records = result.get("records")
    if not isinstance(records, list):
        return "field 'result.records' missing or not a list"
    n = key.get("n")
    if isinstance(n, int) and len(records) != n:
        return f"field 'result.records' has {len(records)} records, the key says n={n}"
    seen: set[str] = set()
    for i, rec in enumerate(records):
        where = f"field 'result.records[{i}]'"
        if not isinstance(rec, dict):
            return f"{where} is not an object"
        rid, gold, scores = rec.get("id"), rec.get("gold"), rec.get("scores")
        if not isinstance(rid, str) or rid in seen:
            return f"{where}.id is missing, not text or repeated"
        seen.add(rid)
        if not isinstance(scores, list) or len(scores) < 2:
            return f"{where}.scores: expected a list of at least 2 choices"
        for s in scores:
            if (not isinstance(s, list) or len(s) != 3
                    or not all(isinstance(v, (int, float)) and not isinstance(v, bool)
                               and math.isfinite(v) for v in s)):
                return f"{where}.scores: expected [logprob, n_tokens, n_bytes] numbers"
        if not isinstance(gold, int) or isinstance(gold, bool) or not 0 <= gold < len(scores):
            return f"{where}.gold is not a choice index"
    seconds, n_ctx = result.get("seconds"), result.get("n_ctx")
    if not isinstance(seconds, (int, float)) or isinstance(seconds, bool) or not seconds >= 0:
        return "field 'result.seconds' missing or negative"
    ctx = key.get("ctx")
    if not isinstance(n_ctx, int) or (isinstance(ctx, int) and n_ctx < ctx):
        return "field 'result.n_ctx' missing or smaller than the key's ctx"
    return None


def check_entry(path: Path, doc: object, key: Key) -> dict[str, JSON]:
    """The entry's result if `doc` is a sound entry for exactly `key`; else `StoreError`."""

    def refuse(problem: str) -> StoreError:
        return StoreError(f"{path}: accuracy store entry refused: {problem} (delete the file "
                          "or run with --no-cache)")

    if not isinstance(doc, dict):
        raise refuse("not a JSON object")
    if doc.get("format") != FORMAT:
        raise refuse(f"field 'format' is {doc.get('format')!r}, expected {FORMAT!r}")
    if doc.get("format_version") != FORMAT_VERSION:
        raise refuse(f"field 'format_version' is {doc.get('format_version')!r}, this epi "
                     f"reads {FORMAT_VERSION}")
    if doc.get("key") != dict(key):
        raise refuse(_differing_field(key, doc.get("key")))
    if doc.get("key_sha256") != digest(doc["key"]):
        raise refuse("field 'key_sha256' does not match the key")
    result = doc.get("result")
    if not isinstance(result, dict):
        raise refuse("field 'result' missing or not an object")
    try:
        result_sha = digest(result)
    except ValueError:
        raise refuse("field 'result' holds NaN or infinity") from None
    if doc.get("result_sha256") != result_sha:
        raise refuse("field 'result_sha256' does not match the result (edited or corrupt)")
    if key.get("kind") == "benchmark":
        problem = _check_benchmark(result, key)
        if problem:
            raise refuse(problem)
    return result


def load(key: Key, root: Path | None = None) -> dict[str, JSON] | None:
    """The stored result for exactly `key` (a full key), None when there is none;
    `StoreError` (one line) when the file there must not be used."""
    path = entry_path(key, root)
    try:
        size = path.stat().st_size
    except OSError:
        return None
    if size > MAX_ENTRY_BYTES:
        raise StoreError(f"{path}: accuracy store entry refused: {size} bytes, more than "
                         f"{MAX_ENTRY_BYTES} (delete the file or run with --no-cache)")
    try:
        doc = json.loads(path.read_bytes())
    except OSError:
        return None
    except (ValueError, RecursionError):
        raise StoreError(f"{path}: accuracy store entry refused: not valid JSON (delete the "
                         "file or run with --no-cache)") from None
    return check_entry(path, doc, key)


def save(key: Key, result: Mapping[str, object], root: Path | None = None) -> Path:
    """Write the entry for a full key atomically; its origin is recorded, not keyed."""
    path = entry_path(key, root)
    path.parent.mkdir(parents=True, exist_ok=True)
    doc = {
        "format": FORMAT, "format_version": FORMAT_VERSION,
        "key": dict(key), "key_sha256": digest(dict(key)),
        "result": dict(result), "result_sha256": digest(dict(result)),
        "origin": {"host": socket.gethostname(), "epi_version": __version__,
                   "created_real_ns": time.time_ns()},
    }
    write_json_atomic(path, doc)
    return path
