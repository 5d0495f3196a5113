"""A real campaign metered by two daemons: `[[meter]]` tables, each daemon in its own
process on its own clock, nodes spread across both, the analysis against the emulators' truth.

The two daemons are the real meter stack (meter.daemon: board file, emulated ATM90E26, driver,
sampler, trace writer, clock-sync server), started here so that each runs on a clock of its own
that really ticks: meter A reads the host's CLOCK_MONOTONIC shifted by +5 s and running 300 ppm
fast, meter B shifted by +900 s and running 800 ppm slow. Each daemon meters one node with a
scripted power profile in its own clock (ScriptedProfile: triangles of 0.05 s steps, 4–8 W
over 20 s and 3–7 W over 14 s), so the truth of any window is that profile's exact `energy_j`
between the window's ends mapped into that daemon's clock by the *true* mapping (which the
campaign never sees: it knows each meter only through its own clock syncs). A window placed
1 s off in a meter's clock misses its truth by up to 7 % (A) or 11 % (B). The slopes are this
gentle because a sample is stamped at the middle of its register reads while the energy
register is read at their end (meter/chip/protocol.py), and on a loaded machine the reads
stretch (≈120 ms seen at load 14 on 2 cores): steep profiles turned that into errors of 2–10 %
per window (3–9 W over 4 s); these give ≤ 0.2 % (one window 1.6 %) at load 18.

The campaign (`epi campaign`, a subprocess) runs the tiny model once (1 round, 2 short prompts,
2 repeats) split over this host (node n0, on meter A) and one local RPC worker (node n1, on
meter B), syncing clocks with both daemons, then analyses both traces. It is killed (SIGKILL)
once inside its run and resumed: the journal's resume with two meters. Its decode J/token per
repeat, over both nodes, must agree with the truth within 1 % (as the one-daemon ground-truth
tests, tests/host/test_align_groundtruth.py and test_multi_meter.py).
"""

from __future__ import annotations

import json
import math
import multiprocessing
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from epi.core.net import free_port
from meter.emulation.power_models import ScriptedProfile

REPO = Path(__file__).resolve().parents[2]
NS = 1_000_000_000
# meter: (clock shift vs the host, drift ppm, node, triangle period s, low W, high W)
METERS = {"a": (5 * NS, 300.0, "n0", 20.0, 4.0, 8.0), "b": (900 * NS, -800.0, "n1", 14.0, 3.0, 7.0)}
PROFILE_S = 1800.0  # the profile spans the whole test
PROMPTS = {"format": "epi-prompts", "format_version": 1, "name": "two-meters",
           "version": "two-meters-v1",
           "prompts": [{"id": "a", "n_tokens": 16,
                        "text": " ".join(["Energy per token on small boards."] * 4)},
                       {"id": "b", "n_tokens": 24,
                        "text": " ".join(["The bridge crosses the river."] * 6)}]}
# decode ≈ 1 s on an idle 2-core machine (the tiny model runs ~400 tok/s there): ~10 samples
# per decode window at 10 Hz; with 64 tokens an idle machine's decode fit between two
# samples and every window was null (it passed only while a loaded machine slowed it)
TOKENS = 384


class SkewedClock:
    """CLOCK_MONOTONIC seen by a meter whose clock is shifted and runs at its own rate:
    meter = ref_meter + (local − ref_local) · (1 + ppm·1e-6). It really ticks (not simulated)."""

    simulated = False

    def __init__(self, ref_local_ns: int, ref_meter_ns: int, drift_ppm: float) -> None:
        self.ref_local, self.ref_meter, self.rate = ref_local_ns, ref_meter_ns, 1 + drift_ppm * 1e-6

    def monotonic_ns(self) -> int:
        return self.ref_meter + round((time.monotonic_ns() - self.ref_local) * self.rate)

    def realtime_ns(self) -> int:
        return time.time_ns()

    def sleep_until(self, t_mono_ns: int) -> None:
        while (left := t_mono_ns - self.monotonic_ns()) > 0:
            time.sleep(left / self.rate / 1e9)

    def describe(self) -> dict[str, object]:
        return {"kind": "system-skewed (test)", "drift_ppm": (self.rate - 1) * 1e6}


def true_meter_ns(name: str, ref_local_ns: int, local_ns: np.ndarray) -> np.ndarray:
    shift, ppm = METERS[name][:2]
    return ref_local_ns + shift + np.rint((local_ns - ref_local_ns) * (1 + ppm * 1e-6)).astype(
        np.int64)


