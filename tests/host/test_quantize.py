"""Quantization from mix maps, checked tensor by tensor against the file llama.cpp wrote."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from host.quant.gguf_info import read_model, sha256_file
from host.quant.mixmap import expand, load_mixmap, load_mixmaps
from host.quant.quantize import quantize_map
from host.quant.tiny_model import write_test_model
from host.run.llama_env import tool_env, tool_path

REPO = Path(__file__).resolve().parents[2]
STUDY = REPO / "quantmaps"


def epi(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "epi.cli", *args], capture_output=True,
                          text=True, cwd=cwd)


def check_tensor_by_tensor(manifest: dict, out: Path, base_types: dict[str, str]) -> None:
    """Every tensor of the written file is what the map asked for (or a recorded fallback)."""
    written = read_model(out)
    rows = {t["name"]: t for t in manifest["tensors"]}
    assert set(rows) == set(written.tensor_types)
    for name, effective in written.tensor_types.items():
        row = rows[name]
        assert row["effective"] == effective
        if row["requested"] is None:  # norms: not quantized, stored as in the base
            assert effective == base_types[name]
        elif row["fallback"]:
            assert effective != row["requested"]
            assert name in {f["name"] for f in manifest["fallbacks"]}
        else:
            assert effective == row["requested"]


def test_quantize_three_maps_tensor_by_tensor(tiny_model: Path, tmp_path: Path) -> None:
    base = read_model(tiny_model)
    sha = sha256_file(tiny_model)
    for map_id in ("mix_high_early", "mix_extreme_late", "uniform_q8"):
        m = load_mixmap(STUDY / f"{map_id}.json")
        result = quantize_map(m, base, sha, tmp_path, threads=2)
        check_tensor_by_tensor(result.manifest, result.output, base.tensor_types)
        assert not result.manifest["differs_from_request"]  # 256-wide: every type fits
        assert result.manifest["unpredicted"] == []
    man = json.loads((tmp_path / "mix_high_early.manifest.json").read_text())
    groups = {g["name"]: g for g in man["layer_groups"]}
    assert groups["early"]["layers"] == [0, 1]
    assert groups["late"]["layers"] == [6, 7]
    # Q6_K (6.56 bpw) early layers hold more bits per weight than Q3_K_S late layers (3.44)
    assert groups["early"]["bits_per_weight"] > groups["middle"]["bits_per_weight"]
    assert groups["middle"]["bits_per_weight"] > groups["late"]["bits_per_weight"]
    assert groups["late"]["effective_types"] == {"Q3_K": 14, "F32": 4}  # 2 layers x (7 + 2 norms)


@pytest.mark.slow
def test_every_shipped_map_on_the_test_model(tiny_model: Path, tmp_path: Path) -> None:
    base = read_model(tiny_model)
    sha = sha256_file(tiny_model)
    maps, _ = load_mixmaps([STUDY, STUDY / "demo"])
    assert len(maps) == 29
    for m in maps:
        result = quantize_map(m, base, sha, tmp_path, threads=2)
        check_tensor_by_tensor(result.manifest, result.output, base.tensor_types)
        assert result.manifest["unpredicted"] == []


@pytest.mark.parametrize("file_type", ["Q2_K", "Q3_K_S", "Q4_K_M", "Q5_K_M"])
def test_file_type_rules_match_llama_cpp_native(tmp_path: Path, file_type: str) -> None:
    """A uniform map of file type X gives exactly `llama-quantize X`'s per-tensor types."""
    # 16 layers so use_more_bits picks a non-trivial pattern; 4 heads / 1 KV head: n_gqa 4
    model = write_test_model(tmp_path / "gqa.gguf", n_layers=16, n_head=4, n_head_kv=1)
    base = read_model(model)
    native = tmp_path / f"native-{file_type}.gguf"
    subprocess.run([str(tool_path("llama-quantize")), str(model), str(native), file_type, "2"],
                   env=tool_env(), capture_output=True, check=True)
    m = load_mixmap(STUDY / f"uniform_{file_type.lower()}.json")
    result = quantize_map(m, base, sha256_file(model), tmp_path / "ours", threads=2)
    ours = read_model(result.output).tensor_types
    theirs = read_model(native).tensor_types
    assert ours == theirs


