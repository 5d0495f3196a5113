"""Mixture-of-experts models: a generated qwen3moe/qwen2moe GGUF that llama.cpp loads, quantized
from the study's maps with every expert tensor checked through the gguf package's own reader,
llama.cpp's file-type rules for expert tensors matched against llama-quantize itself, and runs
locally and across two RPC workers with the placement shown."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import pytest

from epi.core.errors import UserError
from epi.core.net import free_port
from host.cluster.placement import parse_load_log, placement_from_log
from host.cluster.rpc import Endpoint
from host.gguf_io.file import sha256_file
from host.llama.install import tool_env, tool_path
from host.quant.gguf_info import read_model
from host.quant.mixmap import load_mixmap, parse_mixmap
from host.quant.quantize import quantize_map
from host.quant.tiny_model import write_test_model
from tests.host.quant_fixtures import gguf_view as quant_view
from tests.host.quant_fixtures import shared_model

REPO = Path(__file__).resolve().parents[2]
STUDY = REPO / "quantmaps"
N_LAYERS = 4
N_EXPERT = 4


def gguf_view(path: Path) -> tuple[dict, dict[str, str], dict[str, list[int]], dict[str, int]]:
    """(metadata scalars, tensor types, ggml shapes ne, tensor bytes), read without epi's code:
    the test's own header parser with the gguf package's type and block tables, which also
    checks that every tensor's size tiles the data section (tests/host/quant_fixtures.py)."""
    view = quant_view(path)
    return view.meta, view.types, view.shapes, view.nbytes


@pytest.fixture(scope="module")
def moe_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("moe") / "tiny-qwen3moe-f16.gguf"
    return write_test_model(out, n_layers=N_LAYERS, arch="qwen3moe", n_expert=N_EXPERT)


@pytest.fixture(scope="module")
def shexp_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("shexp") / "tiny-qwen2moe-f16.gguf"
    return write_test_model(out, n_layers=N_LAYERS, arch="qwen2moe", n_expert=N_EXPERT)


def test_generated_qwen3moe_has_what_llama_cpp_reads(moe_model: Path) -> None:
    meta, types, shapes, _ = gguf_view(moe_model)
    assert meta["general.architecture"] == "qwen3moe"
    assert meta["qwen3moe.expert_count"] == N_EXPERT
    assert meta["qwen3moe.expert_used_count"] == 2
    assert meta["qwen3moe.expert_feed_forward_length"] == 256
    for i in range(N_LAYERS):
        p = f"blk.{i}."
        assert shapes[p + "ffn_gate_exps.weight"] == [256, 256, N_EXPERT]  # ne: embd, ff, expert
        assert shapes[p + "ffn_up_exps.weight"] == [256, 256, N_EXPERT]
        assert shapes[p + "ffn_down_exps.weight"] == [256, 256, N_EXPERT]
        assert shapes[p + "ffn_gate_inp.weight"] == [256, N_EXPERT]
        assert types[p + "ffn_gate_inp.weight"] == "F32"  # as llama.cpp's converter writes it
        assert types[p + "ffn_up_exps.weight"] == "F16"
        assert p + "attn_q_norm.weight" in types and p + "ffn_gate.weight" not in types
    assert read_model(moe_model).shape.n_expert == N_EXPERT  # epi's header reader agrees


@pytest.mark.parametrize("fixture", ["moe_model", "shexp_model"])
def test_llama_cpp_loads_and_runs_the_generated_moe(
    fixture: str, request: pytest.FixtureRequest
) -> None:
    """llama.cpp itself accepts the file: its loader checks every tensor's name and shape."""
    import llama_cpp

    model = request.getfixturevalue(fixture)
    llm = llama_cpp.Llama(str(model), n_ctx=128, n_threads=1, verbose=False)
    try:
        out = llm("The bridge crosses", max_tokens=4, temperature=0.0)
        assert out["usage"]["completion_tokens"] == 4
        arch = llm.metadata["general.architecture"]
        assert llm.metadata[f"{arch}.expert_count"] == str(N_EXPERT)
    finally:
        llm.close()


