"""The work account's bytes per decoded token against the gguf package's own tensor table.

The expected figure is computed here from gguf.GGUFReader (an independent reader of the same
file): dense tensors in full, one embedding row, and `n_expert_used / n_expert` of the merged
expert tensors.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from epi.core.errors import UserError
from host.analysis.work_account import work_account
from host.quant.tiny_model import write_test_model


def _expected(path: Path) -> tuple[float, int, int]:
    import gguf

    r = gguf.GGUFReader(str(path))
    arch = bytes(r.fields["general.architecture"].parts[-1]).decode()
    n_expert = n_used = 0
    if f"{arch}.expert_count" in r.fields:
        n_expert = int(r.fields[f"{arch}.expert_count"].parts[-1][0])
        n_used = int(r.fields[f"{arch}.expert_used_count"].parts[-1][0])
    names = {t.name for t in r.tensors}
    total = 0.0
    experts = 0
    for t in r.tensors:
        nbytes = int(t.n_bytes)
        if "_exps." in t.name:
            experts += nbytes
            total += nbytes * n_used / n_expert
        elif t.name == "token_embd.weight" and "output.weight" in names:
            total += nbytes / int(t.shape[1])  # one row of n_vocab
        else:
            total += nbytes
    return total, experts, n_expert


@pytest.mark.long  # 2-3 s a model on an idle 2-core machine: generates and reads each GGUF
@pytest.mark.parametrize("arch", ["llama", "qwen3moe", "qwen2moe"])
def test_bytes_per_token_match_an_independent_reader(tmp_path: Path, arch: str) -> None:
    path = write_test_model(tmp_path / f"{arch}.gguf", n_layers=2, arch=arch, n_expert=4,
                            n_expert_used=2)
    acc = work_account(path)
    total, experts, n_expert = _expected(path)
    assert acc.bytes_per_token == pytest.approx(total, rel=1e-12)
    assert acc.expert_bytes == experts
    assert acc.is_expectation == (n_expert > 0)
    if n_expert:
        # the expectation lies strictly between the shared tensors alone and every expert read
        assert acc.dense_bytes < acc.bytes_per_token < acc.dense_bytes + acc.expert_bytes + \
            acc.embedding_row_bytes
        assert "expectation" in acc.method()


def test_more_experts_used_stream_more_bytes(tmp_path: Path) -> None:
    one = work_account(write_test_model(tmp_path / "a.gguf", n_layers=2, arch="qwen3moe",
                                        n_expert=4, n_expert_used=1))
    all_ = work_account(write_test_model(tmp_path / "b.gguf", n_layers=2, arch="qwen3moe",
                                         n_expert=4, n_expert_used=4))
    assert one.expert_bytes == all_.expert_bytes
    # closed form: the difference is (4 - 1) / 4 of the expert bytes
    assert all_.bytes_per_token - one.bytes_per_token == pytest.approx(0.75 * one.expert_bytes)


def test_a_file_that_is_not_gguf_is_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "x.gguf"
    bad.write_bytes(b"not a model")
    with pytest.raises(UserError, match=r"x\.gguf"):
        work_account(bad)
