"""Clock-sync: the NTP-style estimate recovers a deliberately injected offset on loopback."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
from click.testing import CliRunner

from epi.commands.meter_sync import sync
from epi.core.clocksync import ClockJumpError, Exchange, combine, estimate_offset
from epi.core.errors import UserError
from meter.daemon.http_server import MeterServer
from meter.daemon.live_stream import LiveHub
from tests.meter.conftest import OffsetClock, make_state

OFFSET_NS = 123_456_789


@pytest.mark.parametrize("offset_server", [OFFSET_NS, -7_000_000_000], indirect=True)
def test_estimate_recovers_injected_offset_within_1ms(offset_server: MeterServer) -> None:
    true_offset = offset_server.clock.offset_ns
    est = estimate_offset(offset_server.url, samples=16)
    assert abs(est.offset_ns - true_offset) < 1_000_000
    # the uncertainty is a guaranteed bound: the truth lies inside it
    assert abs(est.offset_ns - true_offset) <= est.uncertainty_ns
    assert 0 < est.uncertainty_ns < 1_000_000 and est.rtt_ns > 0
    assert est.meter_url == offset_server.url
    d = est.as_dict()
    assert set(d) == {"t_local_mono_ns", "offset_ns", "uncertainty_ns", "rtt_ns", "meter_url"}


def test_combine_intersects_bounds_from_asymmetric_delays() -> None:
    true = 1_000_000
    # (forward delay, server time, backward delay) in ns; the true offset is within every bound
    delays = [(50_000, 10_000, 400_000), (300_000, 5_000, 20_000), (80_000, 1_000, 90_000)]
    ex, t = [], 0
    for fwd, srv, back in delays:
        t1 = t
        t2 = t1 + fwd + true
        t3 = t2 + srv
        t4 = t3 - true + back
        ex.append(Exchange(t1, t2, t3, t4))
        t = t4 + 1000
    est = combine(ex, "http://x")
    # bounds: low = max(t3 - t4) = true - 20_000, high = min(t2 - t1) = true + 50_000
    assert est.offset_ns == true + 15_000 and est.uncertainty_ns == 35_000
    assert est.rtt_ns == 80_000 + 90_000


def test_combine_inconsistent_bounds_widen_the_uncertainty() -> None:
    # a clock step between exchanges makes the bounds disjoint: fall back to the best exchange
    a = Exchange(0, 100, 110, 200)  # offset in [-90, 100]
    b = Exchange(1000, 1500, 1510, 1020)  # offset in [490, 500], the smaller round trip
    est = combine([a, b], "http://x")
    assert est.offset_ns == 495 and est.uncertainty_ns == 5 + (490 - 100)


def test_unreachable_meter_is_one_line_user_error() -> None:
    with pytest.raises(UserError) as info:
        estimate_offset("http://127.0.0.1:9", samples=2, timeout_s=0.5)
    assert "cannot reach the clock-sync endpoint" in str(info.value)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("url", ["ftp://h:1", "127.0.0.1:8757", "http://h:port"])
def test_bad_url_is_a_user_error(url: str) -> None:
    with pytest.raises(UserError, match="meter URL"):
        estimate_offset(url)


def test_wrong_server_is_a_user_error(offset_server: MeterServer) -> None:
    with pytest.raises(UserError, match="did not answer like an epi meter"):
        estimate_offset(offset_server.url + "/nothing-here", samples=1)


@pytest.mark.parametrize("offset_server", [OFFSET_NS], indirect=True)
def test_sync_command_prints_offset(offset_server: MeterServer) -> None:
    result = CliRunner().invoke(sync, [offset_server.url, "--samples", "8"])
    assert result.exit_code == 0, result.output
    m = re.match(r"offset ([+-][0-9.]+) ms ± ([0-9.]+) ms", result.output)
    assert m, result.output
    assert abs(float(m.group(1)) - OFFSET_NS / 1e6) < 1.0 and float(m.group(2)) < 1.0


def test_sync_command_error_exits_2_with_one_line() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "epi.cli", "meter", "sync", "http://127.0.0.1:9",
         "--timeout", "0.5"],
        capture_output=True, text=True, timeout=60,
    )
    assert proc.returncode == 2
    assert proc.stderr.startswith("epi: error: meter http://127.0.0.1:9: cannot reach")
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr


class JumpingClock(OffsetClock):
    """A meter clock that jumps forward by 1 s every few reads (epi meter sync used to
    report ±979 ms against it instead of refusing)."""

    def __init__(self) -> None:
        super().__init__(0)
        self.reads = 0

    def monotonic_ns(self) -> int:
        self.reads += 1
        if self.reads % 7 == 0:
            self.offset_ns += 1_000_000_000
        return super().monotonic_ns()


def test_a_clock_that_jumps_by_a_second_is_refused_not_reported() -> None:
    server = MeterServer("127.0.0.1", 0, state=make_state(), hub=LiveHub(),
                         clock=JumpingClock())
    server.start()
    try:
        with pytest.raises(UserError) as info:
            estimate_offset(server.url, samples=16)
    finally:
        server.stop()
    msg = str(info.value)
    assert "a clock jumped" in msg and "refused" in msg and "\n" not in msg


def test_combine_refuses_bounds_a_second_apart() -> None:
    a = Exchange(0, 100, 110, 200)
    b = Exchange(1000, 1_000_000_500, 1_000_000_510, 1020)  # the meter's clock jumped 1 s
    with pytest.raises(ClockJumpError):
        combine([a, b], "http://x")


def test_a_non_http_answer_is_named_and_its_bytes_are_not_echoed() -> None:
    """A service that answers in something other than HTTP (here: NUL and CR bytes) is said to
    be one, not called unreachable, and its raw bytes never reach the terminal."""
    import socket
    import threading

    srv = socket.create_server(("127.0.0.1", 0))
    port = srv.getsockname()[1]

    def serve() -> None:
        for _ in range(2):
            try:
                c, _ = srv.accept()
            except OSError:
                return
            c.recv(1024)
            c.sendall(b"\x00\x01garbage\r\x00\n\n")
            c.close()

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    try:
        with pytest.raises(UserError) as info:
            estimate_offset(f"http://127.0.0.1:{port}", samples=1, timeout_s=2.0)
    finally:
        srv.close()
    text = str(info.value)
    assert "not in HTTP" in text and "cannot reach" not in text
    assert "\x00" not in text and "\r" not in text and "\n" not in text
