"""scripts/build_llama.sh's CUDA switch (a GPU host as an accuracy scoring worker):
EPI_LLAMA_CUDA=1 adds -DGGML_CUDA=ON under its own cache key; unset, nothing changes."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "build_llama.sh"


def flags(**env: str) -> tuple[str, list[str]]:
    full = {k: v for k, v in os.environ.items()
            if k not in ("EPI_LLAMA_CUDA", "EPI_LLAMA_ARM_ARCH")}
    full.update(EPI_MACHINE="x86_64", **env)
    out = subprocess.run(["bash", str(SCRIPT), "--print-flags"], env=full, check=True,
                         capture_output=True, text=True).stdout.splitlines()
    return out[1].removeprefix("key "), out[2:]


def test_cuda_switch_adds_the_flag_under_its_own_key() -> None:
    key, cpu = flags()
    cuda_key, cuda = flags(EPI_LLAMA_CUDA="1")
    assert "-DGGML_CUDA=ON" not in cpu and key == "ebdf68ff5c94"  # the CPU build as before
    assert cuda == [*cpu, "-DGGML_CUDA=ON"] and cuda_key != key
    assert flags(EPI_LLAMA_CUDA="0") == (key, cpu)
