"""Done-when flow in one test: `epi meter run --emulate-bridge` (the real firmware behind an
emumcu:// serial port, real time), `epi run` with clock sync against it, then the analysis: J/token
through the bridge, with the emulated channel's constant 6 W as the truth."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np
import pytest

from meter.emulation.power_models import ConstantPower

POWER_W = 6.0


def _last_sample_mono_ns(daemon: object) -> int:
    """The meter time of the newest sample the daemon has written (0 before any)."""
    session = daemon.session  # type: ignore[attr-defined]
    last = session.state.snapshot()["channels"][0]["last"] if session is not None else None
    return int(last["t_mono_ns"]) if last else 0


@pytest.mark.slow
def test_emulate_bridge_then_epi_run_then_analyze(tiny_model: Path, tmp_path: Path) -> None:
    from host.analysis.pipeline import Options, analyze
    from host.run.runner import RunSettings, run
    from meter.daemon.service import DaemonOptions, MeterDaemon

    opts = DaemonOptions(out_dir=tmp_path / "trace", emulate_bridge=True, listen="127.0.0.1:0",
                         n_emulated_channels=1, power_model=[ConstantPower(POWER_W)])
    daemon = MeterDaemon(opts, log=lambda line: None)
    worker = threading.Thread(target=daemon.run, daemon=True)
    worker.start()
    deadline = time.monotonic() + 60
    while not (daemon.ready.is_set() and daemon.sampler is not None
               and daemon.sampler.stats.samples_written > 10):  # type: ignore[attr-defined]
        assert time.monotonic() < deadline and worker.is_alive()
        time.sleep(0.05)
    try:
        assert daemon.server is not None
        # 256 tokens: each request spans ~1 s, many sweeps even when a loaded machine slows
        # the emulated bridge well below its 20 Hz (48 tokens, ~0.15 s, could hold < 2 sweeps)
        run(RunSettings(model=tiny_model, out=tmp_path / "run", tokens=256, repeats=2, warmups=0,
                        threads=1, idle_s=1.0, cooldown_s=0.2, meter=daemon.server.url),
            echo=lambda line: None)
        # the sweeps after the run reach the trace: until it holds a sample stamped after the
        # run returned (the last request's window then has a reading on both sides)
        t_end = time.monotonic_ns()
        deadline = time.monotonic() + 30
        while _last_sample_mono_ns(daemon) <= t_end:
            assert time.monotonic() < deadline and worker.is_alive()
            time.sleep(0.02)
    finally:
        daemon.stop()
        worker.join(timeout=30)
    assert not worker.is_alive()
    # repeat CV gate off: at a constant 6 W the CV is the decode speed's, which other jobs on
    # a shared machine set (tests/host/test_default_gates_e2e.py runs the default gates)
    a = analyze([tmp_path / "run"], tmp_path / "trace", Options(cv_threshold=1.0))
    w = a.windows[(a.windows["kind"] == "request") & (a.windows["scope"] == "all")]
    assert len(w) >= 8
    dur_s = (w["t1_local_ns"].to_numpy() - w["t0_local_ns"].to_numpy()) / 1e9
    energy = w["energy_j"].to_numpy(dtype=float)
    assert np.isfinite(energy).all(), w[["energy_j", "reason"]]
    total = energy.sum()
    truth = POWER_W * dur_s.sum()
    # counter resolution 3.6 mJ per window edge, clock mapping well under a millisecond
    assert abs(total - truth) <= 0.01 * truth + 2 * 0.0036 * len(w), (total, truth)
    rep = a.repeats
    jpt = rep[(rep["scope"] == "all") & (rep["phase"] == "request")]["j_per_token"]
    assert len(jpt) and np.isfinite(jpt.to_numpy(dtype=float)).all()
    assert a.trace.segments[0].meta["bridged"] is True
