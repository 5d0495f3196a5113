"""scripts/build_llama.sh picks llama.cpp's CPU flags from the machine name (`uname -m`).

The choice is tested without an ARM machine: EPI_MACHINE overrides the machine name and
`--print-flags` prints the choice without building. A configure-only cmake run with the
aarch64 flags and the aarch64 cross-compiler shows that llama.cpp turns them into
`-march=armv8.2-a+dotprod+fp16` for its CPU backend (the cross-compiler comes from apt:
`make test` installs g++-aarch64-linux-gnu).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "build_llama.sh"
PI5_ARCH = "armv8.2-a+dotprod+fp16"


def choice(machine: str, **env: str) -> tuple[str, list[str]]:
    """(cache key, flags) the script chooses for `machine`."""
    full = {k: v for k, v in os.environ.items() if k != "EPI_LLAMA_ARM_ARCH"}
    full.update(EPI_MACHINE=machine, **env)
    out = subprocess.run(["bash", str(SCRIPT), "--print-flags"], env=full, check=True,
                         capture_output=True, text=True).stdout.splitlines()
    assert out[0] == f"machine {machine}"
    return out[1].removeprefix("key "), out[2:]


def test_x86_keeps_the_portable_flags_and_cache_key() -> None:
    key, flags = choice("x86_64")
    assert "-DGGML_NATIVE=OFF" in flags
    assert not any(f.startswith("-DGGML_CPU_ARM_ARCH") for f in flags)
    assert not any("AMX" in f for f in flags)
    # the key of the build cached before per-architecture flags existed: no rebuild on x86
    assert key == "ebdf68ff5c94"


@pytest.mark.parametrize("machine", ["aarch64", "arm64"])
def test_aarch64_builds_for_the_pi5(machine: str) -> None:
    _, flags = choice(machine)
    assert f"-DGGML_CPU_ARM_ARCH={PI5_ARCH}" in flags
    assert "-DGGML_NATIVE=OFF" in flags


def test_aarch64_native_on_request() -> None:
    _, flags = choice("aarch64", EPI_LLAMA_ARM_ARCH="native")
    assert "-DGGML_NATIVE=ON" in flags
    assert not any(f.startswith("-DGGML_CPU_ARM_ARCH") for f in flags)


def test_every_variant_has_its_own_cache_key() -> None:
    keys = {choice("x86_64")[0], choice("aarch64")[0], choice("riscv64")[0],
            choice("aarch64", EPI_LLAMA_ARM_ARCH="native")[0]}
    assert len(keys) == 3  # riscv64 shares x86's portable flags and so its key


def _llama_source(tmp: Path) -> Path:
    """llama.cpp's source tree: from the build cache, else unpacked from the cached sdist."""
    cache = Path(os.environ.get("EPI_HOME", Path.home() / ".cache" / "epi"))
    for src in sorted(cache.glob("llama.cpp/0.3.36-*/llama_cpp_python-0.3.36/vendor/llama.cpp")):
        if (src / "CMakeLists.txt").is_file():
            return src
    sdist = cache / "dl" / "llama_cpp_python-0.3.36.tar.gz"
    if not sdist.is_file():
        pytest.fail(f"{sdist} missing: run `make setup` first")
    with tarfile.open(sdist) as tar:
        members = [m for m in tar.getmembers()
                   if "/vendor/llama.cpp/" in m.name and "/models/" not in m.name]
        tar.extractall(tmp, members=members, filter="data")
    return tmp / "llama_cpp_python-0.3.36" / "vendor" / "llama.cpp"


@pytest.mark.slow
@pytest.mark.shares_cpu  # no timing of it is checked: it may run beside another test
def test_cmake_configures_the_aarch64_flags_with_a_cross_compiler(tmp_path: Path) -> None:
    gcc = shutil.which("aarch64-linux-gnu-gcc")
    gxx = shutil.which("aarch64-linux-gnu-g++")
    assert gcc and gxx, "aarch64 cross-compiler missing: `make test` installs g++-aarch64-linux-gnu"
    _, flags = choice("aarch64")
    src = _llama_source(tmp_path)
    argv = ["cmake", "-S", str(src), "-B", str(tmp_path / "build"), *flags,
            "-DCMAKE_SYSTEM_NAME=Linux", "-DCMAKE_SYSTEM_PROCESSOR=aarch64",
            f"-DCMAKE_C_COMPILER={gcc}", f"-DCMAKE_CXX_COMPILER={gxx}"]
    proc = subprocess.run(argv, capture_output=True, text=True, check=False)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-3000:]
    # ggml's CPU backend reports the -march it compiles with
    assert f"-march={PI5_ARCH}" in log, log[-3000:]
    # and the portable x86 flags would not have produced it
    assert "-march=armv8-a " not in log
