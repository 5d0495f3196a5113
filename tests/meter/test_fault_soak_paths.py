"""The fault soak on both paths, short, on a SimulatedClock so CI runs it: the
direct SPI path and the bridge (the real firmware behind an emulated MCU, read by the bridge
recorder) get every fault kind in turn — reset, checksum, absent, stuck, bit errors at 0.001
and 0.002, partial frames — and each trace, read back, must hold the same standard: energy
within 0.2 % per channel of the truth less the intervals it declares unmetered (computed here
in closed form, P·(span − declared), not with the soak's arithmetic), no row off the load
without an event, no 0 W row, and no interval declared where no fault was injected. The old
bridge (no declared gaps) left 5-9 % of a channel's energy unaccounted in this soak.
The 10-minute system-clock version is bench/bench_fault_soak.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from meter.clock import SimulatedClock
from meter.emulation.fault_soak import FAULT_KINDS, LOADS_W, fault_schedule, run_fault_soak
from tests.meter.test_fault_soak import _closed_form

DURATION_S = 80.0


def test_the_schedule_has_every_kind_and_both_bit_error_rates() -> None:
    specs = fault_schedule(DURATION_S)
    names = {s.split(":")[0] for s in specs}
    assert names == {"reset", "checksum", "absent", "stuck", "bit-errors", "partial-frames"}
    rates = sorted(s.split("=")[1] if "=" in s else "0.001 (default)" for s in specs
                   if s.startswith("bit-errors"))
    assert rates == ["0.001 (default)", "0.002"]
    assert len(specs) == len(FAULT_KINDS)


@pytest.mark.parametrize("bridge", [pytest.param(False, id="direct", marks=pytest.mark.long),
                                    pytest.param(True, id="bridge")])
def test_both_paths_hold_the_energy_and_row_guarantees(tmp_path: Path, bridge: bool) -> None:
    out = tmp_path / "trace"
    res = run_fault_soak(out, DURATION_S, SimulatedClock(5 * 10**9), bridge=bridge)
    assert res.sweeps >= 0.95 * DURATION_S * res.rate_hz
    assert res.zero_rows == 0
    assert res.unexplained_rows == []
    assert res.undeclared_fault_intervals == 0
    stopped = res.metering_stopped
    for ch in range(len(LOADS_W)):
        trace_j, truth_j, _ = _closed_form(out, ch, stopped.get(ch, []))
        assert trace_j == pytest.approx(truth_j, rel=0.002), (ch, trace_j, truth_j)
    # each injected fault shows in the trace
    for kind in ("chip_reset", "checksum_error", "absent", "bus_error"):
        assert res.events.get(kind, 0) >= 1, (kind, res.events)
