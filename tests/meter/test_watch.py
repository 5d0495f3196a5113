"""`epi meter watch URL` against a running emulated daemon (a real `epi meter run --emulate`
subprocess): the view shows each channel's power as the daemon's own /metrics states it, the
events as they happen (an injected chip reset), the sample rate and the clock offset; it exits
cleanly (status 0, one line, no traceback) on Ctrl-C (SIGINT) and when the daemon stops."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from meter.watch.state import NS, WatchState
from meter.watch.view import BLOCKS, sparkline

ENV = {**os.environ, "COLUMNS": "140", "PYTHONUNBUFFERED": "1"}


def _start_daemon(out: Path, *extra: str) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "epi", "meter", "run", "--emulate", "--out", str(out),
         "--listen", "127.0.0.1:0", *extra],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=ENV,
        preexec_fn=_sigint_default)
    assert proc.stdout is not None
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        m = re.search(r"serving (http://127\.0\.0\.1:\d+)", line)
        if m:
            return proc, m.group(1)
    proc.kill()
    raise AssertionError("the daemon did not say where it serves")


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[str], str]]:
    proc, url = _start_daemon(tmp_path / "trace", "--duration", "120",
                              "--fault-injection", "reset:0@1.5")
    try:
        yield proc, url
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _sigint_default() -> None:
    """In the child: Ctrl-C's default disposition. A child inherits an ignored SIGINT from
    its parent (a shell's background job, or anything earlier in the pytest process that set
    SIG_IGN), and Python then never installs its KeyboardInterrupt handler: the Ctrl-C case
    hung in two full-suite runs (nothing printed in 24 s) while passing alone."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _watch(url: str, *extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "epi", "meter", "watch", url, *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV,
                            preexec_fn=_sigint_default)


def _metrics_power(url: str) -> dict[str, float]:
    with urllib.request.urlopen(url + "/metrics", timeout=10) as resp:
        fams = {f.name: f for f in text_string_to_metric_families(resp.read().decode())}
    return {s.labels["channel"]: s.value for s in fams["epi_meter_power_watts"].samples}


@pytest.mark.slow
def test_watch_shows_the_stream_and_exits_cleanly_on_ctrl_c(daemon) -> None:
    _, url = daemon
    watch = _watch(url, "--refresh", "2")
    time.sleep(4.0)  # past the injected reset at 1.5 s, several seconds of samples
    power = _metrics_power(url)
    watch.send_signal(signal.SIGINT)
    out, err = watch.communicate(timeout=20)
    assert watch.returncode == 0, (out, err)
    assert "Traceback" not in out + err and err.strip() == "", err
    assert out.rstrip().endswith("epi meter watch: stopped (Ctrl-C)")
    # each constant-power channel's power as the daemon's /metrics states it
    rows = {m.group(1): float(m.group(2)) for m in re.finditer(
        r"│\s+(\d)\s+│\s+ch\d\s+│\s+([\d.]+)\s+│", out)}
    assert set(rows) == {"0", "1", "2", "3"}, out
    for ch in ("1", "2", "3"):  # channel 0 follows this machine's CPU: it moves
        assert rows[ch] == pytest.approx(power[ch], abs=1e-3)
    assert any(c in out for c in BLOCKS)  # the power history
    # the injected chip reset, as an event
    assert "chip_reset" in out
    # sample rate measured from the samples' meter stamps: the daemon's default 20 Hz
    rate = float(re.search(r"sample rate ([\d.]+) Hz per channel", out).group(1))
    assert rate == pytest.approx(20.0, rel=0.1)
    assert "(scheduled 20.0 Hz)" in out
    # the clock offset: same machine, same CLOCK_MONOTONIC, so 0 within its bound
    m = re.search(r"clock offset ([+-][\d.]+) ms ± ([\d.]+) ms", out)
    assert m is not None, out
    assert abs(float(m.group(1))) <= float(m.group(2)) < 5.0
    assert "MODELLED power" in out


