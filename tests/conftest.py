"""Shared fixtures: a tiny random-weight llama GGUF made on the fly (no downloads)."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An 8-layer, 256-wide random llama GGUF (F16) with a real SPM tokenizer."""
    from host.quant.tiny_model import write_test_model

    out = tmp_path_factory.mktemp("tiny") / "tiny-llama-f16.gguf"
    write_test_model(out)
    return out
