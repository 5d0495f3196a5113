"""Split configurations (host/run/split.py): prefill on one map, decode on another.

The references are computed independently of the handover: the unsplit runner loop
(`timed_request`, llama-cpp-python's generate) and one context doing both phases; the decode
model's own logits after it loads the handed-over state into a context nobody used before.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from epi.core.errors import UserError
from host.gguf_io.file import sha256_file
from host.quant.gguf_info import read_model
from host.quant.mixmap import load_mixmap
from host.quant.quantize import quantize_map
from host.quant.tiny_model import write_test_model
from host.run.engine import load_model, timed_request
from host.run.split import (
    SplitConfig,
    check_same_base,
    clear,
    decode_tokens,
    last_logits,
    load_split,
    read_seq_state,
    refuse_rpc,
    timed_split_request,
    unsplit_request,
    write_seq_state,
)

REPO = Path(__file__).resolve().parents[2]
N_TOKENS = 8
N_CTX = 256


@pytest.fixture(scope="module")
def smollm2() -> Path:
    from host.quant.models import prepare_model

    path = prepare_model("smollm2").path
    assert path is not None
    return Path(path)


@pytest.fixture(scope="module")
def moe_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("moe") / "tiny-qwen3moe-f16.gguf"
    return write_test_model(out, n_layers=4, arch="qwen3moe", n_expert=4)


@pytest.fixture(scope="module")
def smollm2_q8(smollm2: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The study's uniform Q8 map of SmolLM2: a second map of the same base."""
    out = tmp_path_factory.mktemp("q8")
    return quantize_map(load_mixmap(REPO / "quantmaps" / "uniform_q8.json"),
                        read_model(smollm2), sha256_file(smollm2), out, threads=1).output


def _prompt(n: int) -> list[int]:
    return [1 + (7 * i) % 300 for i in range(n)]


@pytest.mark.slow
@pytest.mark.shares_cpu
@pytest.mark.parametrize("which", ["smollm2", "moe_model"])
def test_same_map_both_phases_equals_the_unsplit_run(which: str,
                                                      request: pytest.FixtureRequest) -> None:
    model: Path = request.getfixturevalue(which)
    models = load_split(model, model, threads=2, n_ctx=N_CTX)
    prompt = _prompt(40)
    logits: list[list[float]] = []
    split = timed_split_request(models, prompt, N_TOKENS, keep_logits=logits)
    ref_logits: list[list[float]] = []
    ref = unsplit_request(models.prefill.llm, prompt, N_TOKENS, ref_logits)
    runner = timed_request(models.prefill.llm, prompt, N_TOKENS).token_ids
    assert split.token_ids == ref == runner
    assert logits == ref_logits  # exactly: the decode context holds the same cells
    assert len(set(split.token_ids)) > 1  # a real continuation, not one token repeated
    # the handover lies between token 0 (end of prefill) and token 1, inside the request
    assert (split.token_mono_ns[0] <= split.t_handover_start_mono_ns
            <= split.t_handover_end_mono_ns <= split.token_mono_ns[1] <= split.t_end_mono_ns)
    assert split.state_bytes > 0


@pytest.mark.slow
@pytest.mark.shares_cpu
def test_different_maps_state_and_first_decode_logits(smollm2: Path, smollm2_q8: Path) -> None:
    models = load_split(smollm2, smollm2_q8, threads=2, n_ctx=N_CTX)
    prompt = _prompt(50)
    logits: list[list[float]] = []
    states: list[bytes] = []
    split = timed_split_request(models, prompt, N_TOKENS, keep_logits=logits, keep_state=states)
    # the state read from the prefill context, loaded into the decode one, reads back the same
    pre, dec = models.prefill.llm, models.decode.llm
    clear(pre)
    clear(dec)
    decode_tokens(pre, prompt)
    handed = read_seq_state(pre)
    assert handed == states[0]  # deterministic: the request handed these bytes over
    write_seq_state(dec, handed)
    assert read_seq_state(dec) == handed
    # a fresh context of the decode model, loaded with that state, computes the first decode
    # logits the split request sampled token 1 from
    fresh = load_model(smollm2_q8, threads=2, n_ctx=N_CTX).llm
    write_seq_state(fresh, handed)
    decode_tokens(fresh, [split.token_ids[0]])
    assert last_logits(fresh) == logits[1]
    # and they are the decode model's, not the prefill model's
    own: list[list[float]] = []
    unsplit_request(pre, prompt, 2, own)
    assert own[1] != logits[1]


@pytest.mark.long
def test_a_different_base_model_is_refused_in_one_line(tmp_path: Path) -> None:
    a = write_test_model(tmp_path / "a.gguf", n_layers=2)
    b = write_test_model(tmp_path / "b.gguf", n_layers=3)
    with pytest.raises(UserError, match=r"not quantizations of one base model \(n_layers 2 vs 3"):
        check_same_base(a, b)


@pytest.mark.parametrize(("data", "message"), [
    ([], "must be an object"),
    ({"phases": {"prefill": "a", "decode": "b"}}, "config_id must be a non-empty string"),
    ({"config_id": "s", "phases": "a"}, "phases must be an object"),
    ({"config_id": "s", "phases": {"prefill": "a"}}, "phases.decode must name a map"),
    ({"config_id": "s", "phases": {"prefill": "a", "decode": "b", "verify": "c"}},
     r"unknown phase\(s\) \['verify'\]"),
    ({"config_id": "s", "phases": {"prefill": "a", "decode": "b"}, "x": 1},
     r"unknown field\(s\) \['x'\]"),
])
def test_bad_split_forms_are_refused_naming_the_field(data: object, message: str) -> None:
    with pytest.raises(UserError, match=message) as err:
        SplitConfig.from_json(data, "study.json configs[0]")
    assert "\n" not in str(err.value)
    assert str(err.value).startswith("study.json configs[0]")


def test_split_form_round_trips() -> None:
    data = {"config_id": "q8_prefill_q4_decode",
            "phases": {"prefill": "uniform_q8", "decode": "uniform_q4km"}}
    cfg = SplitConfig.from_json(data)
    assert (cfg.prefill, cfg.decode, cfg.same_map) == ("uniform_q8", "uniform_q4km", False)
    assert cfg.to_json() == data


def test_a_split_over_rpc_is_refused_with_the_reason() -> None:
    refuse_rpc(0)
    with pytest.raises(UserError, match="runs on one node only"):
        refuse_rpc(2)