# mix_high_early on 4 layers: early = layer 0 (Q6_K), middle = 1-2 (Q4_K_M), late = 3 (Q3_K_S).
# Q4_K_M gives ffn_down (expert ffn_down_exps included) Q6_K where llama.cpp's use_more_bits
# holds: i < n/8, i >= 7n/8 or (i - n/8) % 3 == 2, i.e. layers 2 and 3 of 4, else Q4_K.
EXPECTED_EXPERTS = {
    0: {"ffn_gate_exps": "Q6_K", "ffn_up_exps": "Q6_K", "ffn_down_exps": "Q6_K"},
    1: {"ffn_gate_exps": "Q4_K", "ffn_up_exps": "Q4_K", "ffn_down_exps": "Q4_K"},
    2: {"ffn_gate_exps": "Q4_K", "ffn_up_exps": "Q4_K", "ffn_down_exps": "Q6_K"},
    3: {"ffn_gate_exps": "Q3_K", "ffn_up_exps": "Q3_K", "ffn_down_exps": "Q3_K"},
}


def test_study_map_on_moe_every_expert_tensor_verified(moe_model: Path, tmp_path: Path) -> None:
    base = read_model(moe_model)
    result = quantize_map(
        load_mixmap(STUDY / "mix_high_early.json"), base, sha256_file(moe_model), tmp_path,
        threads=2,
    )
    _, types, _, _ = gguf_view(result.output)
    experts = {n: t for n, t in types.items() if "_exps." in n}
    assert len(experts) == 3 * N_LAYERS
    for layer, kinds in EXPECTED_EXPERTS.items():
        for kind, expected in kinds.items():
            assert types[f"blk.{layer}.{kind}.weight"] == expected, (layer, kind)
        assert types[f"blk.{layer}.ffn_gate_inp.weight"] == "F32"  # llama.cpp never quantizes it
    man = result.manifest.to_json()
    rows = {t["name"]: t for t in man["tensors"]}
    for name, effective in experts.items():
        assert rows[name]["role"] == "expert"
        assert rows[name]["requested"] == rows[name]["effective"] == effective
    router = rows["blk.0.ffn_gate_inp.weight"]
    assert (router["role"], router["requested"], router["effective"]) == ("router", "F32", "F32")
    assert man["differs_from_request"] is False and man["unpredicted"] == []
    assert man["moe"]["n_expert"] == N_EXPERT
    assert man["moe"]["expert"] == {"Q3_K→Q3_K": 3, "Q4_K→Q4_K": 5, "Q6_K→Q6_K": 4}
    assert man["moe"]["router"] == {"F32→F32": N_LAYERS}


def moe_map(**extra) -> dict:
    raw = {
        "format": "epi-mixmap",
        "format_version": 1,
        "id": "moe_test",
        "base_type": "Q4_K_M",
        "groups": [
            {"name": "early", "layers": ["0-1"], "type": "Q6_K", "overrides": {"experts": "Q4_0"}},
            {"name": "late", "layers": ["2-3"], "type": "Q4_K"},
        ],
        "non_block": {"token_embd": "Q8_0", "output": "Q8_0"},
    }
    raw.update(extra)
    return raw


def test_map_names_router_and_shared_experts_separately(shexp_model: Path, tmp_path: Path) -> None:
    raw = moe_map(moe={"router": "F32", "shared_experts": "Q8_0"})
    raw["groups"][1]["overrides"] = {"ffn_down_shexp": "Q5_0"}
    m = parse_mixmap(raw, tmp_path / "moe.json")
    base = read_model(shexp_model)
    result = quantize_map(m, base, sha256_file(shexp_model), tmp_path, threads=2)
    _, types, _, _ = gguf_view(result.output)
    for layer in range(N_LAYERS):
        p = f"blk.{layer}."
        exps = "Q4_0" if layer < 2 else "Q4_K"
        assert [types[p + k] for k in ("ffn_gate_exps.weight", "ffn_down_exps.weight")] == [
            exps,
            exps,
        ]
        assert types[p + "ffn_gate_shexp.weight"] == types[p + "ffn_up_shexp.weight"] == "Q8_0"
        assert types[p + "ffn_down_shexp.weight"] == ("Q8_0" if layer < 2 else "Q5_0")
        assert types[p + "attn_q.weight"] == ("Q6_K" if layer < 2 else "Q4_K")
        assert types[p + "ffn_gate_inp.weight"] == "F32"
        assert types[p + "ffn_gate_inp_shexp.weight"] == "F32"  # 1-D: never quantized
    man = result.manifest.to_json()
    assert man["warnings"] == [] and man["unpredicted"] == []
    assert man["moe"]["shared_expert"]["Q8_0→Q8_0"] == 10  # gate+up x 4, down x 2


