"""What a search state (search.json) describes, so a resumed search uses only its own.

A search continues from OUT/search.json. A state copied from another search (another base
model, other hand-made maps, other measuring options or another llama.cpp build) would put
numbers measured elsewhere into this search's fit, frontier and verdict. The state therefore
carries the identity of what it describes; a state whose identity differs from this run's is
refused in one line, naming the first field that differs.

The model is identified by its size and the SHA-256 of its first and last 16 MiB (the GGUF
header, tensor table and first weights, and the last weights): hashing a whole 16 GB base file
on every resume would take minutes, and a different model file differs in those bytes.
Options that only say how far to search (budget, candidates, per round) are not bound: raising
them to continue a finished search is what resuming is for.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import TypedDict

from epi.core.errors import UserError
from epi.formats.json_types import JSON, JSONObject

SAMPLE_BYTES = 16 << 20  # hashed at each end of the base model
FLOAT_TYPES = ("F32", "F16", "BF16")


class ModelIdentity(TypedDict):
    """search.json `identity.model`: which base model the state's measurements came from."""

    size_bytes: int
    ends_sha256: str


def model_identity(path: Path) -> ModelIdentity:
    """Size and SHA-256 of the first and last SAMPLE_BYTES of the model file."""
    try:
        size = path.stat().st_size
        h = hashlib.sha256()
        with path.open("rb") as f:
            h.update(f.read(SAMPLE_BYTES))
            if size > SAMPLE_BYTES:
                f.seek(max(SAMPLE_BYTES, size - SAMPLE_BYTES))
                h.update(f.read(SAMPLE_BYTES))
    except OSError as exc:
        raise UserError(f"{path}: cannot read the base model ({exc.strerror})") from None
    return {"size_bytes": size, "ends_sha256": h.hexdigest()}


def maps_identity(maps: list[Path]) -> dict[str, str]:
    """File name → SHA-256 of each hand-made map's bytes."""
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(maps)}


def search_identity(base: Path, maps: list[Path], options: Mapping[str, object],
                    build: Mapping[str, object]) -> dict[str, JSON]:
    """The identity a state of this search must carry (plain JSON values)."""
    doc = {"model": model_identity(base), "maps": maps_identity(maps),
           "options": dict(options), "llama_cpp": dict(build)}
    out = json.loads(json.dumps(doc, default=str))  # tuples/paths as a reload will see them
    assert isinstance(out, dict)
    return out


def first_difference(stored: object, wanted: object, where: str = "") -> str | None:
    """'field: stored X, this run Y' for the first place two JSON values differ, else None."""
    if isinstance(stored, dict) and isinstance(wanted, dict):
        for key in sorted(set(stored) | set(wanted), key=str):
            sub = f"{where}.{key}" if where else str(key)
            if key not in stored or key not in wanted:
                return (f"{sub}: {'absent' if key not in stored else 'present'} in the state, "
                        f"{'absent' if key not in wanted else 'present'} in this run")
            found = first_difference(stored[key], wanted[key], sub)
            if found is not None:
                return found
        return None
    if stored != wanted:
        return f"{where or 'identity'}: state has {stored!r:.60}, this run {wanted!r:.60}"
    return None


def check_identity(stored: JSONObject | None, wanted: JSONObject,
                   has_work: bool, path: Path) -> None:
    """Refuse a state that describes another search (or cannot say what it describes)."""
    if not has_work:
        return  # nothing measured yet: the state is this run's from now on
    if stored is None:
        raise UserError(f"{path}: this search state does not say which model, maps, options "
                        "and llama.cpp build it describes (its 'identity' is missing: not written "
                        "by this version's epi search, but by hand or by an older one); use a "
                        "new --out, or remove it to search again")
    diff = first_difference(stored, wanted)
    if diff is not None:
        raise UserError(f"{path}: describes another search ({diff}); use a new --out, or "
                        "remove it to search again")


def check_unquantized(tensor_types: Mapping[str, str], path: Path) -> None:
    """Refuse a base whose weights are already quantized: every map would be requantized from
    it, so its figures would describe a double quantization, not the maps' types."""
    quantized = sorted({t for t in tensor_types.values() if t not in FLOAT_TYPES})
    if quantized:
        raise UserError(f"{path}: the search's base must be unquantized (F32/F16/BF16); its "
                        f"weights are {', '.join(quantized)}")
