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
    with pytest.raises(ValueError, match="file ends inside"):
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
