"""The sweep rate the daemon says the bus sustains (`sustainable_rate_hz`, /metrics
`epi_meter_sustainable_rate_hertz`) never exceeds what the wire itself carries: emulated chips
answer without the wire time, and the direct path's /metrics said 56.3 Hz on a bus whose
frames alone allow 49 Hz."""

from __future__ import annotations

import json
import threading
import urllib.request
from pathlib import Path

import pytest

from meter.daemon.sampler import SamplerStats
from meter.daemon.service import DaemonOptions, MeterDaemon
from tests.meter.test_bridge_session import _wait


@pytest.mark.parametrize(("duration_ms", "wire_hz", "expected_hz"), [
    (1000 / 56.3, 49.0, 49.0),  # shorter sweeps than the wire allows: the wire's rate
    (30.0, 49.0, 1000 / 30.0),  # slower than the wire: what was measured
    (1000 / 56.3, None, 56.3),  # no wire rate known: what was measured
])
def test_the_sustainable_rate_is_capped_by_the_wire(duration_ms: float, wire_hz: float | None,
                                                    expected_hz: float) -> None:
    stats = SamplerStats(wire_rate_hz=wire_hz)
    for _ in range(20):
        stats.sweep_duration.add(round(duration_ms * 1e6))
    assert stats.sustainable_rate_hz == pytest.approx(expected_hz, rel=1e-3)


def test_metrics_of_an_emulated_board_stay_under_the_wire_rate(tmp_path: Path) -> None:
    opts = DaemonOptions(out_dir=tmp_path / "t", emulate=True, listen="127.0.0.1:0",
                         n_emulated_channels=4)
    daemon = MeterDaemon(opts, log=lambda line: None)
    worker = threading.Thread(target=daemon.run, daemon=True)
    worker.start()
    try:
        _wait("the server", lambda: daemon.server is not None and daemon.ready.is_set())
        assert daemon.server is not None and daemon.session is not None
        state = daemon.session.state
        _wait("sweeps", lambda: state.sweeps_total >= 20)
        with urllib.request.urlopen(daemon.server.url + "/metrics", timeout=5) as r:
            text = r.read().decode()
    finally:
        daemon.stop()
        worker.join(timeout=15)
    (line,) = [ln for ln in text.splitlines()
               if ln.startswith("epi_meter_sustainable_rate_hertz ")]
    meta = json.loads((tmp_path / "t" / "seg-000001.meta.json").read_text())
    wire_hz = meta["bus"]["wire_rate_hz"]
    assert 0 < float(line.split()[-1]) <= wire_hz
