"""A daemon's sampling must not depend on its clients: 400 `/stream` clients that
never read leave the sample rate within 1 % of the configured rate."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from pathlib import Path

import pytest

from epi.formats.trace import read_trace, segment_paths
from meter.daemon.service import DaemonOptions, MeterDaemon
from meter.emulation.power_models import ConstantPower

RATE_HZ = 20.0
CHANNELS = 4
CLIENTS = 400
WINDOW_S = 6.0


def _rows(path: Path) -> int:
    """Rows in a samples file (each sweep's rows are one write: whole lines only)."""
    try:
        return path.read_bytes().count(b"\n") - 1
    except FileNotFoundError:
        return 0


@pytest.mark.slow
def test_400_stream_clients_that_never_read_leave_the_rate_within_1_percent(
        tmp_path: Path) -> None:
    opts = DaemonOptions(out_dir=tmp_path, emulate=True, listen="127.0.0.1:0", rate_hz=RATE_HZ,
                         power_model=ConstantPower(5.0), n_emulated_channels=CHANNELS)
    daemon = MeterDaemon(opts, log=lambda _line: None)
    worker = threading.Thread(target=daemon.run)
    worker.start()
    sockets: list[socket.socket] = []
    try:
        assert daemon.ready.wait(30) and daemon.server is not None
        host, port = daemon.server.address
        _, samples_p, _ = segment_paths(tmp_path, 1)
        deadline = time.monotonic() + 30
        while _rows(samples_p) < 2 * CHANNELS:  # sampling under way (not a fixed 1 s)
            assert time.monotonic() < deadline and worker.is_alive()
            time.sleep(0.02)
        t_connect = time.monotonic()
        for _ in range(CLIENTS):  # connect, ask for the stream, never read a byte
            s = socket.create_connection((host, port), timeout=5)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            s.sendall(b"GET /stream HTTP/1.1\r\nHost: x\r\n\r\n")
            sockets.append(s)
        connect_s = time.monotonic() - t_connect
        rows0, t0 = _rows(samples_p), time.monotonic()
        time.sleep(WINDOW_S)
        rows1, t1 = _rows(samples_p), time.monotonic()
        rate = (rows1 - rows0) / CHANNELS / (t1 - t0)
        refused = daemon.session.hub.refused if daemon.session is not None else 0
    finally:
        for s in sockets:
            with contextlib.suppress(OSError):
                s.close()
        daemon.stop()
        worker.join(30)
    assert not worker.is_alive()
    print(f"{CLIENTS} clients connected in {connect_s:.2f} s; {rate:.3f} sweeps/s "
          f"against {RATE_HZ:g}")
    assert connect_s < 10, f"{CLIENTS} connections took {connect_s:.1f} s"
    # on a miss, the daemon's own account of its late and skipped sweeps (with their times
    # since t0) says whether it stalled once (e.g. the VM's host) or fell behind steadily
    said = [f"{(int(e['t_mono_ns']) - t0 * 1e9) / 1e9:+.2f} s {e['kind']}: {e['detail']}"
            for e in read_trace(tmp_path).events()
            if e["kind"] in ("late", "skipped")] if abs(rate - RATE_HZ) > 0.01 * RATE_HZ else []
    assert abs(rate - RATE_HZ) <= 0.01 * RATE_HZ, (
        f"{rate:.2f} sweeps/s against {RATE_HZ:g}; the daemon recorded: {said}")
    assert refused == CLIENTS - 64  # the hub's bound: 64 follow, the rest are told 503
