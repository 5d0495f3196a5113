"""host/gguf_io: the one GGUF magic check and the fast header reader, against the gguf package."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from epi.core.errors import UserError
from host.gguf_io.file import check_gguf, sha256_file
from host.gguf_io.header import read_gguf_header
from host.quant.tiny_model import write_test_model


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_test_model(tmp_path_factory.mktemp("gguf") / "tiny.gguf", n_layers=2)


@pytest.mark.long
def test_header_scalars_and_element_count_match_the_gguf_package(tiny: Path) -> None:
    import gguf

    reader = gguf.GGUFReader(str(tiny))
    meta, n_elements = read_gguf_header(tiny)
    assert n_elements == sum(int(t.n_elements) for t in reader.tensors)
    for key in ("general.architecture", "llama.block_count", "llama.context_length",
                "llama.embedding_length"):
        assert meta[key] == reader.fields[key].contents(), key
    assert meta["tokenizer.ggml.tokens"] is None  # arrays are skipped, not read


def test_truncated_header_is_a_value_error(tiny: Path, tmp_path: Path) -> None:
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(tiny.read_bytes()[:200])
    with pytest.raises(ValueError, match=r"file ends inside|runs past the end of the file"):
        read_gguf_header(cut)


def test_check_gguf_names_the_file_and_problem(tmp_path: Path) -> None:
    with pytest.raises(UserError, match=r"none\.gguf: model file not found$"):
        check_gguf(tmp_path / "none.gguf")
    with pytest.raises(UserError, match="model path is not a file"):
        check_gguf(tmp_path)
    (tmp_path / "text.gguf").write_text("hello")
    with pytest.raises(UserError, match=r"not a GGUF file \(starts with b'hell'"):
        check_gguf(tmp_path / "text.gguf")


def test_sha256_file_is_hashlib_of_the_bytes(tiny: Path) -> None:
    assert sha256_file(tiny, chunk_bytes=1000) == hashlib.sha256(tiny.read_bytes()).hexdigest()


def _kv_only_gguf(path: Path, version: int, keys: list[str]) -> Path:
    """A GGUF of no tensors whose metadata is `keys`, each a uint32 (type 4) of value 7, laid
    out by the gguf spec (magic, version, tensor count, key/value count, key/values)."""
    import struct

    body = b"GGUF" + struct.pack("<IQQ", version, 0, len(keys))
    for key in keys:
        raw = key.encode()
        body += struct.pack("<Q", len(raw)) + raw + struct.pack("<II", 4, 7)
    path.write_bytes(body)
    return path


def test_a_key_given_twice_is_refused_as_llama_cpp_refuses_it(tmp_path: Path) -> None:
    """llama.cpp's gguf loader (gguf.cpp) refuses a file with a duplicated key; the header
    reader does too instead of letting the last value win."""
    ok = _kv_only_gguf(tmp_path / "ok.gguf", 3, ["a.b", "a.c"])
    assert read_gguf_header(ok) == ({"a.b": 7, "a.c": 7}, 0)
    twice = _kv_only_gguf(tmp_path / "twice.gguf", 3, ["a.b", "a.b"])
    with pytest.raises(ValueError, match=r"duplicate metadata key 'a\.b'"):
        read_gguf_header(twice)


def test_version_1_is_refused_before_its_other_layout_is_read(tmp_path: Path) -> None:
    old = _kv_only_gguf(tmp_path / "v1.gguf", 1, ["a.b"])
    with pytest.raises(ValueError, match="GGUF version 1 cannot be read"):
        read_gguf_header(old)


@pytest.mark.parametrize("value", [
    (8, b"\xff" * 8),                      # a string of 2**64 - 1 bytes
    (9, (4).to_bytes(4, "little") + b"\xff" * 8),   # an array of 2**64 - 1 uint32
    (9, (8).to_bytes(4, "little") + (2).to_bytes(8, "little") + b"\xff" * 8),  # its strings
], ids=["string", "scalar array", "string array"])
def test_a_hostile_length_is_one_value_error(tmp_path: Path, value: tuple[int, bytes]) -> None:
    """A length past the end of the file is refused before it is read or skipped (it was a
    MemoryError or an OverflowError, a traceback for the user)."""
    import struct

    vtype, payload = value
    key = b"a.b"
    body = (b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", len(key)) + key
            + struct.pack("<I", vtype) + payload)
    path = tmp_path / "hostile.gguf"
    path.write_bytes(body)
    with pytest.raises(ValueError, match="runs past the end of the file"):
        read_gguf_header(path)
