"""The bridge's /status and /metrics tell what its trace tells: a reversed CT behind the MCU
(a `reverse_energy` event in the trace) shows in /status's fault counts, so `epi doctor` says
the clamp is the wrong way round instead of "ok CT orientation"; and a chain self-check the
bridge does not run reads as absent (no sample, null), never as an agreeing 0."""

from __future__ import annotations

import json
import threading
import urllib.request
from pathlib import Path

import pytest

from epi.formats.trace import read_trace
from meter.daemon.service import DaemonOptions, MeterDaemon
from meter.emulation.power_models import ConstantPower
from tests.meter.test_bridge_session import _wait


def test_a_reversed_ct_on_the_bridge_is_in_status_and_doctor(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import meter.emulation.chip_emulator as emulator
    from host.doctor import _orientation_checks

    class ReversedOnChannel1(emulator.EmulatedChip):
        def __init__(self, *args: object, **kwargs: object) -> None:
            kwargs["ct_reversed"] = kwargs.get("seed") == 1  # the board's second chip
            super().__init__(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(emulator, "EmulatedChip", ReversedOnChannel1)
    opts = DaemonOptions(out_dir=tmp_path / "t", emulate_bridge=True, listen="127.0.0.1:0",
                         n_emulated_channels=2, power_model=[ConstantPower(60.0)] * 2)
    daemon = MeterDaemon(opts, log=lambda line: None)
    worker = threading.Thread(target=daemon.run, daemon=True)
    worker.start()
    try:
        _wait("the server", lambda: daemon.server is not None and daemon.ready.is_set())
        assert daemon.server is not None
        url = daemon.server.url

        def get(path: str) -> str:
            with urllib.request.urlopen(url + path, timeout=5) as r:
                return r.read().decode()  # type: ignore[no-any-return]

        def reversed_count() -> int:
            faults = json.loads(get("/status"))["channels"][1]["faults"]
            return int(faults.get("reverse_energy", 0))

        _wait("reverse_energy in /status", lambda: reversed_count() > 0, timeout_s=60)
        status = json.loads(get("/status"))
        assert status["channels"][0]["faults"].get("reverse_energy", 0) == 0
        checks = {c.item: c for c in _orientation_checks(url)}
        assert checks["CT orientation ch1"].ok is False
        assert "reverse_energy" in checks["CT orientation ch1"].detail
        assert checks["CT orientation ch0"].ok is True
        # no self-check on the bridge: absent, not 0
        assert [c["chain_disagreement"] for c in status["channels"]] == [None, None]
        metrics = get("/metrics")
        assert not any(line.startswith("epi_meter_chain_disagreement")
                       for line in metrics.splitlines())
    finally:
        daemon.stop()
        worker.join(timeout=15)
    assert not worker.is_alive()
    trace = read_trace(tmp_path / "t")
    assert any(e["kind"] == "reverse_energy" and e["channel"] == 1 for e in trace.events())
