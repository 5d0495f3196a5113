"""Mix map validation and expansion: every error is one line naming file, field and problem."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from epi.core.errors import UserError
from host.quant.mixmap import assign_layers, expand, load_mixmap, load_mixmaps, parse_mixmap
from host.quant.quant_types import ModelShape, apply_fallback, rule_type

REPO = Path(__file__).resolve().parents[2]
STUDY = REPO / "quantmaps"


def base_map(**changes) -> dict:
    raw = {
        "format": "epi-mixmap",
        "format_version": 1,
        "id": "t",
        "description": "test",
        "base_type": "Q4_K_M",
        "groups": [
            {"name": "early", "fraction": 0.25, "type": "Q6_K"},
            {"name": "middle", "fraction": 0.5, "type": "Q4_K_M"},
            {"name": "late", "fraction": 0.25, "type": "Q3_K_S"},
        ],
        "non_block": {"token_embd": "Q4_K_M", "output": "Q6_K"},
    }
    raw.update(changes)
    return raw


def write(tmp_path: Path, raw, name: str = "m.json") -> Path:
    path = tmp_path / name
    path.write_text(raw if isinstance(raw, str) else json.dumps(raw))
    return path


def error_of(tmp_path: Path, raw, n_layers: int | None = None) -> str:
    path = write(tmp_path, raw)
    with pytest.raises(UserError) as exc:
        m = load_mixmap(path)
        if n_layers is not None:
            assign_layers(m, n_layers)
    msg = str(exc.value)
    assert "\n" not in msg
    assert msg.startswith(str(path))
    return msg


def test_study_maps_all_valid_and_24() -> None:
    maps, notices = load_mixmaps([STUDY])
    assert len(maps) == 24
    assert sum(m.id.startswith("uniform_") for m in maps) == 6
    # mix_high_middle and mix_bookend_low are one map under two names
    assert len(notices) == 1
    assert "mix_high_middle" in notices[0] and "mix_bookend_low" in notices[0]


def test_study_maps_on_32_layers_are_0_7_8_23_24_31() -> None:
    m = load_mixmap(STUDY / "mix_high_early.json")
    groups = dict(assign_layers(m, 32))
    assert groups["early"] == list(range(0, 8))
    assert groups["middle"] == list(range(8, 24))
    assert groups["late"] == list(range(24, 32))


def test_fractions_apply_proportionally_to_30_layers() -> None:
    groups = dict(assign_layers(load_mixmap(STUDY / "mix_high_early.json"), 30))
    assert groups["early"] == list(range(0, 8))
    assert groups["middle"] == list(range(8, 23))
    assert groups["late"] == list(range(23, 30))
    assert sum(len(v) for v in groups.values()) == 30


def test_invalid_json(tmp_path: Path) -> None:
    assert "invalid JSON at line 1" in error_of(tmp_path, "{not json")


def test_unknown_top_key(tmp_path: Path) -> None:
    assert "colour: unknown key" in error_of(tmp_path, base_map(colour="red"))


def test_unknown_group_key(tmp_path: Path) -> None:
    raw = base_map()
    raw["groups"][1]["typ"] = "Q4_0"
    assert "groups[1]: unknown key 'typ'" in error_of(tmp_path, raw)


def test_unknown_quant_type(tmp_path: Path) -> None:
    raw = base_map()
    raw["groups"][0]["type"] = "Q7_K"
    assert "groups[0].type: unknown quant type 'Q7_K'" in error_of(tmp_path, raw)


def test_overlapping_groups(tmp_path: Path) -> None:
    raw = base_map(groups=[{"name": "a", "layers": ["0-4"], "type": "Q4_0"},
                           {"name": "b", "layers": [4, 5, 6, 7], "type": "Q8_0"}])
    assert "groups[1].layers: layer 4 is also in group 'a'" in error_of(tmp_path, raw)


def test_layers_missing_from_every_group(tmp_path: Path) -> None:
    raw = base_map(groups=[{"name": "a", "layers": ["0-3"], "type": "Q4_0"},
                           {"name": "b", "layers": [6, 7], "type": "Q8_0"}])
    msg = error_of(tmp_path, raw, n_layers=8)
    assert "groups: layers 4-5 of the 8-layer model are in no group" in msg


def test_layer_beyond_depth(tmp_path: Path) -> None:
    raw = base_map(groups=[{"name": "a", "layers": ["0-31"], "type": "Q4_0"}])
    assert "layer 8 is beyond the model's 8 layers" in error_of(tmp_path, raw, n_layers=8)


def test_fractions_not_summing_to_one(tmp_path: Path) -> None:
    raw = base_map()
    raw["groups"][2]["fraction"] = 0.3
    assert "groups: fractions sum to 1.05, not 1" in error_of(tmp_path, raw)


def test_empty_group_by_layers(tmp_path: Path) -> None:
    raw = base_map(groups=[{"name": "a", "layers": [], "type": "Q4_0"}])
    assert "groups[0].layers: empty group" in error_of(tmp_path, raw)


def test_empty_group_by_fraction_on_shallow_model(tmp_path: Path) -> None:
    raw = base_map(groups=[{"name": "a", "fraction": 0.05, "type": "Q4_0"},
                           {"name": "b", "fraction": 0.95, "type": "Q8_0"}])
    assert "groups[0].fraction: empty group" in error_of(tmp_path, raw, n_layers=8)


def test_duplicate_id(tmp_path: Path) -> None:
    write(tmp_path, base_map(), "a.json")
    write(tmp_path, base_map(description="other"), "b.json")
    with pytest.raises(UserError, match=r"b\.json: id: duplicate id 't'"):
        load_mixmaps([tmp_path])


def test_missing_non_block_is_an_error(tmp_path: Path) -> None:
    raw = base_map(non_block={"token_embd": "Q8_0"})
    assert "non_block: missing 'output'" in error_of(tmp_path, raw)


def test_unknown_format_version(tmp_path: Path) -> None:
    assert "format_version: unsupported version 2" in error_of(tmp_path, base_map(format_version=2))


def test_unknown_override_kind(tmp_path: Path) -> None:
    raw = base_map()
    raw["groups"][0]["overrides"] = {"mlp": "Q8_0"}
    assert "groups[0].overrides: unknown tensor kind 'mlp'" in error_of(tmp_path, raw)


def tensors_of(n_layers: int, width: int, n_ff: int):
    from host.quant.mixmap import TensorInfo

    out = [TensorInfo("token_embd.weight", width, width * 1000, 2)]
    for i in range(n_layers):
        out.append(TensorInfo(f"blk.{i}.attn_norm.weight", width, width, 1))
        for kind in ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up"):
            out.append(TensorInfo(f"blk.{i}.{kind}.weight", width, width * width, 2))
        out.append(TensorInfo(f"blk.{i}.ffn_down.weight", n_ff, width * n_ff, 2))
    out.append(TensorInfo("output.weight", width, width * 1000, 2))
    return out


def test_overrides_within_a_group() -> None:
    raw = base_map(groups=[{"name": "all", "fraction": 1.0, "type": "Q4_0",
                            "overrides": {"attn": "Q8_0", "attn_v": "F16"}}])
    m = parse_mixmap(raw, Path("x.json"))
    exp = expand(m, ModelShape(4, 4, 4, True), tensors_of(4, 256, 512))
    by_name = {t.name: t.requested for t in exp.tensors}
    assert by_name["blk.2.attn_q.weight"] == "Q8_0"
    assert by_name["blk.2.attn_v.weight"] == "F16"
    assert by_name["blk.2.ffn_up.weight"] == "Q4_0"
    assert by_name["output.weight"] == "Q6_K"  # Q6_K file type rule for output


def test_type_not_applicable_warns_with_fallback() -> None:
    # width 576 (SmolLM2): K-quants fit only ffn_down (row length 1536)
    m = load_mixmap(STUDY / "uniform_q4km.json")
    exp = expand(m, ModelShape(30, 9, 3, False), tensors_of(30, 576, 1536))
    expected = {t.name: t.expected for t in exp.tensors}
    assert expected["blk.0.attn_q.weight"] == "Q5_0"  # Q4_K -> Q5_0 fallback
    assert expected["blk.0.ffn_down.weight"] == "Q6_K"  # use_more_bits layer keeps Q6_K
    assert expected["blk.1.ffn_down.weight"] == "Q6_K"
    assert expected["blk.4.ffn_down.weight"] == "Q4_K"  # (4 - 30//8) % 3 != 2
    assert exp.warnings == []  # every requested type fits some tensor


def test_warning_when_a_type_fits_no_tensor_of_the_group() -> None:
    raw = base_map(groups=[{"name": "all", "fraction": 1.0, "type": "Q8_0",
                            "overrides": {"attn": "Q4_K"}}])
    m = parse_mixmap(raw, Path("x.json"))
    exp = expand(m, ModelShape(30, 9, 3, False), tensors_of(30, 576, 1536))
    assert len(exp.warnings) == 1
    assert "all: type Q4_K applies to no tensor" in exp.warnings[0]
    assert "will write Q5_0 instead for 120 tensor(s)" in exp.warnings[0]


def test_rule_type_matches_llama_cpp_examples() -> None:
    shape = ModelShape(32, 32, 8, True)  # n_gqa 4
    assert rule_type("Q2_K", "blk.3.attn_v.weight", shape, 4096) == "Q4_K"
    assert rule_type("Q2_K", "blk.3.ffn_down.weight", shape, 4096) == "Q3_K"
    assert rule_type("Q4_K_M", "blk.0.attn_v.weight", shape, 4096) == "Q6_K"
    assert rule_type("Q4_K_M", "blk.5.attn_v.weight", shape, 4096) == "Q4_K"
    assert rule_type("Q4_K_M", "blk.6.attn_v.weight", shape, 4096) == "Q6_K"  # (6-4)%3 == 2
    assert rule_type("Q3_K_S", "output.weight", shape, 4096) == "Q6_K"
    assert rule_type("Q8_0", "output.weight", shape, 4096) == "Q8_0"
    assert apply_fallback("Q6_K", 576) == "Q8_0"
    assert apply_fallback("Q2_K", 576) == "Q4_0"
    assert apply_fallback("Q4_0", 100) == "F16"
