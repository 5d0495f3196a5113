"""A search state is bound to what it describes: a search.json from another search
(another base model, other hand-made maps, other measuring options, another llama.cpp build)
is refused in one line, and a quantized base is refused before any work."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from epi.core.errors import UserError
from host.quant.tiny_model import write_test_model
from host.search.driver import SearchSettings, run_search
from host.search.identity import (
    check_identity,
    check_unquantized,
    maps_identity,
    model_identity,
)
from host.search.sensitivity import candidate_kl
from tests.cli_run import run_epi
from tests.host.test_search import fake_measurer, four_layer_search

REPO = Path(__file__).resolve().parents[2]
HAND = [REPO / "quantmaps" / "demo" / f"demo_{t}.json" for t in ("q8_0", "q4_0")]
IDENTITY: dict[str, object] = {
    "model": {"size_bytes": 1000, "ends_sha256": "a" * 64},
    "maps": {"uniform_q8_0.json": "b" * 64},
    "options": {"types": ["Q8_0", "Q4_0"], "tokens": 256, "lag": None, "seed": 0},
    "llama_cpp": {"llama_cpp_python": "0.3.9", "build_flags": ["-DGGML_NATIVE=ON"],
                  "rpc": False},
}


def _search(tmp_path: Path, identity: dict[str, object]) -> None:
    space, kl_table, s = four_layer_search(tmp_path)
    s = SearchSettings(out=s.out, candidates=s.candidates, per_round=s.per_round,
                       against=s.against, identity=identity)
    run_search(space, kl_table, s, fake_measurer(space, kl_table, []),
               lambda p: candidate_kl(json.loads(p.read_text()), kl_table),
               echo=lambda _: None)


def test_a_state_of_another_model_is_refused_in_one_line(tmp_path: Path) -> None:
    _search(tmp_path, IDENTITY)
    state = tmp_path / "s" / "search.json"
    assert json.loads(state.read_text())["identity"] == IDENTITY
    _search(tmp_path, IDENTITY)  # the same search resumes
    other = json.loads(json.dumps(IDENTITY))
    other["model"]["ends_sha256"] = "c" * 64
    with pytest.raises(UserError) as exc:
        _search(tmp_path, other)
    msg = str(exc.value)
    assert "\n" not in msg and str(state) in msg and "model.ends_sha256" in msg


def test_a_state_that_cannot_say_what_it_describes_is_refused(tmp_path: Path) -> None:
    _search(tmp_path, IDENTITY)
    state = tmp_path / "s" / "search.json"
    doc = json.loads(state.read_text())
    del doc["identity"]  # as an older epi wrote it, or a hand
    state.write_text(json.dumps(doc))
    with pytest.raises(UserError, match="does not say which model") as exc:
        _search(tmp_path, IDENTITY)
    # the message names what is missing, and does not guess who wrote the file
    assert "'identity' is missing" in str(exc.value) and "by hand or by an older" in str(exc.value)


def _leaves(doc: object, where: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    if isinstance(doc, dict):
        return [p for k, v in doc.items() for p in _leaves(v, (*where, k))]
    return [where]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(leaf=st.sampled_from(_leaves(IDENTITY)),
       value=st.one_of(st.integers(), st.text(max_size=8), st.none(), st.booleans(),
                       st.lists(st.text(max_size=3), max_size=2)),
       drop=st.booleans())
def test_any_changed_field_is_named(leaf: tuple[str, ...], value: object, drop: bool) -> None:
    wanted = json.loads(json.dumps(IDENTITY))
    node = wanted
    for k in leaf[:-1]:
        node = node[k]
    if drop:
        del node[leaf[-1]]
    elif node[leaf[-1]] == value:
        return
    else:
        node[leaf[-1]] = value
    with pytest.raises(UserError) as exc:
        check_identity(IDENTITY, wanted, True, Path("s/search.json"))
    assert ".".join(leaf) in str(exc.value) and "\n" not in str(exc.value)
    check_identity(None, wanted, False, Path("s/search.json"))  # nothing measured: adopted


def test_model_identity_tells_files_of_one_size_apart(tmp_path: Path) -> None:
    a, b = tmp_path / "a.gguf", tmp_path / "b.gguf"
    a.write_bytes(b"GGUF" + bytes(40 << 20))
    b.write_bytes(b"GGUF" + bytes((40 << 20) - 1) + b"\1")  # differs in its last byte only
    assert model_identity(a)["size_bytes"] == model_identity(b)["size_bytes"]
    assert model_identity(a) != model_identity(b)
    assert maps_identity(HAND) != maps_identity(HAND[:1])


@pytest.mark.parametrize("types", [{"blk.0.attn_q.weight": "Q8_0", "output.weight": "F16"},
                                   {"blk.0.attn_q.weight": "Q4_K"}])
def test_a_quantized_base_is_refused(types: dict[str, str]) -> None:
    with pytest.raises(UserError, match="must be unquantized"):
        check_unquantized(types, Path("base.gguf"))
    check_unquantized({"a": "F16", "b": "F32", "c": "BF16"}, Path("base.gguf"))


def test_epi_search_refuses_a_foreign_state_before_any_work(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """The real `epi search` entry point, in-process: the CLI path is the point here, not a
    fresh interpreter (its start-up and imports cost ~0.6 s of CPU a run)."""
    model = write_test_model(tmp_path / "tiny.gguf", n_layers=2)
    out = tmp_path / "out"
    out.mkdir()
    foreign = {"format": "epi-search", "format_version": 1, "rounds": [{"round": 0}],
               "identity": IDENTITY}
    (out / "search.json").write_text(json.dumps(foreign))
    text = tmp_path / "t.txt"
    text.write_text("word " * 400)
    code, stdout, stderr = run_epi(
        monkeypatch, capsys, "search", str(model), "--out", str(out),
        "--against", str(HAND[0]), "--against", str(HAND[1]), "--types", "Q8_0,Q4_0",
        "--text", str(text), "--kl-windows", "1", "--kl-ctx", "64")
    assert code != 0 and "describes another search" in stderr, stderr
    assert "Traceback" not in stderr and "search space:" not in stdout
    assert len([ln for ln in stderr.splitlines() if ln.strip()]) == 1, stderr
