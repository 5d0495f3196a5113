"""The accuracy results store: content keys, reuse across stores, refusal of bad entries."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from epi.core.errors import UserError
from host.accuracy import cache, store
from host.errors import StoreError

KEY = {"kind": "benchmark", "benchmark": "arc_challenge", "model_sha256": "b" * 64,
       "items_sha256": "c" * 64, "n": 2, "seed": 0, "ctx": 128, "format": "cloze",
       "scorer_version": 2, "llama_cpp_python": "0.3.36"}
RESULT = {"records": [{"id": "q0", "gold": 0, "scores": [[-1.0, 2, 4], [-2.0, 2, 5]]},
                      {"id": "q1", "gold": 1, "scores": [[-1.5, 3, 7], [-0.5, 1, 3]]}],
          "seconds": 1.25, "n_ctx": 256}


def _entry() -> tuple[dict[str, object], Path]:
    full = store.full_key(KEY)
    return full, store.save(full, RESULT)


def _rewrite(path: Path, edit: dict[str, object], rehash: bool = False) -> None:
    doc = json.loads(path.read_text())
    doc.update(edit)
    if rehash:
        doc["result_sha256"] = store.digest(doc["result"])
        doc["key_sha256"] = store.digest(doc["key"])
    path.write_text(json.dumps(doc))


def test_key_carries_the_build_and_content_decides_the_place() -> None:
    full = store.full_key(KEY)
    build = full["llama_build"]
    assert isinstance(build, dict)
    assert set(build) == {"llama_cpp_python", "build_flags", "gpu_layers"}
    other = {**full, "llama_build": {**build, "build_flags": ["-DGGML_CUDA=ON"]}}
    assert store.entry_path(other) != store.entry_path(full)  # another build: another result
    with store.benchmark_build(other["llama_build"]):
        assert store.full_key(KEY)["llama_build"] == other["llama_build"]
        assert store.full_key({**KEY, "kind": "perplexity"})["llama_build"] == build
    assert store.full_key(KEY)["llama_build"] == build


def test_gpu_offload_is_part_of_the_build(monkeypatch: pytest.MonkeyPatch) -> None:
    """A GPU worker (EPI_GPU_LAYERS) computes differently: its results get their own key."""
    cpu = store.full_key(KEY)
    monkeypatch.setenv("EPI_GPU_LAYERS", "-1")
    gpu = store.full_key(KEY)
    assert gpu["llama_build"]["gpu_layers"] == -1  # type: ignore[index]
    assert store.entry_path(gpu) != store.entry_path(cpu)
    monkeypatch.setenv("EPI_GPU_LAYERS", "all")
    with pytest.raises(UserError, match="EPI_GPU_LAYERS: expected an integer"):
        store.full_key(KEY)


def test_a_result_scored_elsewhere_is_reused(tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """An entry written into one store and copied into another is found there as is."""
    elsewhere = tmp_path / "lab-b-store"
    monkeypatch.setenv(store.ENV, str(elsewhere))
    assert cache.load_result(KEY) is None
    cache.store_result(KEY, RESULT)
    here = tmp_path / "lab-a-store"
    shutil.copytree(elsewhere, here)
    monkeypatch.setenv(store.ENV, str(here))
    assert cache.load_result(KEY) == RESULT
    assert cache.load_result({**KEY, "seed": 1}) is None  # another item set: not this result


@pytest.mark.parametrize(("edit", "rehash", "message"), [
    ({"format": "epi-accuracy"}, False, "field 'format'"),
    ({"format_version": 9}, False, "field 'format_version' is 9"),
    ({"result": {**RESULT, "seconds": 9.0}}, False, "does not match the result"),
    ({"key_sha256": "0" * 64}, False, "'key_sha256' does not match"),
    ({"result": {**RESULT, "records": RESULT["records"][:1]}}, True,
     "has 1 records, the key says n=2"),
    ({"result": {**RESULT, "records": [RESULT["records"][0]] * 2}}, True, "repeated"),
    ({"result": {**RESULT, "records": [{"id": "q0", "gold": 5,
                                        "scores": [[-1.0, 2, 4], [-2.0, 2, 5]]},
                                       RESULT["records"][1]]}}, True, "gold is not a choice"),
    ({"result": {**RESULT, "n_ctx": 64}}, True, "smaller than the key's ctx"),
])
def test_an_edited_or_inconsistent_entry_is_refused(edit: dict[str, object], rehash: bool,
                                                    message: str) -> None:
    full, path = _entry()
    _rewrite(path, edit, rehash)
    with pytest.raises(StoreError, match=message) as err:
        store.load(full)
    text = str(err.value)
    assert "\n" not in text and str(path) in text and "refused" in text


def test_a_foreign_entry_under_this_key_is_refused() -> None:
    """The file that sits where this key's result belongs answers another question."""
    full, path = _entry()
    other = {**full, "n": 1}
    doc = json.loads(path.read_text())
    doc["key"], doc["key_sha256"] = other, store.digest(other)
    path.write_text(json.dumps(doc))
    with pytest.raises(StoreError, match="key field 'n' is 1, asked for 2"):
        store.load(full)


def test_bad_json_and_huge_entries_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    full, path = _entry()
    path.write_text("{" * 10 + "not json")
    with pytest.raises(StoreError, match="not valid JSON"):
        store.load(full)
    path.write_text("[" * 100_000)
    with pytest.raises(StoreError, match="not valid JSON"):
        store.load(full)
    _, path = _entry()
    monkeypatch.setattr(store, "MAX_ENTRY_BYTES", 100)
    with pytest.raises(StoreError, match="more than 100"):
        store.load(full)
    assert issubclass(StoreError, UserError)


def test_the_command_refuses_a_tampered_entry_in_one_line(
        tiny_model: Path, prepared: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """`epi accuracy` scores into the store; a flipped gold there stops the next run with one
    line naming the file (exit 2), never a silently different accuracy."""
    from tests.cli_run import run_epi

    args = ["accuracy", str(tiny_model), "--n", "3", "--bench", "arc_challenge", "--ctx", "64",
            "--threads", "1", "--out", str(tmp_path / "a.json")]
    code, _, err = run_epi(monkeypatch, capsys, *args)
    assert code == 0, err
    entries = sorted(store.store_root().rglob("arc_challenge-*.json"))
    assert len(entries) == 1, [json.loads(e.read_text())["key"] for e in entries]
    (path,) = entries
    doc = json.loads(path.read_text())
    rec = doc["result"]["records"][0]
    rec["gold"] = (rec["gold"] + 1) % len(rec["scores"])
    path.write_text(json.dumps(doc))
    code, out, err = run_epi(monkeypatch, capsys, *args)
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and str(path) in lines[0] and "does not match the result" in lines[0]
    assert "Traceback" not in err + out