def test_fallback_is_recorded_and_reported(tmp_path: Path) -> None:
    # width 384: K-quants (256-blocks) do not fit rows of 384; llama.cpp falls back
    model = write_test_model(tmp_path / "w384.gguf", n_layers=4, n_embd=384, n_ff=768, n_head=6)
    base = read_model(model)
    m = load_mixmap(STUDY / "uniform_q6k.json")
    exp = expand(m, base.shape, base.tensors)
    assert any(t.expected == "Q8_0" for t in exp.tensors)
    result = quantize_map(m, base, sha256_file(model), tmp_path / "out", threads=2)
    man = result.manifest
    assert man["differs_from_request"] is True
    assert {(f["requested"], f["effective"]) for f in man["fallbacks"]} == {("Q6_K", "Q8_0")}
    assert man["unpredicted"] == []
    # ffn_down rows are 768 = 3 x 256: Q6_K fits there
    rows = {t["name"]: t for t in man["tensors"]}
    assert rows["blk.0.ffn_down.weight"]["effective"] == "Q6_K"


def test_up_to_date_outputs_are_skipped(tiny_model: Path, tmp_path: Path) -> None:
    base = read_model(tiny_model)
    sha = sha256_file(tiny_model)
    m = load_mixmap(STUDY / "uniform_q8.json")
    first = quantize_map(m, base, sha, tmp_path, threads=2)
    assert not first.skipped
    second = quantize_map(m, base, sha, tmp_path, threads=2)
    assert second.skipped
    first.output.write_bytes(first.output.read_bytes()[:-10])  # damaged output: redone
    third = quantize_map(m, base, sha, tmp_path, threads=2)
    assert not third.skipped


def test_cli_quantize_prints_table(tiny_model: Path, tmp_path: Path) -> None:
    proc = epi("quantize", str(STUDY / "uniform_q4km.json"), "--model", str(tiny_model),
               "--out", str(tmp_path), "--threads", "2")
    assert proc.returncode == 0, proc.stderr
    assert "uniform_q4km" in proc.stdout and "as requested" in proc.stdout
    assert (tmp_path / "uniform_q4km.manifest.json").is_file()


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["quantize", "quantmaps/uniform_q8.json", "--model", "missing.gguf", "--out", "o"],
         "missing.gguf: no such model file"),
        (["quantize", "quantmaps/nope.json", "--model", "x.gguf", "--out", "o"],
         "quantmaps/nope.json: no such mix map file"),
        (["maps", "check", "--layers", "8", "quantmaps/mix_high_early.json", "BAD"], "BAD"),
    ],
)
def test_cli_errors_are_one_line_exit_2(args: list[str], expected: str) -> None:
    proc = epi(*args)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("epi: error: ") and expected in lines[0]


def test_cli_rejects_non_gguf(tmp_path: Path) -> None:
    bogus = tmp_path / "model.gguf"
    bogus.write_text("hello")
    proc = epi("quantize", "quantmaps/uniform_q8.json", "--model", str(bogus), "--out",
               str(tmp_path))
    assert proc.returncode == 2
    assert "not a GGUF file" in proc.stderr and "Traceback" not in proc.stderr


def test_maps_check_reports_content_duplicates() -> None:
    proc = epi("maps", "check", "--layers", "30")
    assert proc.returncode == 0, proc.stderr
    assert "24 map(s) valid on a 30-layer model" in proc.stdout
    assert "same content" in proc.stdout


@pytest.mark.slow
def test_demo_maps_on_the_real_135m_model(tmp_path: Path) -> None:
    from host.quant.models import prepare_model

    manifest = prepare_model("smollm2")
    assert manifest["n_layers"] == 30 and manifest["n_params"] == 134515008
    base = read_model(Path(manifest["path"]))
    sha = manifest["sha256"]
    for map_file in sorted((STUDY / "demo").glob("*.json")):
        m = load_mixmap(map_file)
        result = quantize_map(m, base, sha, tmp_path, threads=2)
        check_tensor_by_tensor(result.manifest, result.output, base.tensor_types)
        # the demo maps use 32-weight-block types that fit every tensor of the 576-wide model
        assert not result.manifest["differs_from_request"], result.manifest["fallbacks"][:3]
