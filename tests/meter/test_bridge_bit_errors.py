"""SPI bit errors on the bridge path: energy and rows held to the direct path's standard.

The bridge (the real firmware behind an emulated MCU, read by the bridge recorder) runs 40 s on
a SimulatedClock, its chip 1 with SPI bit errors (MISO and MOSI) at 0.001 and at 0.002 per bit
for 10 s from 2 s (`bit-errors:1@2+10=RATE`, the case that moved ch1's energy by −0.25 to
−0.33 % with nothing declared), over 20 seeds of the emulated board's random faults, the
default 0 among them. Each trace, read back, must hold:

* energy per channel within ±0.2 % of the truth less what the trace declares unmetered, the
  truth computed here in closed form from the constant loads, P·(span − declared)
  (`_closed_form`), not with the soak's own arithmetic;
* the declared intervals small (under a second on the faulty channel, none elsewhere): a trace
  cannot pass by declaring the faulty span lost;
* no row off its load without an event near it, no 0 W row, no interval declared where no fault
  was injected.

Seed 0 at both rates runs in the fast suite; the 20 seeds in the slow one (about 1.5 s each).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from meter.clock import SimulatedClock
from meter.emulation.fault_soak import LOADS_W, run_fault_soak
from tests.meter.test_fault_soak import _closed_form

DURATION_S = 40.0
FAULTY_CHANNEL = 1
RATES = ("0.001", "0.002")
SEEDS = range(20)
TOLERANCE = 0.002


def _specs(rate: str) -> list[str]:
    return [f"bit-errors:{FAULTY_CHANNEL}@2+10={rate}"]


def _check(tmp_path: Path, rate: str, seed: int) -> None:
    out = tmp_path / "trace"
    res = run_fault_soak(out, DURATION_S, SimulatedClock(5 * 10**9), bridge=True,
                         specs=_specs(rate), seed=seed)
    assert res.sweeps >= 0.95 * DURATION_S * res.rate_hz
    assert res.zero_rows == 0
    assert res.unexplained_rows == [], res.unexplained_rows[:3]
    assert res.undeclared_fault_intervals == 0
    assert res.events.get("misread", 0) >= 1  # the bit errors did reach the reads
    for ch in range(len(LOADS_W)):
        trace_j, truth_j, declared_s = _closed_form(out, ch, [])
        assert trace_j == pytest.approx(truth_j, rel=TOLERANCE), (ch, trace_j, truth_j)
        assert declared_s < (1.0 if ch == FAULTY_CHANNEL else 1e-9), (ch, declared_s)


@pytest.mark.parametrize("rate", RATES)
def test_bit_errors_at_the_default_seed_leave_energy_and_rows_right(
    tmp_path: Path, rate: str,
) -> None:
    _check(tmp_path, rate, 0)


@pytest.mark.slow
@pytest.mark.shares_cpu  # a SimulatedClock: nothing here waits on the real clock
@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("rate", RATES)
def test_bit_errors_over_20_seeds_leave_energy_and_rows_right(
    tmp_path: Path, rate: str, seed: int,
) -> None:
    _check(tmp_path, rate, seed)
