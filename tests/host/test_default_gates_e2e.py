"""The default validity gates on a real run (issue 31): every other end-to-end test loosens
a gate (the repeat CV limit or the sample-gap rule) for reasons it states; this one runs
`epi run` (the tiny model through llama.cpp) against an emulated meter daemon, analyses with
`Options()` exactly as `epi analyze` defaults, and expects every run and phase valid.

The emulated channel draws a constant 6 W, so J/token is 6 W × seconds per token and the
repeat CV is the CV of the decode speed. On an oversubscribed machine that CV is the other
jobs' doing, and the default 3 % gate rightly refuses it: measured here at a load average of
6 on 2 cores, 56-62 %. So the test needs a machine that is not oversubscribed (load average
below its CPU count) and says so as a skip reason otherwise; it never loosens a gate. The
figure is checked against that closed form from the token log's own times.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from meter.emulation.power_models import ConstantPower

POWER_W = 6.0
# one 384-token prompt: its prefill spans several sweeps at 20 Hz (the default prompts' few
# tokens are prefilled between two sweeps, which the min-samples gate rightly refuses)
PROMPTS = Path(__file__).resolve().parents[2] / "examples" / "prompts-search.json"


@pytest.mark.slow
@pytest.mark.skipif(
    os.environ.get("EPI_QUIET_MACHINE") != "1",
    reason="needs a machine with nothing else running (EPI_QUIET_MACHINE=1): in the full suite "
           "on a 2-core VM the decode CV was 4.9 % (gate 3 %) in one of three runs, so it is "
           "opt-in until the decode speed's spread is tamed (issue 31 stays open for it)")
def test_default_gates_pass_on_a_real_run(tiny_model: Path, tmp_path: Path) -> None:
    load = os.getloadavg()[0]
    if load >= (os.cpu_count() or 1):
        pytest.skip(f"load average {load:.1f} on {os.cpu_count()} CPUs: the decode speed, and "
                    "so J/token, is the other jobs' to set; the CV gate would rightly refuse")
    from host.analysis.pipeline import Options, analyze
    from host.analysis.tokenlog_reader import read_run
    from host.run.runner import RunSettings, run
    from meter.daemon.options import DaemonOptions
    from meter.daemon.service import MeterDaemon

    opts = DaemonOptions(out_dir=tmp_path / "trace", emulate=True, rate_hz=20.0,
                         listen="127.0.0.1:0", n_emulated_channels=1,
                         power_model=[ConstantPower(POWER_W)])
    daemon = MeterDaemon(opts, log=lambda line: None)
    worker = threading.Thread(target=daemon.run, daemon=True)
    worker.start()
    deadline = time.monotonic() + 60
    while not (daemon.ready.is_set() and daemon.server is not None):
        assert time.monotonic() < deadline and worker.is_alive()
        time.sleep(0.05)
    try:
        assert daemon.server is not None
        run(RunSettings(model=tiny_model, out=tmp_path / "run", tokens=120, repeats=3,
                        prompts=PROMPTS, warmups=1, threads=1, idle_s=1.0, cooldown_s=0.2,
                        meter=daemon.server.url), echo=lambda line: None)
        time.sleep(0.5)  # the last sweeps reach the trace
    finally:
        daemon.stop()
        worker.join(timeout=30)
    a = analyze([tmp_path / "run"], tmp_path / "trace", Options())  # the defaults, all gates
    assert a.verdicts["valid"].all(), a.verdicts[["phase", "cv", "reasons"]].to_string()
    head = a.results[(a.results["scope"] == "all") & (a.results["phase"] == "request")
                     & (a.results["unit"] == "generated") & (a.results["basis"] == "gross")]
    assert len(head) == 1 and head["n_runs_valid"].iloc[0] == 1
    assert head["n_repeats"].iloc[0] == 3
    # closed form: 6 W × request seconds / generated tokens, per repeat, from the token log
    rq = read_run(tmp_path / "run").requests
    rq = rq[rq["warmup"] == 0]
    want = [POWER_W * ((g["t_end_mono_ns"] - g["t_start_mono_ns"]).sum() / 1e9)
            / g["n_generated_tokens"].sum() for _, g in rq.groupby("repeat")]
    assert head["j_per_token_median"].iloc[0] == pytest.approx(float(np.median(want)),
                                                               rel=0.02)
