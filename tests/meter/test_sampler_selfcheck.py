"""The chain self-check wired into the daemon's sampler: a chip with a wrong Lgain,
Ugain or meter constant (PL constant) writes a `chain_disagreement` event into the trace within
60 s of simulated time and shows `epi_meter_chain_disagreement 1` on /metrics; a correct chip
under the fast-changing load profiles writes none. The wrong registers come from the
application note's formulas (meter.chip.calibration), not from the checker; the trace is read
back with the trace reader, as `epi analyze` reads it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from epi.formats.trace import read_trace
from meter.chip.calibration import (
    DEFAULT_UGAIN,
    EMULATED_FRONTEND,
    Calibration,
    lgain_from_error,
    pl_constant,
    pl_words,
)
from meter.clock import SimulatedClock
from meter.daemon.metrics import ChannelInfo, MeterState, render_prometheus
from meter.daemon.sampler import Sampler
from meter.daemon.trace import TraceLock, TraceWriter
from meter.driver.atm90e26 import ATM90E26Driver
from meter.emulation.chip_emulator import EmulatedChip
from meter.emulation.emulated_bus import EmulatedSpiBus
from meter.emulation.load_profiles import bursts, ramp, square_wave
from meter.emulation.power_models import ConstantPower, PowerModel

S = 1_000_000_000
MC = 1e8
PERIOD_S = 0.05


@dataclass
class _Channel:
    index: int
    name: str
    driver: ATM90E26Driver


def _record(tmp_path: Path, model: PowerModel, cal: Calibration, seconds: float
            ) -> tuple[list[tuple[float, str]], dict[str, float]]:
    """(seconds after start, detail) of every chain_disagreement event in the trace, and the
    /metrics chain gauges at the end (plus `rows_lost`: the sweeps that wrote no row, as a
    fraction, counted from the trace)."""
    clock = SimulatedClock(5 * S)
    chip = EmulatedChip(model, clock, meter_constant_imp_per_kwh=MC)
    driver = ATM90E26Driver(EmulatedSpiBus(chip), cal, clock=clock, first_measurement_s=0.2)
    driver.start()
    out = tmp_path / "trace"
    writer = TraceWriter(out, {"test": True}, lock=TraceLock(out))
    state = MeterState([ChannelInfo(0, "ch0", None)], {})
    t0 = clock.monotonic_ns()
    sampler = Sampler([_Channel(0, "ch0", driver)], clock, writer, period_s=PERIOD_S,
                      state=state)
    stats = sampler.run(seconds, start_mono_ns=t0)
    writer.close()
    trace = read_trace(out)
    events = [((e["t_mono_ns"] - t0) / S, e["detail"]) for e in trace.events()
              if e["kind"] == "chain_disagreement"]
    rows = sum(1 for _ in trace.samples())
    text = render_prometheus(state, clock.monotonic_ns(), clock.realtime_ns())
    gauges = {s.name: s.value for f in text_string_to_metric_families(text)
              for s in f.samples if s.name.startswith("epi_meter_chain")}
    gauges["rows_lost"] = 1 - rows / stats.sweeps
    return events, gauges


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
    events, gauges = _record(tmp_path, ConstantPower(7.0), cal, 75)
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
    events, gauges = _record(tmp_path, model, Calibration.default(MC), 120)
    assert events == []
    assert gauges["epi_meter_chain_disagreement"] == 0
    assert 0 <= gauges["epi_meter_chain_disagreement_ratio"] <= 1


ROWS_LOST_MAX = 0.001  # the start-up's first metering cycle (0.2 s of 600 s) and no more


@pytest.mark.slow
@pytest.mark.shares_cpu  # a SimulatedClock: nothing here depends on real time or CPU
@pytest.mark.parametrize("model", [square_wave(1.0, 2.7, 9.5), square_wave(10.0, 2.7, 9.5),
                                   ramp(2.7, 9.5, 2.0), bursts(2.7, 9.5, 0.03, 0.5)],
                         ids=lambda m: getattr(m, "label", "?"))
def test_ten_minute_soak_of_fast_loads(tmp_path: Path, model: PowerModel) -> None:
    """The soak: 10 minutes of each fast profile on a correct chip, through the
    sampler: no chain_disagreement, and rows lost (plausibility, not-ready) under 0.1 %."""
    events, gauges = _record(tmp_path, model, Calibration.default(MC), 600)
    assert events == []
    assert gauges["rows_lost"] <= ROWS_LOST_MAX, gauges
