"""The default validity gates on a real run: every other end-to-end test loosens
a gate (the repeat CV limit or the sample-gap rule) for reasons it states; this one runs
`epi run` (the demo's SmolLM2-135M through llama.cpp, a subprocess) against an emulated meter
daemon on the campaign's default path, analyses with every gate at `epi analyze`'s default, and
expects every run and phase valid.

The default path (`epi demo`, `make demo`): channel 0 follows the CPU time of the inference
process tree (`ProcessTreeActivityModel`: the `epi run` process and its llama.cpp child, named
in a follow file as the campaign names its own PID; the in-process daemon is excluded), and
the analysis reports net J/token (`energy_basis = "net"`, as examples/study-demo.toml), so
the repeat-CV gate checks the net figure. Net J/token is then the tree's CPU time per token
mapped to power: a busy machine that stretches the wall time does not move it, where the
constant-power version of this test measured the decode *speed* (gross J/token = 6 W × s per
token: one 60 ms hiccup in a 1.2 s repeat was 5 %, over the 3 % gate in one of three full-suite
runs). Only `energy_basis` differs from `Options()`; it is the figure's basis, not a gate.

Measured 2026-11-26 on the shared 2-core VM (other agents' jobs running; no quiet machine was
available): at load 16-18 the net repeat CVs were 0.7-2.9 % (passed, 2 of 2 runs); at load
13-16 plus a busy loop, one phase each went over 3 % (3.3-5.5 %, 3 of 3 failed). Those loads
are above the skip rule below (load average > CPUs + 1): there the other jobs set the figures.

The figures are checked against closed forms from outside the analysis: the whole run's
modelled energy above the idle floor equals (max_w − idle_w) × the tree's CPU seconds
(`getrusage` of the waited child) / the machine's CPUs, and the headline's J/token lies between
the idle floor × seconds per token and the maximum power × seconds per token.
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from meter.emulation.power_models import FOLLOW_ENV

IDLE_W, MAX_W = 2.7, 9.5  # the activity model's defaults (Pi-5-like)
# The demo's model (SmolLM2-135M, prepared offline from PyPI) and its three 256-384-token
# prompts, at the demo's one thread: each prefill takes ~0.5-1 s and each 128-token decode
# ~2 s on an idle 2-core machine, so every window spans many 20 Hz sweeps. The tiny test model
# (an earlier version of this test) prefilled such a prompt in ~60 ms and decoded 120 tokens
# in ~0.3 s: on an idle machine its prefill windows held fewer than 2 samples and the energy
# interpolated across each window's two edges (up to one 50 ms sample interval of the step
# each) made a 4.5 % decode repeat CV, although the inference's CPU time did not vary.
DEMO_PROMPTS = Path(__file__).resolve().parents[2] / "examples" / "prompts-demo-long.json"
REPO = Path(__file__).resolve().parents[2]


def _time_per_token_cv(requests: pd.DataFrame, phase: str) -> float:
    """CV over repeats of a phase's wall seconds per token, from the token log alone (one
    thread: its CPU time, i.e. the modelled energy above idle, follows it)."""
    rq = requests[requests["warmup"] == 0]
    start, first, end = (rq[c].astype("int64") for c in
                         ("t_start_mono_ns", "t_first_token_mono_ns", "t_end_mono_ns"))
    span, tokens = {"prefill": (first - start, rq["n_prompt_tokens"]),
                    "decode": (end - first, rq["n_generated_tokens"] - 1),
                    "request": (end - start, rq["n_generated_tokens"])}[phase]
    per = (span.groupby(rq["repeat"]).sum() / 1e9) / tokens.groupby(rq["repeat"]).sum()
    return float(per.std(ddof=1) / per.mean())


def _skip_if_the_machine_varied(verdicts: pd.DataFrame, requests: pd.DataFrame) -> None:
    """Skip (with the figures) when every refused phase was refused for its repeat CV only and
    the same repeats' time per token varied at least 80 % as much: the work itself ran at a
    varying speed (a VM's host: bench/bench_cpu_steadiness.py measured ~12 % per request on
    the development VM, 2026-11-27), which the gate is right to refuse. A phase whose energy
    varied more than its time did — the meter chain's doing — still fails the test."""
    lines = []
    for row in verdicts[~verdicts["valid"].astype(bool)].itertuples():
        if not str(row.reasons).startswith("repeat CV") or ";" in str(row.reasons):
            return  # another gate refused it: fail
        t_cv = _time_per_token_cv(requests, str(row.phase))
        if not t_cv >= 0.8 * float(row.cv):
            return  # the energy varied beyond the time: the chain's doing, fail
        lines.append(f"{row.phase}: net J/token CV {float(row.cv):.1%}, time per token CV "
                     f"{t_cv:.1%}")
    pytest.skip("the machine's own speed varied between the repeats and the gate refused that, "
                "rightly (" + "; ".join(lines) + "): no default-gate verdict on the chain here")


