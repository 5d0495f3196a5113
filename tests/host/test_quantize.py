"""Quantization from mix maps, checked tensor by tensor against the file llama.cpp wrote."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from host.gguf_io.file import sha256_file
from host.llama.install import tool_env, tool_path
from host.quant.gguf_info import ModelInfo, read_model
from host.quant.mixmap import MixMap, expand, load_mixmap, load_mixmaps
from host.quant.quantize import QuantResult, quantize_map
from host.quant.tiny_model import write_test_model
from tests.host.quant_fixtures import independent_types, shared_model

REPO = Path(__file__).resolve().parents[2]
STUDY = REPO / "quantmaps"
# The study paper's config ids of its uniform configurations
UNIFORM_MAP_OF = {
    "Q2_K": "uniform_q2k",
    "Q3_K_S": "uniform_q3ks",
    "Q4_K_M": "uniform_q4km",
    "Q5_K_M": "uniform_q5km",
    "Q6_K": "uniform_q6k",
    "Q8_0": "uniform_q8",
}


def epi(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "epi.cli", *args], capture_output=True,
                          text=True, cwd=cwd)


def check_tensor_by_tensor(manifest: dict[str, Any], out: Path, base: Path) -> None:
    """Every tensor of the written file is what the map asked for (or a recorded fallback).

    The file and the base are read with the gguf package directly, not with the reader that
    wrote the manifest, so a manifest that misstates a type fails.
    """
    written = independent_types(out)
    base_types = independent_types(base)
    rows = {t["name"]: t for t in manifest["tensors"]}
    assert set(rows) == set(written)
    assert {f["name"] for f in manifest["fallbacks"]} == {
        n for n, r in rows.items() if r["requested"] is not None and written[n] != r["requested"]
    }
    for name, effective in written.items():
        row = rows[name]
        assert row["effective"] == effective, name
        if row["requested"] is None:  # norms: not quantized, stored as in the base
            assert effective == base_types[name], name
        elif row["fallback"]:
            assert effective != row["requested"], name
        else:
            assert effective == row["requested"], name


@pytest.fixture(scope="module")
def quantized(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory
              ) -> Callable[[MixMap], QuantResult]:
    """The test model quantized with a map, once per map for this module (llama-quantize and
    the manifest's read-back cost ~1 s a map): tests that only read a map's output share it.
    Tests of re-quantizing (skips, damaged outputs) and of the CLI quantize on their own."""
    base = read_model(tiny_model)
    sha = sha256_file(tiny_model)
    out = tmp_path_factory.mktemp("quantized")
    done: dict[str, QuantResult] = {}

    def get(m: MixMap) -> QuantResult:
        if m.id not in done:
            done[m.id] = quantize_map(m, base, sha, out, threads=2)
            assert not done[m.id].skipped  # each map once, into a fresh folder
        return done[m.id]

    return get


@pytest.mark.long
def test_quantize_three_maps_tensor_by_tensor(
    tiny_model: Path, quantized: Callable[[MixMap], QuantResult]
) -> None:
    for map_id in ("mix_high_early", "mix_extreme_late", "uniform_q8"):
        result = quantized(load_mixmap(STUDY / f"{map_id}.json"))
        check_tensor_by_tensor(result.manifest.to_json(), result.output, tiny_model)
        assert not result.manifest.to_json()["differs_from_request"]  # 256-wide: every type fits
        assert result.manifest.to_json()["unpredicted"] == []
    man = json.loads(quantized(load_mixmap(STUDY / "mix_high_early.json")).manifest_path
                     .read_text())
    groups = {g["name"]: g for g in man["layer_groups"]}
    assert groups["early"]["layers"] == [0, 1]
    assert groups["late"]["layers"] == [6, 7]
    # Q6_K (6.56 bpw) early layers hold more bits per weight than Q3_K_S late layers (3.44)
    assert groups["early"]["bits_per_weight"] > groups["middle"]["bits_per_weight"]
    assert groups["middle"]["bits_per_weight"] > groups["late"]["bits_per_weight"]
    assert groups["late"]["effective_types"] == {"Q3_K": 14, "F32": 4}  # 2 layers x (7 + 2 norms)


def test_tensor_check_catches_a_manifest_that_misstates_a_type(
    tiny_model: Path, quantized: Callable[[MixMap], QuantResult]
) -> None:
    """The check reads the file itself: a manifest row that lies about a type is caught."""
    result = quantized(load_mixmap(STUDY / "uniform_q8.json"))
    check_tensor_by_tensor(result.manifest.to_json(), result.output, tiny_model)
    lying = json.loads(json.dumps(result.manifest.to_json()))
    row = next(t for t in lying["tensors"] if t["name"] == "blk.0.attn_q.weight")
    row["effective"] = row["requested"] = "Q4_K"
    with pytest.raises(AssertionError):
        check_tensor_by_tensor(lying, result.output, tiny_model)


@pytest.mark.long
def test_read_model_is_what_the_gguf_package_reads(
    tiny_model: Path, tmp_path: Path, quantized: Callable[[MixMap], QuantResult]
) -> None:
    """read_model parses the header itself (no arrays, no tensor data): every figure it gives
    equals gguf.GGUFReader's for a mixed-type file, the base's types equal the test's own
    parser's, and a file cut short inside its tensor data is refused in one line."""
    import gguf

    from epi.core.errors import UserError

    out = quantized(load_mixmap(STUDY / "mix_high_early.json")).output
    info = read_model(out)
    reader = gguf.GGUFReader(str(out))

    def field(key: str) -> Any:
        return reader.fields[key].contents()

    assert info.arch == field("general.architecture") == "llama"
    assert (info.shape.n_layers, info.shape.n_head, info.shape.n_head_kv, info.shape.n_expert,
            info.shape.has_output) == (field("llama.block_count"),
                                       field("llama.attention.head_count"),
                                       field("llama.attention.head_count_kv"), 0, True)
    assert info.n_embd == field("llama.embedding_length")
    assert info.file_type == field("general.file_type")
    assert [(t.name, t.row_len, t.n_elements, t.n_dims, t.stored_type) for t in info.tensors] == [
        (t.name, int(t.shape[0]), int(t.n_elements), len(t.shape), t.tensor_type.name)
        for t in reader.tensors
    ]
    assert info.tensor_bytes == {t.name: int(t.n_bytes) for t in reader.tensors}
    assert info.n_params == sum(int(t.n_elements) for t in reader.tensors)
    assert len(set(info.tensor_types.values())) >= 4  # F32 norms, Q3_K, Q4_K, Q6_K at least
    assert read_model(tiny_model).tensor_types == independent_types(tiny_model)
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(out.read_bytes()[:-4096])
    with pytest.raises(UserError, match=r"cut\.gguf: cannot read GGUF header: tensor "
                                        r"\S+: data runs past the end of the file$"):
        read_model(cut)


@pytest.mark.slow
@pytest.mark.shares_cpu  # no timing of it is checked: it may run beside another test
def test_every_shipped_map_on_the_test_model(
    tiny_model: Path, quantized: Callable[[MixMap], QuantResult]
) -> None:
    maps, _ = load_mixmaps([STUDY, STUDY / "demo"])
    assert len(maps) == 30
    base = read_model(tiny_model)
    first_of: dict[str, MixMap] = {}
    for m in maps:
        # one shipped map repeats another's content (mix_high_middle = mix_bookend_low): the
        # same request gives the same file, so such a map is checked to ask llama-quantize for
        # exactly what the first asked, not quantized again
        same = first_of.setdefault(m.content_key(), m)
        if same is not m:
            ours, theirs = (expand(x, base.shape, base.tensors) for x in (m, same))
            assert [(t.name, t.requested, t.expected) for t in ours.tensors] == [
                (t.name, t.requested, t.expected) for t in theirs.tensors]
            assert m.base_type == same.base_type
            continue
        result = quantized(m)
        check_tensor_by_tensor(result.manifest.to_json(), result.output, tiny_model)
        assert result.manifest.to_json()["unpredicted"] == []
    assert len(first_of) == 29


@pytest.fixture(scope="module")
def gqa_model(tmp_path_factory: pytest.TempPathFactory) -> tuple[ModelInfo, str]:
    """16 layers so use_more_bits picks a non-trivial pattern; 4 heads / 1 KV head: n_gqa 4.
    One file for every file type below (each quantizes it into its own folder)."""
    model = shared_model(tmp_path_factory, n_layers=16, n_head=4, n_head_kv=1)
    return read_model(model), sha256_file(model)


@pytest.mark.long
@pytest.mark.parametrize("file_type", ["Q2_K", "Q3_K_S", "Q4_K_M", "Q5_K_M"])
def test_file_type_rules_match_llama_cpp_native(
    tmp_path: Path, gqa_model: tuple[ModelInfo, str], file_type: str
) -> None:
    """A uniform map of file type X gives exactly `llama-quantize X`'s per-tensor types."""
    base, sha = gqa_model
    native = tmp_path / f"native-{file_type}.gguf"
    subprocess.run([str(tool_path("llama-quantize")), str(base.path), str(native), file_type,
                    "2"], env=tool_env(), capture_output=True, check=True)
    m = load_mixmap(STUDY / f"{UNIFORM_MAP_OF[file_type]}.json")
    result = quantize_map(m, base, sha, tmp_path / "ours", threads=2)
    assert independent_types(result.output) == independent_types(native)


def test_fallback_is_recorded_and_reported(tmp_path: Path) -> None:
    # width 384: K-quants (256-blocks) do not fit rows of 384; llama.cpp falls back
    model = write_test_model(tmp_path / "w384.gguf", n_layers=4, n_embd=384, n_ff=768, n_head=6)
    base = read_model(model)
    m = load_mixmap(STUDY / "uniform_q6k.json")
    exp = expand(m, base.shape, base.tensors)
    assert any(t.expected == "Q8_0" for t in exp.tensors)
    result = quantize_map(m, base, sha256_file(model), tmp_path / "out", threads=2)
    man = result.manifest.to_json()
    assert man["differs_from_request"] is True
    assert {(f["requested"], f["effective"]) for f in man["fallbacks"]} == {("Q6_K", "Q8_0")}
    assert man["unpredicted"] == []
    # ffn_down rows are 768 = 3 x 256: Q6_K fits there
    rows = {t["name"]: t for t in man["tensors"]}
    assert rows["blk.0.ffn_down.weight"]["effective"] == "Q6_K"


def test_up_to_date_outputs_are_skipped(
    tiny_model: Path, tmp_path: Path, quantized: Callable[[MixMap], QuantResult]
) -> None:
    base = read_model(tiny_model)
    sha = sha256_file(tiny_model)
    m = load_mixmap(STUDY / "uniform_q8.json")
    first = quantized(m)  # made in a fresh folder: not skipped (the fixture checks)
    for made in (first.output, first.manifest_path):  # a copy: the shared files stay intact
        shutil.copy(made, tmp_path / made.name)
    second = quantize_map(m, base, sha, tmp_path, threads=2)
    assert second.skipped and second.output == tmp_path / first.output.name
    second.output.write_bytes(second.output.read_bytes()[:-10])  # damaged output: redone
    third = quantize_map(m, base, sha, tmp_path, threads=2)
    assert not third.skipped
    assert third.output.read_bytes() == first.output.read_bytes()  # llama.cpp is deterministic


def test_manifest_on_disk_reads_back_as_the_typed_result(
    tiny_model: Path, quantized: Callable[[MixMap], QuantResult]
) -> None:
    """The typed manifest `quantize_map` returns is the file it wrote: the reader turns the
    file back into an equal record, and `to_json` into the same document."""
    from epi.formats.manifests import read_quant_manifest

    result = quantized(load_mixmap(STUDY / "mix_high_early.json"))
    on_disk = json.loads(result.manifest_path.read_text())
    assert on_disk == result.manifest.to_json()
    assert read_quant_manifest(result.manifest_path) == result.manifest
    assert on_disk["layer_groups"][-1]["name"] == "non_block"
    assert on_disk["base"]["sha256"] == sha256_file(tiny_model)
    assert on_disk["output"]["size_bytes"] == result.output.stat().st_size


def test_cli_quantize_applies_each_map_to_the_model_once(
    tiny_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str], quantized: Callable[[MixMap], QuantResult]
) -> None:
    """`epi quantize` expands a map once: the expansion whose warnings it prints is the one
    llama-quantize gets (it used to be expanded a second time inside quantize_map).

    The outputs are copied in from the module's set, so the command finds them up to date and
    runs no llama-quantize: quantize_map expands before its up-to-date check, so a second
    expansion is counted all the same."""
    import host.quant.mixmap as mixmap_module
    from host.quant.mixmap import Expansion, TensorInfo
    from host.quant.quant_types import ModelShape
    from tests.cli_run import run_epi

    calls: list[str] = []
    real = mixmap_module.expand

    def counting(m: MixMap, shape: ModelShape, tensors: list[TensorInfo]) -> Expansion:
        calls.append(m.id)
        return real(m, shape, tensors)

    import host.quant.quantize as quantize_module

    for map_id in ("uniform_q8", "mix_high_early"):
        made = quantized(load_mixmap(STUDY / f"{map_id}.json"))
        for path in (made.output, made.manifest_path):
            shutil.copy(path, tmp_path / path.name)
    monkeypatch.setattr(mixmap_module, "expand", counting)
    monkeypatch.setattr(quantize_module, "expand", counting)
    code, out, err = run_epi(monkeypatch, capsys, "quantize", str(STUDY / "uniform_q8.json"),
                             str(STUDY / "mix_high_early.json"), "--model", str(tiny_model),
                             "--out", str(tmp_path), "--threads", "2")
    assert code == 0, err
    assert sorted(calls) == ["mix_high_early", "uniform_q8"]
    assert "as requested" in out
    assert not (tmp_path / "uniform_q8.quantize.log").exists()  # up to date: not redone