def profile(name: str, ref_local_ns: int) -> ScriptedProfile:
    """A low–high W triangle (0.05 s steps) starting at the meter's reference time."""
    period, low, high = METERS[name][3:]
    t = np.arange(0.0, PROFILE_S, 0.05)
    phase = (t % period) / period
    watts = low + 2.0 * (high - low) * np.minimum(phase, 1.0 - phase)
    return ScriptedProfile(list(zip(t.tolist(), watts.tolist(), strict=True)),
                           start_mono_ns=ref_local_ns + METERS[name][0])


def _daemon(root: str, name: str, port: int, ref_local_ns: int) -> None:
    """One emulated daemon on its own skewed clock (a child process); SIGTERM stops it.

    A real meter daemon runs on its own Pi, undisturbed by the inference: here it gets a
    higher scheduling priority where allowed (root) and reads its emulated chips without the
    modelled SPI wait, so a loaded 2-core machine delays its reads less."""
    import contextlib
    import os

    from meter.daemon.service import DaemonOptions, MeterDaemon

    with contextlib.suppress(OSError):  # not permitted: the default priority
        os.nice(-10)

    shift, ppm, node = METERS[name][:3]
    board = Path(root) / "board.toml"
    board.write_text('format = "epi-board"\nformat_version = 1\nname = "two-meters"\n'
                     "[sampling]\nperiod_s = 0.1\n[[channel]]\nname = \"c0\"\n"
                     f'node = "{node}"\nchip_select = "CE0"\n'
                     "meter_constant_imp_per_kwh = 1000000000\n")
    daemon = MeterDaemon(DaemonOptions(
        out_dir=Path(root) / "trace", board_path=board, emulate=True,
        listen=f"127.0.0.1:{port}", clock=SkewedClock(ref_local_ns, ref_local_ns + shift, ppm),
        power_model=[profile(name, ref_local_ns)], model_bus_timing=False),
        log=lambda line: None)
    signal.signal(signal.SIGTERM, lambda *_: daemon.stop())
    daemon.run()


def _wait_up(url: str, proc: multiprocessing.process.BaseProcess) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        assert proc.is_alive(), f"daemon at {url} exited with {proc.exitcode}"
        try:
            with urllib.request.urlopen(url + "/status", timeout=2):
                return
        except OSError:
            time.sleep(0.2)
    raise AssertionError(f"daemon at {url} did not answer")


def _study(d: Path, model: Path, urls: dict[str, str], worker: str) -> Path:
    (d / "prompts.json").write_text(json.dumps(PROMPTS))
    meters = "".join(f'[[meter]]\nurl = "{urls[k]}"\ntrace = "meter-{k}/trace"\n'
                     f'nodes = ["{METERS[k][2]}"]\n\n' for k in METERS)
    p = d / "study.toml"
    p.write_text(f"""[study]
name = "two-meters"
repeats = 1
out = "camp"

[[models]]
name = "tiny"
path = "{model}"
include_base = true

[run]
prompts = "prompts.json"
tokens = {TOKENS}
repeats_per_run = 2
warmups = 0
threads = 1
idle_s = 0.3
cooldown_s = 0
node = "n0"
workers = "{worker}"

{meters}[analysis]
cv_threshold = 1.0       # the wiring is under test, not a quiet machine
lag = "none"             # the scripted power does not trail the tokens
""")
    return p


def _truth_j_per_token(run_dir: Path, ref_local_ns: int) -> dict[int, float]:
    """Decode J/token per repeat over both nodes: each node's profile between the decode's
    ends in its meter's true clock, over n_generated − 1 tokens per request."""
    req = pd.read_csv(run_dir / "requests.csv")
    req = req[req["warmup"] == 0]
    t0 = req["t_first_token_mono_ns"].to_numpy(np.int64)
    t1 = req["t_end_mono_ns"].to_numpy(np.int64)
    energy = np.zeros(len(req))
    for name in METERS:
        prof = profile(name, ref_local_ns)
        a, b = true_meter_ns(name, ref_local_ns, t0), true_meter_ns(name, ref_local_ns, t1)
        energy += [prof.energy_j(int(x), int(y)) for x, y in zip(a, b, strict=True)]
    req = req.assign(energy_j=energy, tokens=req["n_generated_tokens"] - 1)
    g = req.groupby("repeat")[["energy_j", "tokens"]].sum()
    return {int(k): float(r["energy_j"] / r["tokens"]) for k, r in g.iterrows()}


