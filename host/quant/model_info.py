"""What the runner must know about a GGUF before running it: is it one, its identity and shape.

Reads only the file header, never loads weights into llama.cpp, so every problem with the model
path is found before a run directory is created.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from epi.core.errors import UserError
from epi.formats.manifests import quant_manifest_beside
from host.gguf_io.file import check_gguf, sha256_file
from host.gguf_io.header import Scalar, read_gguf_header


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


def manifest_map_id(model: Path) -> str | None:
    """The map id from `epi quantize`'s manifest next to the model (`STEM.manifest.json`);
    None when there is none or it is a model manifest."""
    try:
        manifest = quant_manifest_beside(model)
    except UserError as exc:
        raise UserError(f"{exc}; fix it or pass --map-id") from None
    return None if manifest is None else manifest.map_id


def model_facts(path: Path, map_id: str | None = None) -> ModelFacts:
    """Check and describe a GGUF: sha256, architecture, layer count, parameters, context."""
    path = check_gguf(path)
    try:
        meta, n_params = read_gguf_header(path)
    except (ValueError, OSError, UnicodeDecodeError) as exc:
        raise UserError(f"{path}: unreadable GGUF header ({exc})") from None

    def field(name: str) -> Scalar:
        if meta.get(name) is None:
            raise UserError(f"{path}: GGUF metadata key {name!r} is missing")
        return meta[name]

    def count(name: str) -> int:
        value = field(name)
        if isinstance(value, str) or (isinstance(value, float) and not value.is_integer()):
            raise UserError(f"{path}: GGUF metadata key {name!r}: expected a whole number, "
                            f"got {value!r:.40}")
        return int(value or 0)

    arch = str(field("general.architecture"))
    return ModelFacts(
        path=path,
        sha256=sha256_file(path),
        architecture=arch,
        n_layers=count(f"{arch}.block_count"),
        n_params=n_params,
        context_length=count(f"{arch}.context_length"),
        map_id=map_id if map_id is not None else manifest_map_id(path),
    )
