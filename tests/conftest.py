"""Shared fixtures: a tiny random-weight llama GGUF made on the fly (no downloads)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import settings

# Generated hostile input, reproducibly: under CI (CI=true, as .ci/run is started) every
# hypothesis test draws the same examples each run (derandomize), so a red CI is the code's
# doing, not the draw's. Elsewhere the draws vary (more ground covered over many runs); a
# failure prints the blob that replays it (@reproduce_failure) and is kept in the local
# example database. HYPOTHESIS_PROFILE=ci reproduces CI's draws on any machine.
settings.register_profile("ci", derandomize=True, database=None, print_blob=True)
settings.register_profile("dev", print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE")
                      or ("ci" if os.environ.get("CI") else "dev"))


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An 8-layer, 256-wide random llama GGUF (F16) with a real SPM tokenizer."""
    from host.quant.tiny_model import write_test_model

    out = tmp_path_factory.mktemp("tiny") / "tiny-llama-f16.gguf"
    write_test_model(out)
    return out
