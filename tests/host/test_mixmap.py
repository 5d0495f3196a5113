"""Mix map validation and expansion: every error is one line naming file, field and problem."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

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


# ---- the study paper's own map form ------------------------------------------------------

# The study's config ids, row by row as its quantization matrix lists them (early, middle, late).
PAPER_TABLE = [
    ("uniform_q2k", "Q2_K", "Q2_K", "Q2_K"),
    ("uniform_q3ks", "Q3_K_S", "Q3_K_S", "Q3_K_S"),
    ("uniform_q4km", "Q4_K_M", "Q4_K_M", "Q4_K_M"),
    ("uniform_q5km", "Q5_K_M", "Q5_K_M", "Q5_K_M"),
    ("uniform_q6k", "Q6_K", "Q6_K", "Q6_K"),
    ("uniform_q8", "Q8_0", "Q8_0", "Q8_0"),
    ("mix_high_early", "Q6_K", "Q4_K_M", "Q3_K_S"),
    ("mix_high_late", "Q3_K_S", "Q4_K_M", "Q6_K"),
    ("mix_high_middle", "Q3_K_S", "Q6_K", "Q3_K_S"),
    ("mix_gradient_down", "Q6_K", "Q5_K_M", "Q4_K_M"),
    ("mix_gradient_up", "Q4_K_M", "Q5_K_M", "Q6_K"),
    ("mix_extreme_early", "Q8_0", "Q4_K_M", "Q2_K"),
    ("mix_extreme_late", "Q2_K", "Q4_K_M", "Q8_0"),
    ("mix_bookend_high", "Q6_K", "Q3_K_S", "Q6_K"),
    ("mix_bookend_low", "Q3_K_S", "Q6_K", "Q3_K_S"),
    ("mix_q5_q4", "Q5_K_M", "Q4_K_M", "Q4_K_M"),
    ("mix_q4_q5", "Q4_K_M", "Q4_K_M", "Q5_K_M"),
    ("mix_q6_q4_q4", "Q6_K", "Q4_K_M", "Q4_K_M"),
    ("mix_q4_q4_q6", "Q4_K_M", "Q4_K_M", "Q6_K"),
    ("mix_q4_q6_q4", "Q4_K_M", "Q6_K", "Q4_K_M"),
    ("mix_q5_q3_q5", "Q5_K_M", "Q3_K_S", "Q5_K_M"),
    ("mix_q3_q5_q3", "Q3_K_S", "Q5_K_M", "Q3_K_S"),
    ("mix_q6_q3_q4", "Q6_K", "Q3_K_S", "Q4_K_M"),
    ("mix_q4_q3_q6", "Q4_K_M", "Q3_K_S", "Q6_K"),
]

# The paper's example, character for character as it prints the form (layer lists spelled out).
PAPER_TEXT = (
    '{"config_id": "mix_high_early", "model": "llama-3.1-8b", "layer_groups": ['
    '{"layers": [0, 1, 2, 3, 4, 5, 6, 7], "quant": "Q6_K"}, '
    '{"layers": [8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23], '
    '"quant": "Q4_K_M"}, '
    '{"layers": [24, 25, 26, 27, 28, 29, 30, 31], "quant": "Q3_K_S"}]}'
)


def paper_map(**changes) -> dict:
    raw = json.loads(PAPER_TEXT)
    raw.update(changes)
    return raw


def test_shipped_map_ids_are_the_papers_config_ids() -> None:
    maps, _ = load_mixmaps([STUDY])
    assert {m.id for m in maps} == {row[0] for row in PAPER_TABLE}
    for config_id, early, middle, late in PAPER_TABLE:
        m = load_mixmap(STUDY / f"{config_id}.json")
        groups = dict(assign_layers(m, 32))
        by_layer = {n: g.type for g in m.groups for n in groups[g.name]}
        assert (by_layer[0], by_layer[8], by_layer[31]) == (early, middle, late), config_id


def test_paper_map_as_printed_is_read(tmp_path: Path) -> None:
    m = load_mixmap(write(tmp_path, PAPER_TEXT))
    assert (m.id, m.form, m.base_type) == ("mix_high_early", "paper", "Q4_K_M")
    assert [(g.name, g.layers, g.type) for g in m.groups] == [
        ("early", tuple(range(8)), "Q6_K"),
        ("middle", tuple(range(8, 24)), "Q4_K_M"),
        ("late", tuple(range(24, 32)), "Q3_K_S"),
    ]
    assert m.non_block == {"token_embd": "Q4_K_M", "output": "Q4_K_M"}


@pytest.mark.parametrize("config_id", [row[0] for row in PAPER_TABLE])
def test_paper_files_expand_like_the_shipped_maps_on_32_layers(config_id: str) -> None:
    """quantmaps/paper/ID.json (paper form) requests the same type for every tensor of a
    32-layer GQA model as the shipped quantmaps/ID.json (epi form)."""
    paper = load_mixmap(STUDY / "paper" / f"{config_id}.json")
    shipped = load_mixmap(STUDY / f"{config_id}.json")
    assert paper.id == shipped.id == config_id and paper.form == "paper"
    shape = ModelShape(32, 32, 8, True)
    tensors = tensors_of(32, 4096, 14336)
    ours = [(t.name, t.requested) for t in expand(paper, shape, tensors).tensors]
    theirs = [(t.name, t.requested) for t in expand(shipped, shape, tensors).tensors]
    assert ours == theirs
    assert paper.base_type == shipped.base_type


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"colour": "red"}, "colour: unknown key (allowed: config_id, layer_groups, model)"),
        ({"config_id": "-help"}, "config_id: expected 1-128 ASCII letters"),
        ({"config_id": ".hidden"}, "config_id: expected 1-128 ASCII letters"),
        ({"model": 3}, "model: expected a short model name"),
        ({"layer_groups": []}, "layer_groups: expected a non-empty list"),
        ({"layer_groups": [{"layers": [0], "quant": "Q7_K"}]},
         "layer_groups[0].quant: unknown quant type 'Q7_K'"),
        ({"layer_groups": [{"layers": [0]}]}, "layer_groups[0]: missing key 'quant'"),
        ({"layer_groups": [{"layers": [0], "quant": "Q8_0", "type": "Q8_0"}]},
         "layer_groups[0]: unknown key 'type'"),
        ({"layer_groups": [{"layers": [0, 1], "quant": "Q8_0"}, {"layers": [1], "quant": "Q4_0"}]},
         "layer_groups[1].layers: layer 1 is also in group 'group0'"),
        ({"layer_groups": [{"layers": [], "quant": "Q8_0"}]},
         "layer_groups[0].layers: empty group"),
    ],
)
def test_paper_form_errors_name_its_own_fields(tmp_path: Path, change: dict, expected: str) -> None:
    assert expected in error_of(tmp_path, paper_map(**change))


def test_paper_form_checked_against_the_model(tmp_path: Path) -> None:
    msg = error_of(tmp_path, PAPER_TEXT, n_layers=30)
    assert "layer_groups[2].layers: layer 30 is beyond the model's 30 layers" in msg
    raw = paper_map(layer_groups=[{"layers": list(range(8)), "quant": "Q8_0"}])
    assert "layer_groups: layers 8-31 of the 32-layer model are in no group" in error_of(
        tmp_path, raw, n_layers=32
    )


def test_paper_and_epi_forms_of_one_map_are_one_content(tmp_path: Path) -> None:
    write(tmp_path, PAPER_TEXT, "paper.json")
    imported = tmp_path / "imported"
    from host.quant.mixmap import import_maps

    [target] = import_maps([tmp_path / "paper.json"], imported)
    again = load_mixmap(target)
    assert again.form == "epi" and again.id == "mix_high_early"
    assert again.content_key() == load_mixmap(tmp_path / "paper.json").content_key()
    with pytest.raises(UserError, match="exists; pass --force"):
        import_maps([tmp_path / "paper.json"], imported)


# ---- hostile input: one line, exit 2, never a traceback or a silent acceptance ------------


def test_huge_layer_range_is_refused_at_once(tmp_path: Path) -> None:
    raw = base_map(groups=[{"name": "a", "layers": ["0-999999999999"], "type": "Q4_0"}])
    assert "groups[0].layers: bad layer range '0-999999999999'" in error_of(tmp_path, raw)
    raw = base_map(groups=[{"name": "a", "layers": ["0-30000000"], "type": "Q4_0"}])
    assert "groups[0].layers: bad layer range" in error_of(tmp_path, raw)
    raw = base_map(groups=[{"name": "a", "layers": ["0-20000"], "type": "Q4_0"}])
    assert "range '0-20000' goes beyond layer 9999" in error_of(tmp_path, raw)
    raw = paper_map(layer_groups=[{"layers": [10**15], "quant": "Q8_0"}])
    assert "layer_groups[0].layers: layer 1000000000000000 is outside 0-9999" in error_of(
        tmp_path, raw
    )


def test_non_utf8_and_deeply_nested_json(tmp_path: Path) -> None:
    path = tmp_path / "m.json"
    path.write_bytes(b'{"id": "\xff\xfe"}')
    with pytest.raises(UserError, match=r"m\.json: not UTF-8 text \(byte 0xff at offset 8\)"):
        load_mixmap(path)
    assert "nested too deeply" in error_of(tmp_path, "[" * 100000 + "]" * 100000)
    assert "invalid JSON" in error_of(tmp_path, '{"id": ' + "1" * 5000 + "}")


@pytest.mark.parametrize(
    "bad_id", ["-help", ".hidden", "", "a/b", "é", "a" * 129, "x\ny", "ab\n", 7]
)
def test_ids_that_make_bad_file_names_are_refused(tmp_path: Path, bad_id) -> None:
    assert "id: expected 1-128 ASCII letters" in error_of(tmp_path, base_map(id=bad_id))


def test_base_type_must_be_quantized_when_groups_are(tmp_path: Path) -> None:
    msg = error_of(tmp_path, base_map(base_type="F16"))
    assert "base_type: F16 is not a quantized file type" in msg


def test_unhashable_and_odd_values_are_one_line_errors(tmp_path: Path) -> None:
    assert "base_type: unknown llama.cpp file type ['Q4_0']" in error_of(
        tmp_path, base_map(base_type=["Q4_0"])
    )
    assert "format_version: unsupported version True" in error_of(
        tmp_path, base_map(format_version=True)
    )
    raw = base_map()
    raw["groups"][0]["fraction"] = float("nan")
    assert "groups[0].fraction: must be in (0, 1]" in error_of(tmp_path, json.dumps(raw))
    assert "'a\\nb': unknown key" in error_of(tmp_path, base_map(**{"a\nb": 1}))


# ---- generated input (hypothesis): every file is a MixMap that holds, or one clean line ----

KNOWN_TYPES = {
    "F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K",
    "Q6_K", "IQ4_NL", "Q3_K_S", "Q3_K_M", "Q3_K_L", "Q4_K_S", "Q4_K_M", "Q5_K_S", "Q5_K_M",
}
FILE_TYPE_NAMES = {
    "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K_S", "Q3_K_M", "Q3_K_L",
    "Q4_K_S", "Q4_K_M", "Q5_K_S", "Q5_K_M", "Q6_K",
}
SAFE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")

json_leaves = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=12)
json_level1 = json_leaves | st.lists(json_leaves, max_size=4) | st.dictionaries(
    st.text(max_size=8), json_leaves, max_size=4
)
json_values = json_level1 | st.lists(json_level1, max_size=3) | st.dictionaries(
    st.text(max_size=8), json_level1, max_size=3
)
types = st.sampled_from([*sorted(KNOWN_TYPES), "Q7_K", "q4_0", ""]) | json_values
layer_items = st.integers(-3, 40) | st.sampled_from(["0-7", "8-23", "24-31", "3-1", "0-99999999",
                                                      "٣-4", " 1 - 2 "]) | json_values
layer_lists = st.lists(layer_items, max_size=6) | json_values
ids = st.integers(0, 3).flatmap(
    lambda k: st.sampled_from(["mix_high_early", "uniform_q8", "ok.1", "A-2"]) if k
    else st.sampled_from(["-x", ".x", "a b", "é", "", "a/b"]) | json_values
)


def mostly(valid, hostile=json_values):
    """Valid four times in five, so generated maps also get past the first checks."""
    return st.integers(0, 4).flatmap(lambda k: valid if k else hostile)


good_types = st.sampled_from(sorted(KNOWN_TYPES))
overrides = st.dictionaries(
    st.sampled_from(["attn", "ffn", "experts", "shared_experts", "router", "attn_v", "mlp"]),
    mostly(good_types), max_size=3,
)


@st.composite
def epi_group_lists(draw):
    """Groups by fraction or by layers, mostly a partition of the depth, then perturbed."""
    if draw(st.booleans()):
        shares = draw(st.sampled_from([[1.0], [0.25, 0.5, 0.25], [0.5, 0.5], [0.3, 0.3],
                                       [0.05, 0.95]]))
        spans = [{"fraction": mostly(st.just(f))} for f in shares]
    else:
        parts = draw(st.sampled_from([[["0-7"], ["8-23"], ["24-31"]], [["0-29"]],
                                      [[0, 1, 2], ["3-5"]], [["0-3"], [3, 4]], [[0], [2]]]))
        spans = [{"layers": mostly(st.just(p), layer_lists)} for p in parts]
    groups = []
    for i, span in enumerate(spans):
        entry = {k: draw(v) for k, v in span.items()}
        entry["type"] = draw(mostly(good_types, types))
        if draw(st.booleans()):
            entry["name"] = draw(mostly(st.sampled_from(["early", "middle", "late", f"g{i}"])))
        if draw(st.integers(0, 3)) == 0:
            entry["overrides"] = draw(mostly(overrides))
        if draw(st.integers(0, 9)) == 0:
            entry[draw(st.sampled_from(["colour", "fraction", "layers"]))] = draw(json_values)
        groups.append(entry)
    return groups


epi_maps = st.fixed_dictionaries(
    {
        "format": mostly(st.just("epi-mixmap")),
        "format_version": mostly(st.just(1)),
        "id": ids,
        "base_type": mostly(st.sampled_from(sorted(FILE_TYPE_NAMES))),
        "groups": mostly(epi_group_lists()),
        "non_block": mostly(st.fixed_dictionaries({"token_embd": mostly(good_types, types),
                                                   "output": mostly(good_types, types)})),
    },
    optional={
        "moe": mostly(st.dictionaries(st.sampled_from(["router", "shared_experts"]),
                                      mostly(good_types), max_size=2)),
        "description": mostly(st.text(max_size=20)),
    },
)


@st.composite
def paper_group_lists(draw):
    parts = draw(st.sampled_from([[list(range(8)), list(range(8, 24)), list(range(24, 32))],
                                  [list(range(30))], [[0, 1], [1, 2]], [["0-3"], [4, 5]]]))
    groups = []
    for part in parts:
        entry = {"layers": draw(mostly(st.just(part), layer_lists)),
                 "quant": draw(mostly(good_types, types))}
        if draw(st.integers(0, 9)) == 0:
            entry[draw(st.sampled_from(["name", "quant", "layers"]))] = draw(json_values)
        groups.append(entry)
    return groups


paper_maps = st.fixed_dictionaries(
    {"config_id": ids, "layer_groups": mostly(paper_group_lists())},
    optional={"model": mostly(st.just("llama-3.1-8b"))},
)


def check_accepted(m, raw) -> None:
    """What a map that loads must satisfy, checked without the code under test."""
    assert SAFE_ID.fullmatch(m.id)
    assert m.base_type in FILE_TYPE_NAMES
    assert m.groups
    for g in m.groups:
        assert g.type in KNOWN_TYPES
        assert all(t in KNOWN_TYPES for t in g.overrides.values())
    assert all(t in KNOWN_TYPES for t in m.non_block.values())
    assert set(m.non_block) == {"token_embd", "output"}
    if m.groups[0].fraction is not None:
        assert all(0 < g.fraction <= 1 for g in m.groups)
        assert abs(sum(g.fraction for g in m.groups) - 1) < 1e-6
    else:
        layers = [n for g in m.groups for n in g.layers]
        assert layers and len(layers) == len(set(layers))
        assert all(isinstance(n, int) and 0 <= n < 10_000 for n in layers)
    if m.form == "paper":
        assert set(raw) <= {"config_id", "model", "layer_groups"}
        assert len(m.groups) == len(raw["layer_groups"])
    else:
        assert set(raw) <= {"format", "format_version", "id", "description", "base_type",
                            "groups", "non_block", "moe"}
        assert raw["format"] == "epi-mixmap" and raw["format_version"] == 1


def load_or_error(path: Path):
    try:
        return load_mixmap(path), None
    except UserError as exc:
        msg = str(exc)
        assert "\n" not in msg and msg.startswith(str(path)), msg
        return None, msg


@pytest.mark.long
@settings(max_examples=500, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(raw=epi_maps | paper_maps | json_values, n_layers=st.integers(1, 48))
def test_generated_maps_load_cleanly_or_fail_in_one_line(tmp_path: Path, raw, n_layers) -> None:
    path = tmp_path / "gen.json"
    path.write_text(json.dumps(raw))
    m, _ = load_or_error(path)
    if m is None:
        return
    check_accepted(m, raw)
    try:
        groups = assign_layers(m, n_layers)
    except UserError as exc:
        assert "\n" not in str(exc) and str(exc).startswith(str(path))
        return
    assigned = sorted(n for _, ls in groups for n in ls)
    assert assigned == list(range(n_layers))


@settings(max_examples=200, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.binary(max_size=64) | st.text(max_size=64).map(str.encode))
def test_generated_bytes_load_cleanly_or_fail_in_one_line(tmp_path: Path, data: bytes) -> None:
    path = tmp_path / "gen.json"
    path.write_bytes(data)
    m, _ = load_or_error(path)
    assert m is None  # no short random byte string is a valid map


# ---- mixture-of-experts expansion ---------------------------------------------------------


def moe_tensors(n_layers: int, shared: bool = False):
    from host.quant.mixmap import TensorInfo

    out = [TensorInfo("token_embd.weight", 2048, 2048 * 1000, 2, "F16")]
    for i in range(n_layers):
        p = f"blk.{i}."
        out.append(TensorInfo(p + "attn_norm.weight", 2048, 2048, 1, "F32"))
        for kind in ("attn_q", "attn_k", "attn_v", "attn_output"):
            out.append(TensorInfo(p + kind + ".weight", 2048, 2048 * 512, 2, "F16"))
        out.append(TensorInfo(p + "ffn_gate_inp.weight", 2048, 2048 * 128, 2, "F32"))
        out.append(TensorInfo(p + "ffn_gate_exps.weight", 2048, 2048 * 768 * 128, 3, "F16"))
        out.append(TensorInfo(p + "ffn_up_exps.weight", 2048, 2048 * 768 * 128, 3, "F16"))
        out.append(TensorInfo(p + "ffn_down_exps.weight", 768, 2048 * 768 * 128, 3, "F16"))
        if shared:
            out.append(TensorInfo(p + "ffn_up_shexp.weight", 2048, 2048 * 768, 2, "F16"))
            out.append(TensorInfo(p + "ffn_down_shexp.weight", 768, 2048 * 768, 2, "F16"))
    out.append(TensorInfo("output.weight", 2048, 2048 * 1000, 2, "F16"))
    return out


def test_moe_overrides_precedence() -> None:
    raw = base_map(
        groups=[{"name": "all", "fraction": 1.0, "type": "Q4_K",
                 "overrides": {"ffn": "Q8_0", "experts": "Q5_0", "ffn_down_exps": "Q6_K",
                               "ffn_up_shexp": "Q4_0"}}],
        moe={"shared_experts": "Q5_1", "router": "F16"},
    )
    m = parse_mixmap(raw, Path("x.json"))
    exp = expand(m, ModelShape(2, 32, 4, True, 128), moe_tensors(2, shared=True))
    t = {p.name: p for p in exp.tensors}
    assert t["blk.1.ffn_gate_exps.weight"].requested == "Q5_0"  # experts beats ffn
    assert t["blk.1.ffn_down_exps.weight"].requested == "Q6_K"  # kind beats family
    assert t["blk.1.ffn_up_shexp.weight"].requested == "Q4_0"  # group kind beats map-wide moe
    assert t["blk.1.ffn_down_shexp.weight"].requested == "Q8_0"  # group 'ffn' beats map-wide
    assert t["blk.1.attn_q.weight"].requested == "Q4_K"
    router = t["blk.1.ffn_gate_inp.weight"]
    assert (router.requested, router.expected) == ("F16", "F32")  # llama.cpp keeps it F32
    assert any("never quantizes the expert router" in w for w in exp.warnings)


def test_router_not_named_is_requested_as_stored() -> None:
    m = load_mixmap(STUDY / "mix_high_early.json")
    exp = expand(m, ModelShape(48, 32, 4, True, 128), moe_tensors(48))
    t = {p.name: p for p in exp.tensors}
    assert (t["blk.0.ffn_gate_inp.weight"].requested, t["blk.0.ffn_gate_inp.weight"].expected) == (
        "F32", "F32")
    assert exp.warnings == []
    assert sum("_exps." in name for name in t) == 3 * 48


def test_expert_rules_for_qwen3_30b_a3b_shape() -> None:
    """Qwen3-30B-A3B: 48 layers, 32 heads / 4 KV heads, 128 experts (not llama.cpp's 8-expert
    case), n_ff_exp 768. Expected types follow llama_tensor_get_type_impl by hand."""
    shape = ModelShape(48, 32, 4, True, 128)
    # Q4_K_M: ffn_down (experts too) Q6_K where use_more_bits: i < 6, i >= 42, (i - 6) % 3 == 2
    assert rule_type("Q4_K_M", "blk.0.ffn_down_exps.weight", shape, 768) == "Q6_K"
    assert rule_type("Q4_K_M", "blk.7.ffn_down_exps.weight", shape, 768) == "Q4_K"
    assert rule_type("Q4_K_M", "blk.8.ffn_down_exps.weight", shape, 768) == "Q6_K"
    assert rule_type("Q4_K_M", "blk.8.ffn_up_exps.weight", shape, 2048) == "Q4_K"
    assert rule_type("Q4_K_M", "blk.7.attn_v.weight", shape, 2048) == "Q4_K"  # not Q8_0
    assert rule_type("Q2_K", "blk.7.ffn_down_exps.weight", shape, 768) == "Q3_K"
    assert rule_type("Q3_K_M", "blk.2.ffn_down_exps.weight", shape, 768) == "Q5_K"  # < 48/16
    assert rule_type("Q3_K_M", "blk.3.ffn_down_exps.weight", shape, 768) == "Q4_K"
    assert apply_fallback("Q6_K", 768) == "Q6_K"  # 768 = 3 x 256: every K-quant fits
    eight = ModelShape(32, 32, 8, True, 8)  # Mixtral-like: llama.cpp's 8-expert rules
    assert rule_type("Q4_K_M", "blk.7.attn_v.weight", eight, 4096) == "Q8_0"
    assert rule_type("Q3_K_S", "blk.7.attn_k.weight", eight, 4096) == "Q8_0"
    assert rule_type("Q4_K_M", "blk.7.attn_output.weight", eight, 4096) == "Q5_K"
    assert rule_type("Q3_K_L", "blk.7.attn_output.weight", eight, 4096) == "Q3_K"


def test_type_sizes_match_the_gguf_package_table() -> None:
    """epi's one block table (quant_types) against gguf-py's GGML_QUANT_SIZES, which llama.cpp
    ships: a wrong entry would make every bits-per-weight and search byte count wrong."""
    import gguf

    from host.quant.quant_types import TENSOR_TYPES, bits_per_weight, type_size

    for name, (type_id, _, _) in TENSOR_TYPES.items():
        qtype = gguf.GGMLQuantizationType[name]
        assert int(qtype) == type_id, name
        assert type_size(name) == tuple(int(v) for v in gguf.GGML_QUANT_SIZES[qtype]), name
    assert bits_per_weight("Q4_0") == 4.5  # 18 bytes per 32 weights
    with pytest.raises(UserError, match="unknown tensor type 'IQ9_Z'"):
        type_size("IQ9_Z")


def test_a_layer_range_message_names_its_real_problem(tmp_path: Path) -> None:
    raw = base_map(groups=[{"name": "a", "layers": ["5-2"], "type": "Q4_0"}])
    assert "bad layer range '5-2': it runs backwards (5 > 2" in error_of(tmp_path, raw)
    raw = base_map(groups=[{"name": "a", "layers": ["1..4"], "type": "Q4_0"}])
    text = error_of(tmp_path, raw)
    assert "expected 'a-b', two whole numbers" in text and "a <= b" not in text


def test_an_imported_paper_map_passes_the_reader_that_checks_it(tmp_path: Path) -> None:
    """`epi maps import` never writes a map `epi maps check` refuses: generated paper-form maps
    (any split of 30 layers, any types, F16 groups widest included) either import into a map
    the epi-form reader accepts, or are refused in one line before anything is written."""
    import itertools
    import json

    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    from epi.core.errors import UserError
    from host.quant.mixmap import import_maps, load_mixmap
    from host.quant.quant_types import TENSOR_TYPES

    types = sorted(t for t in TENSOR_TYPES if t != "F32")

    @settings(max_examples=60, deadline=None, derandomize=True,
              suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(cuts=st.lists(st.integers(1, 29), max_size=3, unique=True),
           picks=st.lists(st.sampled_from(types), min_size=4, max_size=4))
    def check(cuts: list[int], picks: list[str]) -> None:
        edges = [0, *sorted(cuts), 30]
        groups = [{"layers": [f"{a}-{b - 1}"], "quant": picks[i]}
                  for i, (a, b) in enumerate(itertools.pairwise(edges))]
        n = len(list(tmp_path.iterdir()))
        src = tmp_path / f"src{n}.json"
        src.write_text(json.dumps({"config_id": f"m{n}", "layer_groups": groups}))
        out = tmp_path / f"out{n}"
        try:
            written = import_maps([src], out)
        except UserError as exc:
            assert "\n" not in str(exc) and not out.exists()
            return
        for path in written:
            load_mixmap(path)  # raises on a map the reader refuses

    check()