@pytest.mark.slow
def test_watch_exits_cleanly_when_the_daemon_stops(tmp_path: Path) -> None:
    proc, url = _start_daemon(tmp_path / "trace", "--duration", "3")
    watch = _watch(url)
    assert proc.wait(30) == 0
    out, err = watch.communicate(timeout=20)
    assert watch.returncode == 0, (out, err)
    assert "Traceback" not in out + err
    assert out.rstrip().endswith("epi meter watch: the daemon's stream ended: closed by the "
                                 "daemon")


@pytest.mark.slow
def test_watch_exits_cleanly_when_the_daemon_is_killed(tmp_path: Path) -> None:
    proc, url = _start_daemon(tmp_path / "trace", "--duration", "60")
    watch = _watch(url, "--idle-timeout", "3")
    time.sleep(2.0)
    proc.kill()
    proc.wait(10)
    out, err = watch.communicate(timeout=20)
    assert watch.returncode == 0, (out, err)
    assert "Traceback" not in out + err
    assert re.search(r"stream ended: (closed by the daemon|connection lost|went silent)",
                     out.splitlines()[-1]), out[-300:]


def test_watch_refuses_an_unreachable_or_malformed_url_in_one_line() -> None:
    for url, needle in (("http://127.0.0.1:9", "cannot reach /stream"),
                        ("ftp://x", "expected http://HOST:PORT"),
                        ("http://h:port", "port is not a number")):
        watch = _watch(url)
        _, err = watch.communicate(timeout=30)
        assert watch.returncode != 0 and "Traceback" not in err, err
        lines = [ln for ln in err.splitlines() if ln.strip()]
        assert len(lines) == 1 and needle in lines[0], err


def test_watch_imports_no_host_dependency() -> None:
    code = ("import sys; import epi.commands.meter_watch, meter.watch.app; "
            "bad = [m for m in sys.modules if m.split('.')[0] in "
            "('host', 'numpy', 'pandas', 'matplotlib', 'llama_cpp')]; print(bad); "
            "sys.exit(1 if bad else 0)")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, env=ENV)
    assert res.returncode == 0, res.stdout + res.stderr


# --------------------------------------------------------------------------- state, unit
def _sample(ch: int, t_s: float, w: float) -> dict[str, object]:
    return {"type": "sample", "channel": ch, "t_mono_ns": int(t_s * NS), "power_w": w,
            "energy_j": w * t_s, "name": f"ch{ch}"}


def test_rate_and_history_come_from_the_samples_meter_stamps() -> None:
    st = WatchState("http://x", history_s=10)
    for k in range(300):  # 25 Hz for 12 s
        st.message(_sample(0, k / 25, 5.0 + (k % 2)))
    st.message({"type": "event", "t_mono_ns": 12 * NS, "channel": 0, "kind": "gap",
                "detail": "d"})
    st.message({"type": "dropped", "count": 7})
    snap = st.snapshot()
    ch = snap.channels[0]
    assert ch.rate_hz() == pytest.approx(25.0, rel=1e-6)
    assert (ch.history[-1][0] - ch.history[0][0]) <= 10 * NS  # only the last 10 s kept
    assert ch.samples == 300 and ch.power_w == 6.0
    assert snap.dropped == 7 and snap.events[0].kind == "gap"
    st.message({"type": "sample", "channel": "x"})  # malformed: ignored, not a crash
    st.message({"type": "sample", "channel": 1, "t_mono_ns": True})


def test_sparkline_scales_between_min_and_max() -> None:
    assert sparkline([1.0, 2.0, 3.0]) == BLOCKS[0] + BLOCKS[4] + BLOCKS[-1]
    assert sparkline([2.0] * 5) == BLOCKS[0] * 5
    assert len(sparkline(list(map(float, range(1000))), 24)) == 24
    assert sparkline([]) == ""