def test_router_type_llama_cpp_will_not_write_is_reported(moe_model: Path, tmp_path: Path) -> None:
    m = parse_mixmap(moe_map(moe={"router": "Q8_0"}), tmp_path / "moe.json")
    base = read_model(moe_model)
    result = quantize_map(m, base, sha256_file(moe_model), tmp_path, threads=2)
    man = result.manifest.to_json()
    assert any("never quantizes the expert router" in w for w in man["warnings"])
    assert man["differs_from_request"] is True and man["unpredicted"] == []
    assert {(f["requested"], f["effective"]) for f in man["fallbacks"]} == {("Q8_0", "F32")}
    assert gguf_view(result.output)[1]["blk.0.ffn_gate_inp.weight"] == "F32"


def uniform_map(tmp_path: Path, file_type: str) -> Path:
    path = tmp_path / f"uniform-{file_type}.json"
    path.write_text(json.dumps({
        "format": "epi-mixmap", "format_version": 1, "id": f"u-{file_type}",
        "base_type": file_type, "groups": [{"name": "all", "fraction": 1.0, "type": file_type}],
        "non_block": {"token_embd": file_type, "output": file_type},
    }))
    return path


@pytest.mark.long  # slow and shares_cpu (tests/conftest.py): the types compared, no timing
@pytest.mark.parametrize(
    ("arch", "n_expert", "file_type"),
    [
        ("qwen3moe", 8, "Q4_K_M"),  # 8 experts: llama.cpp's Mixtral rules (attn_v/attn_k Q8_0 ...)
        ("qwen3moe", 4, "Q4_K_M"),
        ("qwen3moe", 8, "Q2_K"),
        ("qwen3moe", 8, "Q3_K_L"),  # attn_output stays Q3_K
        ("qwen2moe", 8, "Q3_K_M"),  # shared experts too
        ("qwen2moe", 4, "Q5_K_M"),
    ],
)
def test_moe_file_type_rules_match_llama_cpp_native(
    tmp_path: Path, tmp_path_factory: pytest.TempPathFactory, arch: str, n_expert: int,
    file_type: str
) -> None:
    """A uniform map of file type X gives exactly `llama-quantize X`'s type for every tensor,
    expert tensors included. Cases with the same architecture and expert count share one
    model file (only read here)."""
    model = shared_model(tmp_path_factory, n_layers=8, n_head=4, n_head_kv=1, arch=arch,
                         n_expert=n_expert)
    native = tmp_path / "native.gguf"
    subprocess.run([str(tool_path("llama-quantize")), str(model), str(native), file_type, "2"],
                   env=tool_env(), capture_output=True, check=True)
    m = load_mixmap(uniform_map(tmp_path, file_type))
    result = quantize_map(m, read_model(model), sha256_file(model), tmp_path / "ours", threads=2)
    ours, theirs = gguf_view(result.output)[1], gguf_view(native)[1]
    assert ours == theirs
    if n_expert == 8:  # llama.cpp's 8-expert rule, whatever the file type
        assert ours["blk.0.attn_v.weight"] == ours["blk.0.attn_k.weight"] == "Q8_0"


def test_tensors_moved_off_a_worker_are_refused() -> None:
    log = parse_load_log(
        "\n".join(
            [f"load_tensors: layer {i:3d} assigned to device RPC0, is_swa = 0" for i in range(3)]
            + [
                "done_getting_tensors: tensor 'blk.1.ffn_gate_exps.weight' (q4_K) (and 5 others) "
                "cannot be used with preferred buffer type RPC0[10.0.0.11:50052], using CPU "
                "instead",
            ]
        )
    )
    assert log.moved == [("blk.1.ffn_gate_exps.weight", 6, "RPC0[10.0.0.11:50052]", "CPU")]
    with pytest.raises(UserError, match=r"could not keep 6 tensor\(s\) \(blk\.1\.ffn_gate_exps"):
        placement_from_log(log, 2, "host", {"RPC0": Endpoint("10.0.0.11", 50052, "pi1")})


