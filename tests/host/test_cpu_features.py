"""The build's CPU features next to the CPU's: parsing, comparison, doctor and run notes.

Expected figures come from real text: llama.cpp's system-info line as it prints it, and the
/proc/cpuinfo of a Raspberry Pi 5 (Cortex-A76) and of an AVX2 x86 machine.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from host import doctor
from host.run import cpu_features as cf

PI5_CPUINFO = """processor\t: 0
BogoMIPS\t: 108.00
Features\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm \
lrcpc dcpop asimddp
CPU implementer\t: 0x41
CPU part\t: 0xd0b
"""
X86_CPUINFO = """processor\t: 0
model name\t: AMD EPYC
flags\t\t: fpu vme de pse tsc msr pae mce cx8 apic sep mtrr pge sse sse2 pni ssse3 fma sse4_1 \
sse4_2 avx f16c bmi1 avx2 bmi2 amx_int8 amx_tile
"""
# llama_print_system_info() of a baseline armv8-a build (GGML_NATIVE=OFF, no GGML_CPU_ARM_ARCH)
ARM_BASELINE = "CPU : NEON = 1 | ARM_FMA = 1 | LLAMAFILE = 1 | OPENMP = 1 | REPACK = 1 | "
# ... and of the armv8.2-a+dotprod+fp16 build scripts/build_llama.sh makes for the Pi 5
ARM_PI5 = ("CPU : NEON = 1 | ARM_FMA = 1 | FP16_VA = 1 | DOTPROD = 1 | LLAMAFILE = 1 | "
           "OPENMP = 1 | REPACK = 1 | ")
X86_PORTABLE = ("CPU : SSE3 = 1 | SSSE3 = 1 | AVX = 1 | AVX2 = 1 | F16C = 1 | FMA = 1 | "
                "BMI2 = 1 | LLAMAFILE = 1 | OPENMP = 1 | REPACK = 1 | ")


def test_pi5_with_a_baseline_build_misses_dotprod_and_fp16() -> None:
    cpu = cf.parse_cpuinfo(PI5_CPUINFO)
    assert cf.cpu_has(cpu) == ["NEON", "ARM_FMA", "FP16_VA", "DOTPROD"]
    base = cf.compare(cf.parse_system_info(ARM_BASELINE), cpu)
    assert base["missing_in_build"] == ["FP16_VA", "DOTPROD"]
    assert cf.unused(base) == ["FP16_VA", "DOTPROD"]
    pi5 = cf.compare(cf.parse_system_info(ARM_PI5), cpu)
    assert pi5["missing_in_build"] == [] and cf.unused(pi5) == []


def test_x86_portable_build_leaves_out_only_amx_on_purpose() -> None:
    f = cf.compare(cf.parse_system_info(X86_PORTABLE), cf.parse_cpuinfo(X86_CPUINFO))
    assert f["build"][:7] == ["SSE3", "SSSE3", "AVX", "AVX2", "F16C", "FMA", "BMI2"]
    assert f["missing_in_build"] == ["AMX_INT8"]
    assert "AMX_INT8" in f["notes"] and cf.unused(f) == []


def test_unreadable_cpuinfo_is_unknown_not_empty(tmp_path: Path) -> None:
    assert cf.read_cpu_flags(tmp_path / "absent") is None
    f = cf.compare(["AVX2"], None)
    assert f["cpu"] is None and f["cpu_reason"] and cf.unused(f) == []


@given(st.text(max_size=300))
def test_system_info_parser_takes_only_enabled_names(text: str) -> None:
    names = cf.parse_system_info(text)
    assert len(names) == len(set(names))
    for name in names:
        assert f"{name} = 1" in text


@given(st.text(max_size=300))
def test_cpuinfo_parser_never_raises(text: str) -> None:
    flags = cf.parse_cpuinfo(text)
    assert all(f and not f.isspace() for f in flags)


def test_run_notes_name_the_missing_features() -> None:
    cpu = cf.parse_cpuinfo(PI5_CPUINFO)
    header = {"llama_cpp": {"cpu_features": cf.compare(cf.parse_system_info(ARM_BASELINE), cpu)}}
    (note,) = cf.run_notes(header)
    assert "FP16_VA, DOTPROD" in note
    header["llama_cpp"]["cpu_features"] = cf.compare(cf.parse_system_info(ARM_PI5), cpu)
    assert cf.run_notes(header) == []
    assert cf.run_notes({"llama_cpp": {"version": "x"}}) == []  # older run.json: no note


def test_this_machine_build_and_doctor() -> None:
    f = cf.cpu_features()
    assert f["build"], "llama_print_system_info reported no features"
    check = doctor._cpu_feature_check()
    assert check.item == "CPU features" and "build uses" in check.detail
    assert check.ok is (not cf.unused(f)) or f["cpu"] is None


def test_doctor_warns_when_the_build_leaves_a_feature_out(monkeypatch: pytest.MonkeyPatch) -> None:
    cpu = cf.parse_cpuinfo(PI5_CPUINFO)
    monkeypatch.setattr(cf, "cpu_features",
                        lambda: cf.compare(cf.parse_system_info(ARM_BASELINE), cpu))
    check = doctor._cpu_feature_check()
    assert check.ok is False and "leaves out FP16_VA DOTPROD" in check.detail and check.fix
