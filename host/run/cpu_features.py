"""CPU features: those the llama.cpp build uses next to those the CPU has.

The build's features come from `llama_print_system_info()` (e.g. `CPU : AVX2 = 1 | FMA = 1 |
...`), the CPU's from the `flags` (x86) or `Features` (ARM) line of /proc/cpuinfo. A feature
the CPU has and the build leaves out (a Pi 5 running a baseline armv8-a build without DOTPROD
and FP16_VA, say) means the measured joules per token are those of a slower build than a user
of that CPU would deploy; `epi doctor` warns about it, run.json records it, and the analysis
notes it per run.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import TypedDict

# llama.cpp's name for a feature -> the /proc/cpuinfo flag that says the CPU has it
CPUINFO_FLAG = {
    # x86
    "SSE3": "pni", "SSSE3": "ssse3", "AVX": "avx", "AVX2": "avx2", "F16C": "f16c",
    "FMA": "fma", "BMI2": "bmi2", "AVX_VNNI": "avx_vnni", "AVX512": "avx512f",
    "AVX512_VBMI": "avx512vbmi", "AVX512_VNNI": "avx512_vnni", "AVX512_BF16": "avx512_bf16",
    "AMX_INT8": "amx_int8",
    # aarch64
    "NEON": "asimd", "ARM_FMA": "asimd", "FP16_VA": "asimdhp", "DOTPROD": "asimddp",
    "MATMUL_INT8": "i8mm", "SVE": "sve", "SME": "sme",
}
X86 = ("SSE3", "SSSE3", "AVX", "AVX2", "F16C", "FMA", "BMI2", "AVX_VNNI", "AVX512",
       "AVX512_VBMI", "AVX512_VNNI", "AVX512_BF16", "AMX_INT8")
ARM = ("NEON", "ARM_FMA", "FP16_VA", "DOTPROD", "MATMUL_INT8", "SVE", "SME")
# left out on purpose, with the reason (shown instead of a plain warning)
DELIBERATE = {"AMX_INT8": "left out on purpose: llama.cpp's AMX path crashed on quantized models"}

_ITEM = re.compile(r"([A-Z0-9_]+) = 1\b")


def parse_system_info(text: str) -> list[str]:
    """Features llama.cpp reports as enabled (`NAME = 1`), in its order, without duplicates."""
    seen: dict[str, None] = {}
    for name in _ITEM.findall(text):
        seen.setdefault(name, None)
    return list(seen)


def parse_cpuinfo(text: str) -> set[str]:
    """The CPU's feature flags from /proc/cpuinfo (first `flags`/`Features` line)."""
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip().lower() in ("flags", "features"):
            return set(value.split())
    return set()


def cpu_has(cpu_flags: set[str]) -> list[str]:
    """llama.cpp feature names the CPU supports, in llama.cpp's order."""
    return [name for name in (*X86, *ARM) if CPUINFO_FLAG[name] in cpu_flags]


class _Features(TypedDict):
    build: list[str]
    cpu: list[str] | None
    missing_in_build: list[str]
    notes: dict[str, str]  # feature -> why the build leaves it out on purpose


class CpuFeatures(_Features, total=False):
    """The build's CPU features next to the CPU's, as run.json `llama_cpp.cpu_features`."""

    cpu_reason: str  # why `cpu` is None


def compare(build: list[str], cpu_flags: set[str] | None) -> CpuFeatures:
    """{"build": [...], "cpu": [...] | None, "missing_in_build": [...], "notes": {...}}.

    `cpu` is None (with `missing_in_build` empty) when the CPU's flags could not be read.
    """
    if cpu_flags is None:
        return {"build": build, "cpu": None, "missing_in_build": [],
                "cpu_reason": "/proc/cpuinfo not readable", "notes": {}}
    cpu = cpu_has(cpu_flags)
    missing = [f for f in cpu if f not in build]
    return {"build": build, "cpu": cpu, "missing_in_build": missing,
            "notes": {f: DELIBERATE[f] for f in missing if f in DELIBERATE}}


def build_features() -> list[str]:
    """Features the loaded llama.cpp build uses (llama_print_system_info)."""
    import llama_cpp

    return parse_system_info(llama_cpp.llama_print_system_info().decode("utf-8", "replace"))


def read_cpu_flags(path: Path = Path("/proc/cpuinfo")) -> set[str] | None:
    """The CPU's flags, or None where /proc/cpuinfo cannot be read."""
    try:
        return parse_cpuinfo(path.read_text(errors="replace"))
    except OSError:
        return None


def cpu_features() -> CpuFeatures:
    """This machine: the build's features next to the CPU's (see `compare`)."""
    return compare(build_features(), read_cpu_flags())


def unused(features: Mapping[str, object] | None) -> list[str]:
    """Features the CPU has and the build leaves out, except those left out on purpose
    (`features` as `compare` makes it, or as read back from a run.json)."""
    if not features:
        return []
    notes = features.get("notes")
    missing = features.get("missing_in_build")
    if not isinstance(missing, list):
        return []
    return [f for f in missing if isinstance(f, str) and not (isinstance(notes, dict)
                                                                and f in notes)]


def run_notes(header: Mapping[str, object]) -> list[str]:
    """The analysis's note for a run whose build left out CPU features (run.json header)."""
    llama = header.get("llama_cpp")
    features = llama.get("cpu_features") if isinstance(llama, dict) else None
    missing = unused(features if isinstance(features, dict) else None)
    if not missing:
        return []
    return [f"llama.cpp build leaves out CPU features {', '.join(missing)} that this CPU has: "
            f"joules per token are those of a slower build than this CPU allows "
            f"(scripts/build_llama.sh picks the flags per architecture)"]