# ---- slow: runs, local and across two workers ----------------------------------------------


@pytest.mark.slow
@pytest.mark.shares_cpu  # no timing of it is checked: it may run beside another test
def test_quantized_moe_runs_locally_and_across_two_workers(tmp_path: Path) -> None:
    from epi.formats.tokenlog import read_token_log
    from host.cluster.workers import LocalWorker
    from host.run.runner import RunSettings, run

    n_layers = 8
    model = write_test_model(tmp_path / "moe.gguf", n_layers=n_layers, arch="qwen3moe")
    quant = quantize_map(load_mixmap(STUDY / "mix_high_early.json"), read_model(model),
                         sha256_file(model), tmp_path / "q", threads=2).output
    prompts = tmp_path / "prompts.json"
    prompts.write_text(json.dumps({
        "format": "epi-prompts", "format_version": 1, "name": "moe", "version": "moe-v1",
        "prompts": [{"id": "a", "n_tokens": 24,
                     "text": " ".join(["Energy per token on small boards."] * 4)}],
    }))
    common = dict(model=quant, prompts=prompts, tokens=8, repeats=1, warmups=0, threads=1,
                  idle_s=0.1, cooldown_s=0.0)
    shown: list[str] = []
    run(RunSettings(out=tmp_path / "local", **common), echo=shown.append)
    local = read_token_log(tmp_path / "local")
    assert local.header["status"] == "completed"
    workers = [LocalWorker(free_port(), tmp_path / f"w{i}.log", node=f"pi{i + 1}")
               for i in range(2)]
    try:
        for w in workers:
            w.start()
        spec = ",".join(f"{w.endpoint.node}={w.endpoint.address}" for w in workers)
        shown.clear()
        run(RunSettings(out=tmp_path / "rpc", workers=spec, node="pi0", **common),
            echo=shown.append)
    finally:
        for w in workers:
            if w.proc is not None and w.proc.poll() is None:
                os.kill(w.proc.pid, signal.SIGCONT)
            w.stop()
    log = read_token_log(tmp_path / "rpc")
    assert log.header["status"] == "completed"
    placement = {e["node"]: e for e in log.header["placement"]}
    # 8 layers + output = 9 units, equal shares: 5 / 4 (llama.cpp's split rule)
    assert placement["pi1"]["layers"] == [0, 1, 2, 3, 4]
    assert placement["pi2"]["layers"] == [5, 6, 7] and placement["pi2"]["extra_tensors"] == [
        "output"
    ]
    # the placement is shown, one line per node
    text = "\n".join(shown)
    assert f"pi1 ({workers[0].endpoint.address}): layers 0-4" in text
    assert f"pi2 ({workers[1].endpoint.address}): layers 5-7 + output" in text
    # each worker's weight buffer holds its layers' tensors, experts included (sizes from gguf)
    _, _, _, nbytes = gguf_view(quant)
    for node in ("pi1", "pi2"):
        layers = placement[node]["layers"]
        held = sum(b for n, b in nbytes.items()
                   if n.startswith("blk.") and int(n.split(".")[1]) in layers)
        experts = sum(b for n, b in nbytes.items() if "_exps." in n and
                      int(n.split(".")[1]) in layers)
        assert experts > held / 2  # most of a MoE layer is its experts
        if "output" in placement[node]["extra_tensors"]:
            held += nbytes["output.weight"] + nbytes["output_norm.weight"]
        assert placement[node]["weights_mib"] == pytest.approx(held / 2**20, rel=0.02, abs=0.05)
    for w in workers:
        assert w.activity().graphs_computed > 0
    # greedy decoding: the same tokens as the local run
    def tokens(events: dict[str, list]) -> list[int]:
        return [t for e, t in zip(events["event"], events["token_id"], strict=True)
                if e == "token"]

    assert tokens(log.events) == tokens(local.events) and tokens(log.events)
