"""SIGTERM at the worst moment still stops `epi meter run` cleanly.

A campaign's emulated daemon once stopped sampling on SIGTERM but neither wrote its ``stop``
nor exited; SIGINT did nothing either and SIGKILL ended it 30 s later. Cause: the signal
handler called ``daemon.stop()``, i.e. ``Event.set()`` on the sampler's stop event, and
CPython runs a handler in the main thread — the sampler's own thread — between two bytecodes.
When the signal came while that thread was inside ``Event.wait`` on the same event (which holds
the event's non-reentrant lock on its way into and out of the wait), ``set()`` waited forever
for a lock its own thread held. The window is a few microseconds per sweep, so a daemon stopped
at a random moment hit it rarely; this test sends the signal inside it every time: a profile
hook in the daemon's process fires when the sampler's wait enters ``Condition.wait`` (the lock
then held) and the process signals itself there.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

from epi.formats.trace import read_trace

pytestmark = [pytest.mark.slow, pytest.mark.shares_cpu]

MARK = "test hook: SIGTERM sent inside the sampler's stop-event wait"

# Runs `epi meter run` with the hook: from the 3rd sweep wait on (two sweeps written), the
# main thread is profiled only while it is inside Sampler._wait_until; the first call of
# Condition.wait there (Event.wait holds the condition's lock by then) sends SIGTERM.
_WRAPPER = f"""
import os, signal, sys, threading
from meter.daemon import sampler as sampler_mod

WAIT = threading.Condition.wait.__code__
state = {{"waits": 0, "fired": False}}

def hook(frame, event, arg):
    if state["fired"] or event != "call" or frame.f_code is not WAIT:
        return
    state["fired"] = True
    sys.setprofile(None)
    held = frame.f_locals["self"]._lock.locked()
    print({MARK!r} + f" (lock held: {{held}})", file=sys.stderr, flush=True)
    os.kill(os.getpid(), signal.SIGTERM)

original = sampler_mod.Sampler._wait_until

def wait_until(self, deadline_ns):
    state["waits"] += 1
    if state["waits"] < 3 or state["fired"]:
        return original(self, deadline_ns)
    sys.setprofile(hook)
    try:
        return original(self, deadline_ns)
    finally:
        sys.setprofile(None)

sampler_mod.Sampler._wait_until = wait_until
from epi.cli import main
main()
"""


def test_sigterm_inside_the_samplers_wait_is_a_clean_stop(tmp_path: Path) -> None:
    out = tmp_path / "trace"
    # 5 Hz: a sweep (profiled or not, on a loaded machine) ends well inside its period, so
    # the sampler does wait (a sweep that overruns its slot goes on without waiting)
    proc = subprocess.Popen(
        [sys.executable, "-c", _WRAPPER, "meter", "run", "--emulate", "--out", str(out),
         "--listen", "off", "--rate", "5"],
        stderr=subprocess.PIPE, text=True,
    )
    try:
        _, err = proc.communicate(timeout=180)  # a hung daemon never exits: any limit tells
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGKILL)
        _, err = proc.communicate()
        pytest.fail(f"the daemon did not exit after SIGTERM inside its sampler's wait:\n{err}")
    assert f"{MARK} (lock held: True)" in err, err  # the signal came inside the window
    assert proc.returncode == 0, err
    assert "epi meter: stopped:" in err, err
    seg = read_trace(out).segments[0]
    assert seg.meta["stats"]["clean_stop"] is True
    assert seg.events[-1].kind == "stop"
    assert seg.meta["stats"]["sweeps"] >= 2  # it sampled before the signal


def test_sigusr1_dumps_every_threads_stack_and_sampling_goes_on(tmp_path: Path) -> None:
    """What a campaign sends a daemon that did not stop, before it kills it
    (host/campaign/meter.py): faulthandler writes every thread's stack to stderr (the
    campaign's meter.log) and the daemon carries on; SIGTERM then stops it cleanly."""
    import time

    out = tmp_path / "trace"
    proc = subprocess.Popen(
        [sys.executable, "-m", "epi", "meter", "run", "--emulate", "--out", str(out),
         "--listen", "off", "--rate", "5"],
        stderr=subprocess.PIPE, text=True,
    )
    try:
        deadline = time.monotonic() + 120
        while not list(out.glob("seg-*.samples.csv")) or not any(
                p.stat().st_size > 200 for p in out.glob("seg-*.samples.csv")):
            assert proc.poll() is None and time.monotonic() < deadline, "no samples"
            time.sleep(0.1)
        proc.send_signal(signal.SIGUSR1)
        time.sleep(0.5)
        assert proc.poll() is None  # still running
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert "Thread 0x" in err and "File " in err, err  # faulthandler's all-threads dump
    assert proc.returncode == 0 and "epi meter: stopped:" in err, err
