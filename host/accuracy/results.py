"""The accuracy results file (`format: "epi-accuracy"`, version 1; docs/formats.md §4).

Written by `epi accuracy`, read by the EPI analysis, which joins it with token logs on the
model's sha256. `read_results` is the reader the analysis should use: it refuses an unknown
format or a newer version with one line naming the file.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from epi.core.errors import UserError
from host.accuracy.cache import atomic_write_json

FORMAT = "epi-accuracy"
FORMAT_VERSION = 1
MODEL_KEYS = ("path", "sha256", "map_id", "perplexity", "benchmarks", "composite")


def write_results(path: Path, doc: dict[str, Any]) -> Path:
    """Write the results document atomically (a reader never sees half a file)."""
    check_document(doc, str(path))
    atomic_write_json(Path(path), doc)
    return Path(path)


def check_document(doc: Any, where: str) -> dict[str, Any]:
    """Validate the top level and every model entry; one line per problem."""
    if not isinstance(doc, dict):
        raise UserError(f"{where}: not a JSON object")
    if doc.get("format") != FORMAT:
        raise UserError(f"{where}: field 'format': expected {FORMAT!r}, got {doc.get('format')!r}")
    version = doc.get("format_version")
    if not isinstance(version, int) or version < 1:
        raise UserError(f"{where}: field 'format_version': bad value {version!r}")
    if version > FORMAT_VERSION:
        raise UserError(f"{where}: field 'format_version': {version} is newer than this epi "
                        f"reads ({FORMAT_VERSION}); upgrade epi")
    models = doc.get("models")
    if not isinstance(models, list):
        raise UserError(f"{where}: field 'models': expected a list")
    for i, m in enumerate(models):
        if not isinstance(m, dict):
            raise UserError(f"{where}: models[{i}]: expected an object")
        for key in MODEL_KEYS:
            if key not in m:
                raise UserError(f"{where}: models[{i}]: field {key!r} missing")
        if not isinstance(m["sha256"], str) or len(m["sha256"]) != 64:
            raise UserError(f"{where}: models[{i}]: field 'sha256': not a sha256 hex digest")
    return doc


def read_results(path: Path) -> dict[str, Any]:
    """Read and validate an `epi-accuracy` file."""
    path = Path(path)
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        raise UserError(f"{path}: accuracy results file not found") from None
    except ValueError as exc:
        raise UserError(f"{path}: malformed JSON ({exc})") from exc
    return check_document(doc, str(path))


def accuracy_by_sha256(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """{model sha256: model entry} — the join the EPI analysis makes with token logs."""
    return {m["sha256"]: m for m in doc["models"]}


def item_outcomes(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Per-item correctness under each ranking, for paired comparisons between models.

    `{"ids": [item id, ...], "accuracy": [0/1, ...], "accuracy_norm": [...],
    "accuracy_token_norm": [...]}` in the scored order: two models scored on the same items
    can then be compared item by item (McNemar; docs/analysis.md) instead of as two
    independent intervals.
    """
    from host.accuracy.multiple_choice import METRICS, predictions

    out: dict[str, Any] = {"ids": [str(r["id"]) for r in records]}
    chosen = [predictions(r["scores"]) for r in records]
    for metric, key in METRICS.items():
        out[key] = [int(c[metric] == r["gold"]) for c, r in zip(chosen, records, strict=True)]
    return out


def outcomes_by_item(block: dict[str, Any], metric: str) -> dict[str, int] | None:
    """{item id: 1 if right} of one benchmark entry under `metric`; None when not stored."""
    items = block.get("items")
    if not isinstance(items, dict) or not isinstance(items.get(metric), list):
        return None
    ids = items.get("ids")
    if not isinstance(ids, list) or len(ids) != len(items[metric]):
        return None
    return {str(i): int(v) for i, v in zip(ids, items[metric], strict=True)}