def _kill_inside_the_run(study: Path, camp: Path) -> None:
    """Start the campaign, wait until its journal shows the run step started, let it run a
    moment and kill the campaign with SIGKILL (its step process is left to the next session,
    which stops it and sets its partial run aside)."""
    proc = subprocess.Popen([sys.executable, "-m", "epi", "campaign", str(study)], cwd=REPO,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    journal = camp / "journal.jsonl"
    deadline = time.monotonic() + 300
    try:
        while time.monotonic() < deadline and proc.poll() is None:
            lines = journal.read_text().splitlines() if journal.is_file() else []
            if any('"started"' in x and '"run:' in x for x in lines):
                time.sleep(1.0)  # the run step under way (clock syncs with both meters)
                break
            time.sleep(0.2)
        assert proc.poll() is None, "the campaign ended before its run could be killed"
    finally:
        proc.kill()
        proc.wait(30)


@pytest.mark.slow
def test_a_campaign_metered_by_two_daemons_gives_the_emulators_truth(
        tiny_model: Path, tmp_path: Path) -> None:
    from host.cluster.workers import LocalWorker

    ref = time.monotonic_ns()
    ctx = multiprocessing.get_context("spawn")
    urls, procs = {}, []
    worker = LocalWorker(free_port(), tmp_path / "worker.log", node="n1")
    try:
        for name in METERS:
            (tmp_path / f"meter-{name}").mkdir()
            port = free_port()
            urls[name] = f"http://127.0.0.1:{port}"
            procs.append(ctx.Process(target=_daemon,
                                     args=(str(tmp_path / f"meter-{name}"), name, port, ref)))
            procs[-1].start()
        for name, proc in zip(METERS, procs, strict=True):
            _wait_up(urls[name], proc)
        worker.start()
        study = _study(tmp_path, tiny_model, urls, f"n1={worker.endpoint.address}")
        _kill_inside_the_run(study, tmp_path / "camp")
        r = subprocess.run([sys.executable, "-m", "epi", "campaign", str(study)], cwd=REPO,
                           capture_output=True, text=True, timeout=600, check=False)
    finally:
        worker.stop()
        for proc in procs:
            if proc.is_alive():
                assert proc.pid is not None
                proc.terminate()
            proc.join(30)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-4000:]
    assert "meters: 2 daemons" in out and f"meter 2: {urls['b']}" in out
    camp = tmp_path / "camp"
    # the resumed session took up the killed run again; the analysis reads only the new one
    assert "resuming the campaign" in out and "run:tiny-llama-f16:1 was interrupted" in out
    (run_dir,) = sorted((camp / "runs").glob("*/round1-attempt2"))
    runs = json.loads((camp / "analysis" / "results.json").read_text())["runs"]
    assert [Path(x["path"]).name for x in runs] == ["round1-attempt2"]
    header = json.loads((run_dir / "run.json").read_text())
    assert header["meters"] == [urls["a"], urls["b"]]  # the study's order: the traces' order
    assert {e["meter_url"] for e in header["clock_sync"]} == set(urls.values())
    rep = pd.read_csv(camp / "analysis" / "repeats.csv")
    rep = rep[(rep["scope"] == "all") & (rep["phase"] == "decode")
              & (rep["unit"] == "generated") & (rep["basis"] == "gross")]
    got = dict(zip(rep["repeat"].astype(int), rep["j_per_token"], strict=True))
    why = dict(zip(rep["repeat"].astype(int), rep["reason"], strict=True))
    want = _truth_j_per_token(run_dir, ref)
    assert sorted(got) == sorted(want) == [0, 1]
    compared = 0
    for k, j in want.items():
        if math.isnan(got[k]):
            # a decode window crossing a sample gap a daemon recorded (it missed sweeps: the
            # test runs two daemons, a campaign and an RPC worker on 2 cores) is null with
            # that reason, never a wrong figure — seen once in the full suite, 2026-11-27
            assert "sample gap" in str(why[k]), (k, got, why)
            continue
        assert got[k] == pytest.approx(j, rel=0.01), (k, got, want)
        compared += 1
    assert compared >= 1, (got, why)  # the truth is checked on at least one repeat
    scopes = set(pd.read_csv(camp / "analysis" / "windows.csv")["scope"])
    assert {"n0", "n1"} <= scopes  # each node measured on its own meter's channel