@pytest.mark.slow
def test_default_gates_pass_on_a_real_run(tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    ncpu = os.cpu_count() or 1
    load = os.getloadavg()[0]
    if load > ncpu + 1:
        pytest.skip(f"load average {load:.1f} on {ncpu} CPUs: more than one unrelated job per "
                    "core beside this test, so the inference's CPU time per token and the delay "
                    "from its token stamps to its work are the other jobs' to set (measured at "
                    "load 13-16 with a busy loop: net repeat CV up to 3.3-5.5 %); the default "
                    "gates would rightly refuse")
    from host.analysis.pipeline import Options, analyze
    from host.analysis.tokenlog_reader import read_run
    from host.analysis.traces import read_trace
    from host.quant.models import prepare_model
    from meter.daemon.options import DaemonOptions
    from meter.daemon.service import MeterDaemon

    model = prepare_model("smollm2").path  # the demo's model (cached after the first time)
    assert model is not None
    follow = tmp_path / "follow.pids"
    monkeypatch.setenv(FOLLOW_ENV, str(follow))  # the daemon's channel 0: the process tree
    opts = DaemonOptions(out_dir=tmp_path / "trace", emulate=True, rate_hz=20.0,
                         listen="127.0.0.1:0", n_emulated_channels=1)
    daemon = MeterDaemon(opts, log=lambda line: None)
    worker = threading.Thread(target=daemon.run, daemon=True)
    worker.start()
    deadline = time.monotonic() + 60
    while not (daemon.ready.is_set() and daemon.server is not None):
        assert time.monotonic() < deadline and worker.is_alive()
        time.sleep(0.05)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    try:
        assert daemon.server is not None
        cmd = [sys.executable, "-m", "epi", "run", str(model), "--out",
               str(tmp_path / "run"), "--tokens", "128", "--repeats", "3", "--prompts",
               str(DEMO_PROMPTS), "--warmups", "1", "--threads",
               "1", "--idle-s", "1.0", "--cooldown-s", "0.2", "--meter", daemon.server.url]
        proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True)
        follow.write_text(f"{proc.pid}\n")  # as the campaign names itself
        out, _ = proc.communicate(timeout=600)
        assert proc.returncode == 0, out
        time.sleep(0.5)  # the last sweeps reach the trace
    finally:
        daemon.stop()
        worker.join(timeout=30)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    tree_cpu_s = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)

    a = analyze([tmp_path / "run"], tmp_path / "trace", Options(energy_basis="net"))
    # closed form 1: the run's energy above the idle floor is the tree's CPU time mapped
    s = read_trace(tmp_path / "trace").samples
    s = s[(s["channel"] == 0) & s["energy_j"].notna()]
    span_s = (s["t_mono_ns"].iloc[-1] - s["t_mono_ns"].iloc[0]) / 1e9
    above_idle_j = s["energy_j"].iloc[-1] - s["energy_j"].iloc[0] - IDLE_W * span_s
    assert above_idle_j == pytest.approx((MAX_W - IDLE_W) * tree_cpu_s / ncpu, rel=0.05)

    # the gates: every phase valid — unless the machine itself ran the same work at a varying
    # speed, which the gate rightly refuses and no meter chain can undo
    cvs = a.verdicts.set_index("phase")["cv"]
    print(f"load {load:.2f} → {os.getloadavg()[0]:.2f}; net repeat CV prefill "
          f"{cvs['prefill']:.2%} decode {cvs['decode']:.2%} request {cvs['request']:.2%}")
    if not a.verdicts["valid"].all():
        _skip_if_the_machine_varied(a.verdicts, read_run(tmp_path / "run").requests)
    assert a.verdicts["valid"].all(), a.verdicts[["phase", "cv", "reasons"]].to_string()

    # closed form 2: gross J/token per repeat lies between idle and max power × s per token
    head = a.results[(a.results["scope"] == "all") & (a.results["phase"] == "request")
                     & (a.results["unit"] == "generated")]
    gross = head[head["basis"] == "gross"]
    assert len(gross) == 1 and gross["n_runs_valid"].iloc[0] == 1
    assert gross["n_repeats"].iloc[0] == 3
    rq = read_run(tmp_path / "run").requests
    rq = rq[rq["warmup"] == 0]
    s_per_tok = np.median([((g["t_end_mono_ns"] - g["t_start_mono_ns"]).sum() / 1e9)
                           / g["n_generated_tokens"].sum() for _, g in rq.groupby("repeat")])
    j = gross["j_per_token_median"].iloc[0]
    assert IDLE_W * s_per_tok * 0.98 < j < MAX_W * s_per_tok * 1.02
