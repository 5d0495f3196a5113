"""The chain self-check wired into the daemon's sampler (issue 27): a chip with a wrong Lgain,
Ugain or meter constant (PL constant) writes a `chain_disagreement` event into the trace within
60 s of simulated time and shows `epi_meter_chain_disagreement 1` on /metrics; a correct chip
under the fast-changing load profiles writes none. The wrong registers come from the
application note's formulas (meter.chip.calibration), not from the checker; the trace is read
back with the trace reader, as `epi analyze` reads it."""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import pytest

from meter.chip.calibration import (
    DEFAULT_UGAIN,
    EMULATED_FRONTEND,
    Calibration,
    lgain_from_error,
    pl_constant,
    pl_words,
)
from meter.emulation.load_profiles import bursts, ramp, square_wave
from meter.emulation.power_models import ConstantPower, PowerModel
from tests.meter.selfcheck_record import MC, record


def _cal(**words: int) -> Calibration:
    cal = Calibration.default(MC)
    for name, word in words.items():
        cal.set(name, word)
    return cal


def _wrong_pl() -> Calibration:
    fe = EMULATED_FRONTEND
    high, low = pl_words(pl_constant(MC * 1.03, fe["un_v"], fe["ib_a"], 1, fe["v_l_mv"],
                                     fe["v_u_mv"]))
    return _cal(PLconstH=high, PLconstL=low)


@pytest.mark.parametrize("cal", [
    pytest.param(_cal(Lgain=lgain_from_error(-0.03)), id="lgain+3%"),
    pytest.param(_cal(Ugain=round(DEFAULT_UGAIN * 1.03)), id="ugain+3%"),
    pytest.param(_wrong_pl(), id="meter-constant+3%"),
])
def test_a_wrong_chip_raises_chain_disagreement_within_60_s(tmp_path: Path,
                                                            cal: Calibration) -> None:
    events, gauges = record(tmp_path, ConstantPower(7.0), cal, 75)
    assert events, "no chain_disagreement in the trace"
    assert events[0][0] <= 60, events
    assert "counter_vs_integral" in events[0][1]
    assert len(events) == 1  # once per episode, not once a sweep
    assert gauges["epi_meter_chain_disagreement"] == 1
    assert gauges["epi_meter_chain_disagreement_ratio"] > 1


@pytest.mark.parametrize("model", [ConstantPower(7.0), square_wave(1.0, 2.7, 9.5),
                                   square_wave(10.0, 2.7, 9.5), ramp(2.7, 9.5, 2.0),
                                   bursts(2.7, 9.5, 0.03, 0.5)],
                         ids=lambda m: getattr(m, "label", "constant-7W"))
def test_a_correct_chip_raises_none_on_fast_loads(tmp_path: Path, model: PowerModel) -> None:
    events, gauges = record(tmp_path, model, Calibration.default(MC), 120)
    assert events == []
    assert gauges["epi_meter_chain_disagreement"] == 0
    assert 0 <= gauges["epi_meter_chain_disagreement_ratio"] <= 1


ROWS_LOST_MAX = 0.001  # the start-up's first metering cycle (0.2 s of 600 s) and no more


SOAK_S = 600.0  # ten minutes of simulated time per profile
SOAK_PROFILES = [square_wave(1.0, 2.7, 9.5), square_wave(10.0, 2.7, 9.5), ramp(2.7, 9.5, 2.0),
                 bursts(2.7, 9.5, 0.03, 0.5)]
SoakResults = dict[str, tuple[list[tuple[float, str]], dict[str, float]]]


@pytest.fixture(scope="module")
def soaks(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], tuple]:
    """The four soaks, run once for the tests below, two at a time in worker processes (each
    is pure CPU on a SimulatedClock: nothing real is waited for, so two cores halve the wall
    time; the results are the same as in this process)."""
    results: SoakResults = {}

    def result(label: str) -> tuple[list[tuple[float, str]], dict[str, float]]:
        if not results:
            ctx = multiprocessing.get_context("spawn")  # no fork of pytest's threads
            with ProcessPoolExecutor(max_workers=2, mp_context=ctx) as pool:
                futures = {m.label: pool.submit(record, tmp_path_factory.mktemp("soak"), m,
                                                Calibration.default(MC), SOAK_S)
                           for m in SOAK_PROFILES}
                results.update({label: f.result() for label, f in futures.items()})
        return results[label]

    return result


@pytest.mark.slow
@pytest.mark.parametrize("label", [m.label for m in SOAK_PROFILES])
def test_ten_minute_soak_of_fast_loads(soaks: Callable[[str], tuple], label: str) -> None:
    """Issue 27's soak: 10 minutes of each fast profile on a correct chip, through the
    sampler: no chain_disagreement, and rows lost (plausibility, not-ready) under 0.1 %."""
    events, gauges = soaks(label)
    assert events == []
    assert gauges["rows_lost"] <= ROWS_LOST_MAX, gauges
