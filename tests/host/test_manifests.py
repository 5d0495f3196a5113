"""The typed manifests (epi/formats/manifests.py): a hand-written document reads into the
record it describes, writes back unchanged, and every off-type field is one line naming the
file and the field."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from epi.core.errors import UserError
from epi.formats.manifests import (
    ModelManifest,
    QuantManifest,
    quant_manifest_beside,
    read_any_manifest,
    read_model_manifest,
    read_quant_manifest,
)

# Written by hand after docs/mixmaps.md's key table, not by the writer under test.
QUANT_DOC: dict[str, object] = {
    "format": "epi-quant-manifest", "format_version": 1,
    "map_id": "mix_high_early", "map_file": "quantmaps/mix_high_early.json", "map_form": "epi",
    "map": {"id": "mix_high_early", "base_type": "Q4_K_M"},
    "inputs": {"map_sha256": "aa", "base_sha256": "bb", "rules_version": 2,
               "llama_cpp": {"llama_cpp_python": "0.3.36", "build_flags": [], "rpc": True}},
    "epi_version": "0.9.0",
    "base": {"path": "/m/base.gguf", "sha256": "cd" * 32, "n_layers": 2, "n_params": 1000,
             "requantized": False},
    "output": {"path": "/m/q.gguf", "sha256": "ef" * 32, "size_bytes": 4321},
    "llama_cpp": {"llama_cpp_python": "0.3.36", "build_flags": [], "rpc": True},
    "file_type": "Q4_K_M", "quantize_seconds": 1.25,
    "layer_groups": [
        {"name": "early", "layers": [0], "n_weights": 400, "effective_types": {"Q6_K": 7},
         "bits_per_weight": 6.5625, "layers_text": "0", "map_type": "Q6_K"},
        {"name": "late", "layers": [1], "n_weights": 400, "effective_types": {"Q5_0": 1},
         "bits_per_weight": 5.5, "layers_text": "1", "map_type": "Q4_K"},
        {"name": "non_block", "layers": [], "n_weights": 200, "effective_types": {"Q8_0": 1},
         "bits_per_weight": 8.5, "layers_text": "", "map_type": {"token_embd": "Q8_0"}},
    ],
    "total": {"n_weights": 1000, "bits_per_weight": 6.0, "tensor_bytes": 750},
    "differs_from_request": True,
    "fallbacks": [{"name": "blk.1.ffn_down.weight", "requested": "Q4_K", "effective": "Q5_0"}],
    "unpredicted": [],
    "warnings": ["late: Q4_K does not fit blk.1.ffn_down.weight"],
    "moe": None,
    "tensors": [
        {"name": "blk.1.ffn_down.weight", "role": "ffn", "group": "late", "map_type": "Q4_K",
         "requested": "Q4_K", "effective": "Q5_0", "fallback": True, "predicted": "Q5_0",
         "n_weights": 400, "bits_per_weight": 5.5},
        {"name": "blk.1.attn_norm.weight", "role": "norm", "group": "late", "map_type": None,
         "requested": None, "effective": "F32", "fallback": False, "predicted": None,
         "n_weights": 8, "bits_per_weight": 32.0},
    ],
}

MODEL_DOC: dict[str, object] = {
    "format": "epi-model-manifest", "format_version": 1, "size_bytes": 270_000_000,
    "n_params": 134_515_008, "n_layers": 30, "name": "smollm2", "description": "SmolLM2",
    "license": "Apache-2.0",
    "source": {"package": "p", "version": "1", "member": "m.gguf", "wheel_sha256": "a",
               "source_gguf_sha256": "b"},
    "path": "/m/smollm2.gguf", "sha256": "c", "file_type": "F16", "architecture": "llama",
    "n_embd": 576, "n_head": 9, "n_head_kv": 3, "tied_output": True, "prepare_seconds": 30.5,
}


def _write(tmp_path: Path, doc: object, name: str = "q.manifest.json") -> Path:
    p = tmp_path / name
    p.write_text(json.dumps(doc))
    return p


def test_quant_manifest_reads_typed_and_writes_back_unchanged(tmp_path: Path) -> None:
    m = read_quant_manifest(_write(tmp_path, QUANT_DOC))
    assert m.map_id == "mix_high_early" and m.output.size_bytes == 4321
    assert m.total.bits_per_weight == 6.0 and m.base is not None and m.base.n_layers == 2
    assert [g.name for g in m.block_groups()] == ["early", "late"]
    assert m.layer_groups[2].map_type == {"token_embd": "Q8_0"}
    assert m.fallbacks[0].effective == "Q5_0" and m.tensors[1].requested is None
    assert m.to_json() == QUANT_DOC


def test_model_manifest_reads_typed_and_writes_back_unchanged(tmp_path: Path) -> None:
    m = read_model_manifest(_write(tmp_path, MODEL_DOC))
    assert (m.n_layers, m.n_embd, m.license) == (30, 576, "Apache-2.0")
    assert m.source is not None and m.source.member == "m.gguf"
    assert m.to_json() == MODEL_DOC
    assert isinstance(read_any_manifest(_write(tmp_path, MODEL_DOC)), ModelManifest)
    assert isinstance(read_any_manifest(_write(tmp_path, QUANT_DOC)), QuantManifest)


def test_a_minimal_quant_manifest_reads_with_empty_defaults(tmp_path: Path) -> None:
    """Hand-made and early manifests carry only map_id (docs/formats.md §3: the rest optional)."""
    m = read_quant_manifest(_write(tmp_path, {"format": "epi-quant-manifest",
                                              "format_version": 1, "map_id": "x"}))
    assert m.layer_groups == [] and m.output.size_bytes is None and m.base is None


def test_beside_a_model_a_model_manifest_means_no_quant_manifest(tmp_path: Path) -> None:
    model = tmp_path / "smollm2.gguf"
    assert quant_manifest_beside(model) is None
    _write(tmp_path, MODEL_DOC, "smollm2.manifest.json")
    assert quant_manifest_beside(model) is None
    _write(tmp_path, QUANT_DOC, "smollm2.manifest.json")
    beside = quant_manifest_beside(model)
    assert beside is not None and beside.map_id == "mix_high_early"


def _set(doc: dict[str, object], path: tuple[str | int, ...], value: object
         ) -> dict[str, object]:
    out = copy.deepcopy(doc)
    node: object = out
    for key in path[:-1]:
        node = node[key]  # type: ignore[index]  # walking a hand-written JSON document
    node[path[-1]] = value  # type: ignore[index]
    return out


QUANT_BAD = [
    (("map_id",), "../x", "map_id"),
    (("base",), [], "base"),
    (("base", "requantized"), "no", "requantized"),
    (("base", "n_layers"), 0, "n_layers"),
    (("output", "size_bytes"), -1, "size_bytes"),
    (("quantize_seconds",), "slow", "quantize_seconds"),
    (("layer_groups", 0, "layers"), "0-3", "layers"),
    (("layer_groups", 0, "layers_text"), 3, "layers_text"),
    (("layer_groups", 2, "map_type", "token_embd"), 8, "token_embd"),
    (("total", "bits_per_weight"), 99.0, "bits_per_weight"),
    (("differs_from_request",), 1, "differs_from_request"),
    (("fallbacks", 0, "effective"), None, "effective"),
    (("unpredicted",), "blk.0", "unpredicted"),
    (("warnings",), [3], "warnings[0]"),
    (("moe",), "dense", "moe"),
    (("tensors", 0, "fallback"), "yes", "fallback"),
    (("tensors", 1, "n_weights"), 2.5, "n_weights"),
]


@pytest.mark.parametrize(("path", "value", "names"), QUANT_BAD)
def test_quant_manifest_field_errors_are_one_line(tmp_path: Path, path: tuple[str | int, ...],
                                                  value: object, names: str) -> None:
    p = _write(tmp_path, _set(QUANT_DOC, path, value))
    with pytest.raises(UserError) as info:
        read_quant_manifest(p)
    msg = str(info.value)
    assert "\n" not in msg and str(p) in msg and names in msg


@pytest.mark.parametrize(("key", "value"), [("n_layers", 0), ("n_params", "many"),
                                            ("source", {"package": "p"}), ("tied_output", 1),
                                            ("n_embd", -3), ("size_bytes", None)])
def test_model_manifest_field_errors_are_one_line(tmp_path: Path, key: str, value: object
                                                  ) -> None:
    p = _write(tmp_path, _set(MODEL_DOC, (key,), value))
    with pytest.raises(UserError) as info:
        read_model_manifest(p)
    msg = str(info.value)
    assert "\n" not in msg and str(p) in msg and key in msg
