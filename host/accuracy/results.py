"""The accuracy results file (`format: "epi-accuracy"`, version 1; docs/formats.md §4).

Written by `epi accuracy`, read by the EPI analysis, which joins it with token logs on the
model's sha256. `read_results` is the reader the analysis should use: it refuses an unknown
format or a newer version with one line naming the file.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from epi.core.errors import UserError
from epi.formats.fields import check_float, check_id, check_int, check_str, read_json_object
from host.accuracy.cache import atomic_write_json
from host.accuracy.consistency import check_consistency
from host.accuracy.join_keys import entry_join_key

if TYPE_CHECKING:
    from host.accuracy.multiple_choice import ItemRecord

FORMAT = "epi-accuracy"
FORMAT_VERSION = 1
MODEL_KEYS = ("path", "sha256", "map_id", "perplexity", "benchmarks", "composite")

#: An `epi-accuracy` document (docs/formats.md §4) as plain dicts. `check_document` and
#: `check_consistency` check every field before a reader gets one; its readers (the commands,
#: the campaign, the analysis) index the nested blocks directly, so their values are unchecked
#: by mypy in this one alias rather than narrowed again at each read.
AccuracyDocument = dict[str, Any]
ModelEntry = dict[str, Any]  # one `models[i]` of an AccuracyDocument (same reason)


def write_results(path: Path, doc: AccuracyDocument) -> Path:
    """Write the results document atomically (a reader never sees half a file)."""
    check_document(doc, str(path))
    atomic_write_json(Path(path), doc)
    return Path(path)


def check_document(doc: object, where: str) -> AccuracyDocument:
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
        check_model_entry(m, f"{where}: models[{i}]")
    return doc


ACCURACY_KEYS = (("accuracy", "ci95"), ("accuracy_norm", "ci95_norm"),
                 ("accuracy_token_norm", "ci95_token_norm"))


def _check_accuracy(block: Mapping[str, object], where: str, value_key: str, ci_key: str
                    ) -> None:
    """An accuracy in [0, 1] (or null) and its interval [lo, hi] ⊂ [0, 1] around it."""
    acc = check_float(block.get(value_key), f"{where}.{value_key}", lo=0.0, hi=1.0,
                      null_ok=True)
    ci = block.get(ci_key)
    if ci is None:
        return
    if not isinstance(ci, list) or len(ci) != 2:
        raise UserError(f"{where}.{ci_key}: expected [lower, upper] or null, got {ci!r}")
    lo = check_float(ci[0], f"{where}.{ci_key}[0]", lo=0.0, hi=1.0)
    hi = check_float(ci[1], f"{where}.{ci_key}[1]", lo=0.0, hi=1.0)
    if lo > hi or (acc is not None and not lo <= acc <= hi):
        raise UserError(f"{where}.{ci_key}: interval {ci!r} contradicts {value_key} {acc!r} "
                        "(need lower ≤ accuracy ≤ upper)")


def _check_items(items: object, where: str) -> None:
    """Per-item outcomes (optional): unique string ids and, per ranking, one 0/1 per id."""
    if items is None:
        return
    if not isinstance(items, dict):
        raise UserError(f"{where}: expected an object or absent")
    ids = items.get("ids")
    if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
        raise UserError(f"{where}.ids: expected a list of item id strings")
    if len(set(ids)) != len(ids):
        raise UserError(f"{where}.ids: item ids repeat")
    for key, values in items.items():
        if key == "ids":
            continue
        if not isinstance(values, list) or len(values) != len(ids):
            raise UserError(f"{where}.{key}: expected a list of {len(ids)} outcomes (one per id)")
        if not all(type(v) is int and v in (0, 1) for v in values):
            raise UserError(f"{where}.{key}: outcomes must be 0 or 1")


def _check_sha(value: object, where: str) -> str:
    if not (isinstance(value, str) and re.fullmatch(r"[0-9a-f]{64}", value)):
        raise UserError(f"{where}: not a sha256 hex digest")
    return value


def _check_split(split: object, sha: str, where: str) -> None:
    """A split entry's `split` block: both phases' sha256; the prefill one is the entry's."""
    if split is None:
        return
    if not isinstance(split, dict):
        raise UserError(f"{where}: field split: expected an object or absent")
    for phase in ("prefill", "decode"):
        block = split.get(phase)
        if not isinstance(block, dict):
            raise UserError(f"{where}: field split.{phase}: expected an object")
        _check_sha(block.get("sha256"), f"{where}: field 'split.{phase}.sha256'")
    if split["prefill"]["sha256"] != sha:
        raise UserError(f"{where}: field 'split.prefill.sha256' differs from the entry's "
                        "sha256 (the prefill model is the entry's model)")


