"""`epi meter watch URL` against a running emulated daemon (a real `epi meter run --emulate`
subprocess): the view shows each channel's power as the daemon's own /metrics states it, the
events as they happen (an injected chip reset), the sample rate and the clock offset; it exits
cleanly (status 0, one line, no traceback) on Ctrl-C (SIGINT) and when the daemon stops.

The view runs on a pseudo-terminal where a user would see it (rich redraws its frames there),
so the tests wait for what it shows, not for fixed times; the stopped-daemon case keeps stdout
a pipe (rich then prints only the last frame)."""

from __future__ import annotations

import fcntl
import os
import pty
import re
import select
import signal
import struct
import subprocess
import sys
import termios
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from meter.watch.state import NS, WatchState
from meter.watch.view import BLOCKS, sparkline

ENV = {**os.environ, "COLUMNS": "140", "PYTHONUNBUFFERED": "1"}
# a terminal rich redraws in place (not dumb, not overridden by the environment)
TTY_ENV = {**{k: v for k, v in ENV.items()
              if k not in ("TTY_INTERACTIVE", "TTY_COMPATIBLE", "FORCE_COLOR", "NO_COLOR")},
           "TERM": "xterm", "LINES": "60"}
# CSI sequences (colour, cursor moves, erase, cursor on/off) and the terminal's carriage returns
ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\r")
# one channel row: ch, name, power W, sparkline, min–max W, energy J, samples, rate Hz
ROW = re.compile(r"│\s+(\d)\s+│\s+ch\d\s+│\s+([\d.]+)\s+│[^│\n]*│[^│\n]*│\s+[\d.]+\s+│"
                 r"\s+(\d+)\s+│\s+(?:[\d.]+|—)\s+│")
OFFSET = re.compile(r"clock offset ([+-][\d.]+) ms ± ([\d.]+) ms")
RESETS = "reset:0@1.5,reset:0@4,reset:0@8,reset:0@16,reset:0@32"
SAMPLES_SHOWN = 40  # per channel before Ctrl-C: 2 s at the daemon's 20 Hz, a reset inside
WAIT_S = 60.0  # the bound on every wait below (a loaded machine), never a sleep


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


def _stop(proc: subprocess.Popen[str], sig: int = signal.SIGINT) -> None:
    if proc.poll() is None:
        proc.send_signal(sig)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[str], str]]:
    """A daemon whose channel 0 resets at 1.5 s and again later (4, 8, 16, 32 s): a watch
    that starts late on a loaded machine still sees a reset after it connects (the stream
    carries what happens from then on)."""
    proc, url = _start_daemon(tmp_path / "trace", "--duration", "120",
                              "--fault-injection", RESETS)
    try:
        yield proc, url
    finally:
        _stop(proc)


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


class _Terminal:
    """`epi meter watch` with its stdout on a pseudo-terminal (60 × 140) and stderr a pipe:
    what the view shows, frame by frame, read while it runs."""

    def __init__(self, url: str, *extra: str) -> None:
        self.url = url
        master, slave = pty.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 60, 140, 0, 0))
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "epi", "meter", "watch", url, *extra],
            stdin=subprocess.DEVNULL, stdout=slave, stderr=subprocess.PIPE, text=True,
            env=TTY_ENV, preexec_fn=_sigint_default)
        os.close(slave)
        self._fd: int | None = master
        self._raw = bytearray()

    def _read(self, timeout_s: float) -> bool:
        """Take what the terminal holds (waiting up to `timeout_s`); False once it closed."""
        if self._fd is None:
            return False
        ready, _, _ = select.select([self._fd], [], [], timeout_s)
        if not ready:
            return True
        try:
            data = os.read(self._fd, 1 << 16)
        except OSError:  # EIO: every writer closed the terminal (the watch exited)
            data = b""
        if not data:
            os.close(self._fd)
            self._fd = None
            return False
        self._raw += data
        return True

    def text(self) -> str:
        return ANSI.sub("", self._raw.decode(errors="replace"))

    def last_frame(self) -> str:
        """The last frame drawn so far (perhaps still being drawn): from its header on."""
        text = self.text()
        start = text.rfind(f"{self.url}  host")
        return text[start:] if start >= 0 else ""

    def wait_for(self, shown: Callable[[str], bool], what: str) -> None:
        deadline = time.monotonic() + WAIT_S
        while not shown(self.last_frame()):
            assert self.proc.poll() is None, self.text()[-3000:]
            assert time.monotonic() < deadline, f"the view never showed {what}: " + \
                self.last_frame()[-3000:]
            self._read(0.2)

    def finish(self) -> tuple[str, str]:
        """(what the terminal showed, stderr) once the watch has exited."""
        deadline = time.monotonic() + WAIT_S
        while self._read(0.2):
            assert time.monotonic() < deadline, "the watch did not exit: " + self.text()[-3000:]
        assert self.proc.stderr is not None
        err = self.proc.stderr.read()
        self.proc.wait(WAIT_S)
        return self.text(), err

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        if self.proc.stderr is not None:
            self.proc.stderr.close()


