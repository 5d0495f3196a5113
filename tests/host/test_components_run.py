"""The single-machine path of issue 17 with no board: `epi run --power rapl` records a synthetic
sysfs RAPL tree (counters advancing at known powers) beside a real run of the test model, and
`epi analyze RUN --trace RUN/power` gives measured J/token labelled component power."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from epi.cli import main
from meter.sources.common import SYSFS_ROOT_ENV
from tests.meter.sources_fakes import AdvancingRapl

PACKAGE_W, DRAM_W = 30.0, 6.0
PROMPTS = {
    "format": "epi-prompts", "format_version": 1, "name": "test", "version": "test-v1",
    "prompts": [{"id": "p", "n_tokens": 24,
                 "text": " ".join(["A small town wants a bridge."] * 8)}],
}


def _epi(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], *args: str
         ) -> tuple[int, str, str]:
    monkeypatch.setattr(sys, "argv", ["epi", *args])
    code = 0
    try:
        main()
    except SystemExit as exc:
        code = int(exc.code or 0)
    out = capsys.readouterr()
    return code, out.out, out.err


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
    rq = pd.read_csv(run_dir / "requests.csv")
    rq = rq[rq["warmup"] == 0]
    per_rep = [(PACKAGE_W + DRAM_W) * ((g["t_end_mono_ns"] - g["t_start_mono_ns"]).sum() / 1e9)
               / g["n_generated_tokens"].sum() for _, g in rq.groupby("repeat")]
    # per repeat (the run's validity verdict depends on this loaded machine's timing: a CV
    # over 3 % or a prefill shorter than two samples marks it invalid, which is not at issue)
    rep = pd.read_csv(tmp_path / "an" / "repeats.csv")
    rep = rep[(rep["scope"] == "all") & (rep["phase"] == "request")
              & (rep["unit"] == "generated") & (rep["basis"] == "gross")].sort_values("repeat")
    np.testing.assert_allclose(rep["j_per_token"].to_numpy(), per_rep, rtol=0.03)
    win = pd.read_csv(tmp_path / "an" / "windows.csv")
    idle = win[(win["scope"] == "all") & (win["kind"] == "idle")]
    np.testing.assert_allclose(idle["power_w"], PACKAGE_W + DRAM_W, rtol=0.03)
