"""The single-machine path with no board: `epi run --power rapl` records a synthetic
sysfs RAPL tree (counters advancing at known powers) beside a real run of the test model, and
`epi analyze RUN --trace RUN/power` gives measured J/token labelled component power."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from host.analysis.model import Options
from host.analysis.pipeline import analyze
from host.analysis.tokenlog_reader import read_run
from meter.sources.common import SYSFS_ROOT_ENV
from tests.cli_run import run_epi as _epi
from tests.meter.sources_fakes import AdvancingRapl

PACKAGE_W, DRAM_W = 30.0, 6.0
PROMPTS = {
    "format": "epi-prompts", "format_version": 1, "name": "test", "version": "test-v1",
    "prompts": [{"id": "p", "n_tokens": 24,
                 "text": " ".join(["A small town wants a bridge."] * 8)}],
}


@pytest.mark.slow
def test_run_power_rapl_then_analyze_gives_component_j_per_token(
        tiny_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    rapl = AdvancingRapl(tmp_path / "sysfs", PACKAGE_W, DRAM_W)
    monkeypatch.setenv(SYSFS_ROOT_ENV, str(rapl.root))
    prompts = tmp_path / "prompts.json"
    prompts.write_text(json.dumps(PROMPTS))
    run_dir = tmp_path / "run"
    try:
        code, out, err = _epi(monkeypatch, capsys, "run", str(tiny_model), "--out", str(run_dir),
                              "--prompts", str(prompts), "--tokens", "200", "--repeats", "2",
                              "--warmups", "0", "--threads", "1", "--idle-s", "0.5",
                              "--cooldown-s", "0.05", "--power", "rapl")
    finally:
        rapl.stop()
    assert code == 0, err
    assert "power trace in" in out and "component power, not wall power" in out
    assert json.loads((run_dir / "run.json").read_text())["power_trace"] == "power"
    code, out, err = _epi(monkeypatch, capsys, "analyze", str(run_dir), "--trace",
                          str(run_dir / "power"), "--out", str(tmp_path / "an"))
    assert code == 0, err
    assert "COMPONENT POWER, NOT WALL POWER" in out
    # expected from the powers the fake was given and the token log's own times
    rq = read_run(run_dir).requests  # the token-log reader's pandas view
    rq = rq[rq["warmup"] == 0]
    per_rep = [(PACKAGE_W + DRAM_W) * ((g["t_end_mono_ns"] - g["t_start_mono_ns"]).sum() / 1e9)
               / g["n_generated_tokens"].sum() for _, g in rq.groupby("repeat")]
    # the figures (the sample-gap validity rule is left out: a loaded CI machine may stall a
    # polling thread for more than 3 periods, which that rule rightly makes null windows)
    a = analyze([run_dir], run_dir / "power", Options(max_gap_periods=1e9))
    rep = a.repeats
    rep = rep[(rep["scope"] == "all") & (rep["phase"] == "request")
              & (rep["unit"] == "generated") & (rep["basis"] == "gross")].sort_values("repeat")
    durations = [((g["t_end_mono_ns"] - g["t_start_mono_ns"]).sum() / 1e9, len(g))
                 for _, g in rq.groupby("repeat")]
    for got, want, (secs, n) in zip(rep["j_per_token"], per_rep, durations, strict=True):
        assert got == pytest.approx(want, rel=rapl.rel_tolerance(n, secs))
    win = a.windows[(a.windows["scope"] == "all") & (a.windows["kind"] == "idle")]
    for _, w in win.iterrows():
        assert w["power_w"] == pytest.approx(PACKAGE_W + DRAM_W,
                                             rel=rapl.rel_tolerance(1, w["duration_s"]))
