"""The single-machine path end to end, through the real CLI commands as separate processes:
`epi meter run --source auto` (no board, on a synthetic RAPL sysfs tree whose counters advance at
known powers) → a separate `epi run` of the tiny model on the same machine (same clock, so no
--meter: a sources-only daemon serves no HTTP) → `epi analyze` gives measured J/token, labelled
component power, matching the fake's powers."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from meter.sources.common import SYSFS_ROOT_ENV
from tests.meter.sources_fakes import AdvancingRapl

REPO = Path(__file__).resolve().parents[2]
PACKAGE_W, DRAM_W = 30.0, 6.0
PROMPTS = {
    "format": "epi-prompts", "format_version": 1, "name": "test", "version": "test-v1",
    "prompts": [{"id": "p", "n_tokens": 24,
                 "text": " ".join(["A small town wants a bridge."] * 8)}],
}


def _epi(*args: str, env: dict[str, str], timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "epi", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=timeout)


def _wait_recording(trace: Path, proc: subprocess.Popen, log: Path) -> None:
    """Wait until the daemon records: its segment's metadata and first rows are on disk."""
    deadline = time.monotonic() + 120
    while not (trace / "seg-000001.meta.json").is_file() or "recording" not in log.read_text():
        assert proc.poll() is None, log.read_text()[-3000:]
        assert time.monotonic() < deadline, "the daemon never started recording"
        time.sleep(0.1)


@pytest.mark.slow
def test_meter_run_source_auto_then_epi_run_then_analyze(tiny_model: Path, tmp_path: Path
                                                         ) -> None:
    rapl = AdvancingRapl(tmp_path / "sysfs", PACKAGE_W, DRAM_W)
    env = {**os.environ, SYSFS_ROOT_ENV: str(rapl.root)}
    trace, run_dir, an = tmp_path / "trace", tmp_path / "run", tmp_path / "an"
    prompts = tmp_path / "prompts.json"
    prompts.write_text(json.dumps(PROMPTS))
    log = tmp_path / "daemon.log"
    with open(log, "wb") as fh:
        daemon = subprocess.Popen(
            [sys.executable, "-m", "epi", "meter", "run", "--source", "auto", "--out",
             str(trace)],
            cwd=REPO, env=env, stdout=fh, stderr=subprocess.STDOUT)
    try:
        _wait_recording(trace, daemon, log)
        r = _epi("run", str(tiny_model), "--out", str(run_dir), "--prompts",
                 str(prompts), "--tokens", "200", "--repeats", "2", "--warmups", "0",
                 "--threads", "1", "--idle-s", "0.5", "--cooldown-s", "0.05", env=env)
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    finally:
        daemon.send_signal(signal.SIGTERM)
        try:
            daemon.wait(timeout=30)
        finally:
            rapl.stop()
    assert daemon.returncode == 0, log.read_text()[-3000:]
    daemon_log = log.read_text()
    assert "no board: software sources only" in daemon_log
    assert "rapl:package-0 (package, energy)" in daemon_log  # auto found the RAPL zones
    meta = json.loads((trace / "seg-000001.meta.json").read_text())
    assert meta["board"] is None
    assert {c["name"] for c in meta["channels"]} >= {"rapl:package-0", "rapl:dram-0"}

    r = _epi("analyze", str(run_dir), "--trace", str(trace), "--out", str(an), env=env)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "COMPONENT POWER, NOT WALL POWER" in r.stdout
    doc = json.loads((an / "results.json").read_text())
    comp = doc["components"]
    assert comp, "no component block in results.json"
    res = pd.read_csv(an / "results.csv")
    rows = res[(res["scope"] == "all") & (res["phase"] == "request")]
    assert len(rows) and all(ps.startswith("measured: component power, not wall power (rapl")
                             for ps in rows["power_source"])
    # the measured J/token of every repeat (validity verdicts, e.g. the repeat CV on a busy
    # machine, are the analysis's business and not asserted here), against the fake's powers
    # and the token log's own times
    rep = pd.read_csv(an / "repeats.csv")
    rep = rep[(rep["scope"] == "all") & (rep["phase"] == "request")
              & (rep["unit"] == "generated") & (rep["basis"] == "gross")].sort_values("repeat")
    rq = pd.read_csv(run_dir / "requests.csv")
    rq = rq[rq["warmup"] == 0]
    assert len(rep) == 2 and rep["power_source"].str.contains("component power").all()
    for (_, g), got in zip(rq.groupby("repeat"), rep["j_per_token"], strict=True):
        secs = (g["t_end_mono_ns"] - g["t_start_mono_ns"]).sum() / 1e9
        want = (PACKAGE_W + DRAM_W) * secs / g["n_generated_tokens"].sum()
        assert got == pytest.approx(want, rel=rapl.rel_tolerance(len(g), secs))
