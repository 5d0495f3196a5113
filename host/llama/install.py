"""Where this machine's llama.cpp lives: bindings, native tools, build flags, vocab files.

scripts/build_llama.sh installs the llama-cpp-python bindings together with the libraries and
tools it built (llama-quantize, llama-perplexity, ggml-rpc-server) from the same pinned source,
so everything here is found next to the `llama_cpp` package — no PATH or LD_LIBRARY_PATH set-up.
"""

from __future__ import annotations

import importlib.util
import os
from functools import lru_cache
from pathlib import Path
from typing import TypedDict

from epi.core.errors import UserError

LLAMA_CPP_PYTHON_VERSION = "0.3.36"
TOOLS = ("llama-quantize", "llama-perplexity", "ggml-rpc-server")
SETUP_HINT = (
    "run `make setup` (scripts/build_llama.sh builds llama.cpp for this CPU, GGML_RPC=ON)"
)


@lru_cache(maxsize=1)
def package_dir() -> Path:
    """Directory of the installed `llama_cpp` package (without importing it)."""
    spec = importlib.util.find_spec("llama_cpp")
    if spec is None or not spec.submodule_search_locations:
        raise UserError(f"llama-cpp-python is not installed: {SETUP_HINT}")
    return Path(next(iter(spec.submodule_search_locations)))


def lib_dir() -> Path:
    """The directory holding libllama/libggml that the bindings load."""
    return package_dir() / "lib"


def tool_path(name: str) -> Path:
    """Path of one of llama.cpp's native tools built alongside the bindings."""
    if name not in TOOLS:
        raise ValueError(f"unknown llama.cpp tool {name!r}")
    path = package_dir() / "bin" / name
    if not path.is_file():
        raise UserError(f"llama.cpp tool {name} not found at {path}: {SETUP_HINT}")
    return path


def tool_env() -> dict[str, str]:
    """Environment for running a native tool against the same libraries as the bindings."""
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = os.pathsep.join(
        p for p in (str(lib_dir()), env.get("LD_LIBRARY_PATH", "")) if p
    )
    return env


def build_flags() -> list[str]:
    """CMake flags llama.cpp was built with (recorded by the build script), [] if unknown."""
    path = package_dir() / ".epi-build-flags"
    if not path.is_file():
        return []
    return [line.strip() for line in path.read_text().splitlines() if line.strip()]


def vocab_path(name: str = "llama-spm") -> Path:
    """A vocab-only GGUF from llama.cpp's source tree (real tokenizer for test models)."""
    path = package_dir() / "vocab" / f"ggml-vocab-{name}.gguf"
    if not path.is_file():
        raise UserError(f"llama.cpp vocab file {path.name} not found at {path}: {SETUP_HINT}")
    return path


class LlamaBuild(TypedDict):
    """Version and build of the llama.cpp in use, as manifests and token logs record it."""

    llama_cpp_python: str
    build_flags: list[str]
    rpc: bool


def llama_info() -> LlamaBuild:
    """Version and build information recorded in manifests and token logs."""
    import llama_cpp

    return {
        "llama_cpp_python": str(getattr(llama_cpp, "__version__", "unknown")),
        "build_flags": build_flags(),
        "rpc": bool(llama_cpp.llama_supports_rpc()),
    }