def test_cli_quantize_prints_table(
    tiny_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str]
) -> None:
    from tests.cli_run import run_epi

    code, out, err = run_epi(monkeypatch, capsys, "quantize", str(STUDY / "uniform_q4km.json"),
                             "--model", str(tiny_model), "--out", str(tmp_path), "--threads", "2")
    assert code == 0, err
    assert "uniform_q4km" in out and "as requested" in out
    assert (tmp_path / "uniform_q4km.manifest.json").is_file()


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["quantize", "quantmaps/uniform_q8.json", "--model", "missing.gguf", "--out", "o"],
         "missing.gguf: model file not found"),
        (["quantize", "quantmaps/nope.json", "--model", "x.gguf", "--out", "o"],
         "quantmaps/nope.json: no such mix map file"),
        (["maps", "check", "--layers", "8", "quantmaps/mix_high_early.json", "BAD"], "BAD"),
        (["maps", "check", "--layers", "30", "quantmaps/paper/uniform_q8.json"],
         "layer_groups[2].layers: layer 30 is beyond the model's 30 layers"),
        (["maps", "import", "quantmaps/paper/uniform_q8.json", "--out", "quantmaps"],
         "quantmaps/uniform_q8.json: exists; pass --force"),
    ],
)
def test_cli_errors_are_one_line_exit_2(args: list[str], expected: str) -> None:
    proc = epi(*args)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("epi: error: ") and expected in lines[0]


