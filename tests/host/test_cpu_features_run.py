"""CPU features end to end: a real run.json records the llama.cpp build's features
next to the CPU's, and `epi analyze` notes, per run, a feature the CPU has and the build leaves
out (not one left out on purpose)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from host.run import cpu_features as cf
from host.run.runner import RunSettings, run
from tests.cli_run import run_epi as _epi

PROMPTS = {
    "format": "epi-prompts", "format_version": 1, "name": "t", "version": "t-v1",
    "prompts": [{"id": "p", "n_tokens": 8, "text": "The quick brown fox jumps over the dog."}],
}


def test_real_run_json_records_build_and_cpu_features(tiny_model: Path, tmp_path: Path) -> None:
    prompts = tmp_path / "prompts.json"
    prompts.write_text(json.dumps(PROMPTS))
    r = run(RunSettings(model=tiny_model, out=tmp_path / "run", prompts=prompts, tokens=4,
                        repeats=1, warmups=0, threads=1, idle_s=0.1, cooldown_s=0.0),
            echo=lambda line: None)
    header = json.loads((r.run_dir / "run.json").read_text())
    f = header["llama_cpp"]["cpu_features"]
    # the build's features are llama_print_system_info's, the CPU's /proc/cpuinfo's
    assert f["build"] == cf.build_features() and f["build"]
    flags = cf.read_cpu_flags()
    assert f["cpu"] == (cf.cpu_has(flags) if flags is not None else None)
    assert f["missing_in_build"] == [x for x in (f["cpu"] or []) if x not in f["build"]]
    assert set(f["notes"]) <= set(f["missing_in_build"])
    # whatever this machine has, the analysis's note follows from what run.json says
    assert bool(cf.run_notes(header)) == bool(cf.unused(f))


def _with_features(rdir: Path, build: list[str], cpu_flags: set[str]) -> None:
    p = rdir / "run.json"
    header = json.loads(p.read_text())
    header["llama_cpp"]["cpu_features"] = cf.compare(build, cpu_flags)
    p.write_text(json.dumps(header))


X86_CPU = {"pni", "ssse3", "avx", "avx2", "fma", "f16c", "bmi2", "amx_int8"}


def test_analyze_notes_a_feature_the_build_leaves_out_per_run(
        synth_run, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        tmp_path: Path) -> None:
    tdir, slow, _, _ = synth_run("slow")
    tdir2, ok, _, _ = synth_run("ok", trace_dir=tmp_path / "trace2")
    _with_features(slow, ["SSE3", "SSSE3", "AVX", "F16C", "BMI2"], X86_CPU)  # no AVX2, FMA
    # AMX left out on purpose (the crash on quantized models): no note
    _with_features(ok, ["SSE3", "SSSE3", "AVX", "AVX2", "F16C", "FMA", "BMI2"], X86_CPU)
    code, out, err = _epi(monkeypatch, capsys, "analyze", str(slow), "--trace", str(tdir),
                          "--out", str(tmp_path / "an"))
    assert code == 0, err
    doc = json.loads((tmp_path / "an" / "results.json").read_text())
    want = ("slow: llama.cpp build leaves out CPU features AVX2, FMA that this CPU has: "
            "joules per token are those of a slower build")
    assert any(n.startswith(want) for n in doc["notes"]), doc["notes"]
    assert f"note: {want}" in out
    code, out, err = _epi(monkeypatch, capsys, "analyze", str(ok), "--trace", str(tdir2),
                          "--out", str(tmp_path / "an2"))
    assert code == 0, err
    doc = json.loads((tmp_path / "an2" / "results.json").read_text())
    assert not any("CPU features" in n for n in doc["notes"]) and "CPU features" not in out
