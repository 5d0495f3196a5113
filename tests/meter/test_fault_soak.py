"""The daemon on the system clock with every fault kind injected in turn (a short soak).

The truth is closed form (constant loads): see meter/emulation/fault_soak.py. The 10-minute
version is bench/bench_fault_soak.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from meter.emulation.fault_soak import ENERGY_TOLERANCE, FAULT_KINDS, run_fault_soak

pytestmark = pytest.mark.slow


def test_every_fault_in_turn_no_unexplained_row_and_energy_within_tolerance(
    tmp_path: Path,
) -> None:
    res = run_fault_soak(tmp_path, duration_s=14.0)
    assert res.zero_rows == 0
    assert res.unexplained_rows == []
    assert res.max_energy_error <= ENERGY_TOLERANCE, res.energy_rel_error
    assert res.rows > 0.8 * res.sweeps * 4 * 0.8
    # every fault kind left its mark
    assert res.events.get("chip_reset") and res.events.get("checksum_error")
    assert res.events.get("absent") and res.events.get("gap")
    assert len(FAULT_KINDS) == 6