def test_cli_quantizes_the_papers_map_form_as_printed(
    tiny_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str]
) -> None:
    """A map in the study paper's own form, on the 8-layer test model, through both commands
    (in-process: the commands' exit codes and one-line errors are the subprocess tests' job)."""
    from tests.cli_run import run_epi

    paper = tmp_path / "paper_map.json"
    paper.write_text(
        '{"config_id": "mix_high_early", "model": "tiny-llama", "layer_groups": ['
        '{"layers": [0, 1], "quant": "Q6_K"}, {"layers": [2, 3, 4, 5], "quant": "Q4_K_M"}, '
        '{"layers": [6, 7], "quant": "Q3_K_S"}]}'
    )
    code, out, err = run_epi(monkeypatch, capsys, "maps", "check", str(paper), "--model",
                             str(tiny_model))
    assert code == 0, err
    assert "mix_high_early" in out and "[paper form]" in out
    code, out, err = run_epi(monkeypatch, capsys, "quantize", str(paper), "--model",
                             str(tiny_model), "--out", str(tmp_path / "q"), "--threads", "2")
    assert code == 0, err
    row = next(line for line in out.splitlines() if line.startswith("mix_high_early"))
    assert "0-1:Q6_K 2-5:Q4_K_M 6-7:Q3_K_S" in row and "as requested" in row
    man = json.loads((tmp_path / "q" / "mix_high_early.manifest.json").read_text())
    assert man["map_form"] == "paper" and man["map"]["config_id"] == "mix_high_early"
    check_tensor_by_tensor(man, tmp_path / "q" / "mix_high_early.gguf", tiny_model)


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
@pytest.mark.shares_cpu  # no timing of it is checked: it may run beside another test
def test_demo_maps_on_the_real_135m_model(tmp_path: Path) -> None:
    from host.quant.models import prepare_model

    manifest = prepare_model("smollm2")
    assert manifest.n_layers == 30 and manifest.n_params == 134515008
    assert manifest.path is not None and manifest.sha256 is not None
    base = read_model(Path(manifest.path))
    sha = manifest.sha256
    for map_file in sorted((STUDY / "demo").glob("*.json")):
        m = load_mixmap(map_file)
        result = quantize_map(m, base, sha, tmp_path, threads=2)
        check_tensor_by_tensor(result.manifest.to_json(), result.output, base.path)
        # the demo maps use 32-weight-block types that fit every tensor of the 576-wide model
        assert not result.manifest.differs_from_request, result.manifest.fallbacks[:3]