def check_model_entry(m: Mapping[str, object], where: str) -> None:
    """Every field of a model entry that a reader uses: types, ranges, finiteness."""
    sha = _check_sha(m["sha256"], f"{where}: field 'sha256'")
    _check_split(m.get("split"), sha, where)
    check_str(m["path"], f"{where}: field path")
    check_id(m["map_id"], f"{where}: field map_id", null_ok=True)
    ppl = m["perplexity"]
    if ppl is not None:
        if not isinstance(ppl, dict):
            raise UserError(f"{where}: field perplexity: expected an object or null")
        check_float(ppl.get("ppl"), f"{where}: field perplexity.ppl", lo=1.0, hi=1e12,
                    null_ok=True)
    benches = m["benchmarks"]
    if not isinstance(benches, dict):
        raise UserError(f"{where}: field benchmarks: expected an object")
    for name, block in benches.items():
        w = f"{where}: field benchmarks.{name}"
        if not isinstance(block, dict):
            raise UserError(f"{w}: expected an object")
        check_int(block.get("n"), f"{w}.n", lo=0, null_ok=True)
        for value_key, ci_key in ACCURACY_KEYS:
            _check_accuracy(block, w, value_key, ci_key)
        _check_items(block.get("items"), f"{w}.items")
    comp = m["composite"]
    if comp is not None:
        w = f"{where}: field composite"
        if not isinstance(comp, dict):
            raise UserError(f"{w}: expected an object or null")
        _check_accuracy(comp, w, "accuracy", "ci95")
        weights = comp.get("weights") or {}
        if not isinstance(weights, dict):
            raise UserError(f"{w}.weights: expected an object")
        for k, v in weights.items():
            check_float(v, f"{w}.weights.{k}", lo=0.0, hi=1e6)


def read_results(path: Path) -> AccuracyDocument:
    """Read and validate an `epi-accuracy` file."""
    path = Path(path)
    doc = read_json_object(path, "accuracy results file")
    checked = check_document(doc, str(path))
    check_consistency(checked, str(path))
    return checked


def accuracy_by_sha256(doc: AccuracyDocument) -> dict[str, ModelEntry]:
    """{join key: model entry} — the join the EPI analysis makes with token logs: an unsplit
    model's sha256, a split configuration's `join_key` (`run_join_key` gives a run's)."""
    return {entry_join_key(m): m for m in doc["models"]}


def figure(block: Mapping[str, object], key: str, what: str) -> float:
    """A number of a result block (fresh, or read back from the store or a file): anything
    else is a one-line `UserError` naming `what` and the field."""
    value = block.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise UserError(f"{what}: field {key!r} is not a number: {value!r:.40}")
    return float(value)


def item_outcomes(records: Sequence[ItemRecord]) -> dict[str, list[str] | list[int]]:
    """Per-item correctness under each ranking, for paired comparisons between models.

    `{"ids": [item id, ...], "accuracy": [0/1, ...], "accuracy_norm": [...],
    "accuracy_token_norm": [...]}` in the scored order: two models scored on the same items
    can then be compared item by item (McNemar; docs/analysis.md) instead of as two
    independent intervals.
    """
    from host.accuracy.multiple_choice import METRICS, predictions

    out: dict[str, list[str] | list[int]] = {"ids": [str(r["id"]) for r in records]}
    chosen = [predictions(r["scores"]) for r in records]
    for metric, key in METRICS.items():
        out[key] = [int(c[metric] == r["gold"]) for c, r in zip(chosen, records, strict=True)]
    return out


def outcomes_by_item(block: Mapping[str, object], metric: str) -> dict[str, int] | None:
    """{item id: 1 if right} of one benchmark entry under `metric`; None when not stored."""
    items = block.get("items")
    if not isinstance(items, dict) or not isinstance(items.get(metric), list):
        return None
    ids = items.get("ids")
    if not isinstance(ids, list) or len(ids) != len(items[metric]):
        return None
    return {str(i): int(v) for i, v in zip(ids, items[metric], strict=True)}