@pytest.fixture
def terminal() -> Iterator[Callable[..., _Terminal]]:
    """Start `epi meter watch` on a pseudo-terminal; whatever is left is ended afterwards."""
    started: list[_Terminal] = []

    def start(url: str, *extra: str) -> _Terminal:
        started.append(_Terminal(url, *extra))
        return started[-1]

    yield start
    for t in started:
        t.close()


def _rows(frame: str) -> dict[str, tuple[float, int]]:
    """Each channel row of a frame: (power W, samples)."""
    return {m.group(1): (float(m.group(2)), int(m.group(3))) for m in ROW.finditer(frame)}


def _metrics(url: str) -> dict[str, object]:
    with urllib.request.urlopen(url + "/metrics", timeout=10) as resp:
        return {f.name: f for f in text_string_to_metric_families(resp.read().decode())}


def _metrics_power(url: str) -> dict[str, float]:
    fams = _metrics(url)
    return {s.labels["channel"]: s.value for s in fams["epi_meter_power_watts"].samples}


def _stream_clients(url: str) -> float:
    fams = _metrics(url)
    return fams["epi_meter_stream_clients"].samples[0].value  # type: ignore[attr-defined]


def _wait_stream_client(url: str, proc: subprocess.Popen[str]) -> None:
    """Until the daemon counts a `/stream` client (the watch has subscribed)."""
    deadline = time.monotonic() + WAIT_S
    while _stream_clients(url) < 1:
        assert proc.poll() is None, "the watch exited before it followed the stream"
        assert time.monotonic() < deadline, "the watch never followed the stream"
        time.sleep(0.02)


def _ready(frame: str) -> bool:
    """Every channel with SAMPLES_SHOWN samples, the chip reset and a clock offset shown."""
    rows = _rows(frame)
    return (set(rows) == {"0", "1", "2", "3"}
            and all(n >= SAMPLES_SHOWN for _, n in rows.values())
            and "chip_reset" in frame and OFFSET.search(frame) is not None)


@pytest.mark.slow
def test_watch_shows_the_stream_and_exits_cleanly_on_ctrl_c(daemon, terminal) -> None:
    _, url = daemon
    view = terminal(url, "--refresh", "5")
    view.wait_for(_ready, f"{SAMPLES_SHOWN} samples a channel, the reset and the offset")
    power = _metrics_power(url)
    view.proc.send_signal(signal.SIGINT)
    shown, err = view.finish()
    assert view.proc.returncode == 0, (shown[-3000:], err)
    assert "Traceback" not in shown + err and err.strip() == "", err
    assert shown.rstrip().endswith("epi meter watch: stopped (Ctrl-C)")
    out = view.last_frame()  # the frame the watch left on the terminal as it stopped
    # each constant-power channel's power as the daemon's /metrics states it
    rows = _rows(out)
    assert set(rows) == {"0", "1", "2", "3"}, out
    for ch in ("1", "2", "3"):  # channel 0 follows this machine's CPU: it moves
        assert rows[ch][0] == pytest.approx(power[ch], abs=1e-3)
    assert any(c in out for c in BLOCKS)  # the power history
    # the injected chip reset, as an event
    assert "chip_reset" in out
    # sample rate measured from the samples' meter stamps: the daemon's default 20 Hz
    rate = float(re.search(r"sample rate ([\d.]+) Hz per channel", out).group(1))
    assert rate == pytest.approx(20.0, rel=0.1)
    assert "(scheduled 20.0 Hz)" in out
    # the clock offset: same machine, same CLOCK_MONOTONIC, so 0 within its bound
    m = OFFSET.search(out)
    assert m is not None, out
    assert abs(float(m.group(1))) <= float(m.group(2)) < 5.0
    assert "MODELLED power" in out


@pytest.mark.slow
def test_watch_exits_cleanly_when_the_daemon_stops(tmp_path: Path) -> None:
    """Stdout a pipe; the daemon stopped (SIGTERM, a clean stop) once the watch follows."""
    proc, url = _start_daemon(tmp_path / "trace", "--duration", "120")
    watch = _watch(url)
    try:
        _wait_stream_client(url, watch)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
        out, err = watch.communicate(timeout=20)
    finally:
        _stop(proc)
        _stop(watch, signal.SIGKILL)
    assert watch.returncode == 0, (out, err)
    assert "Traceback" not in out + err
    assert out.rstrip().endswith("epi meter watch: the daemon's stream ended: closed by the "
                                 "daemon")


@pytest.mark.slow
def test_watch_exits_cleanly_when_the_daemon_is_killed(tmp_path: Path, terminal) -> None:
    proc, url = _start_daemon(tmp_path / "trace", "--duration", "60")
    try:
        view = terminal(url, "--idle-timeout", "3", "--refresh", "5")
        view.wait_for(lambda frame: bool(_rows(frame)), "a sample")  # past the hello
        proc.kill()
        proc.wait(10)
        out, err = view.finish()
    finally:
        _stop(proc, signal.SIGKILL)
    assert view.proc.returncode == 0, (out[-3000:], err)
    assert "Traceback" not in out + err
    assert re.search(r"stream ended: (closed by the daemon|connection lost|went silent)",
                     out.rstrip().splitlines()[-1]), out[-300:]


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
