"""One emulated chip sampled by the daemon's Sampler on a SimulatedClock, its trace read back
(tests/meter/test_sampler_selfcheck.py). A module of its own so that the ten-minute soaks can
run in worker processes (pure CPU, no clock to wait for: two at a time on two cores)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from epi.formats.trace import read_trace
from meter.chip.calibration import Calibration
from meter.clock import SimulatedClock
from meter.daemon.metrics import ChannelInfo, MeterState, render_prometheus
from meter.daemon.sampler import Sampler
from meter.daemon.trace import TraceLock, TraceWriter
from meter.driver.atm90e26 import ATM90E26Driver
from meter.emulation.chip_emulator import EmulatedChip
from meter.emulation.emulated_bus import EmulatedSpiBus
from meter.emulation.power_models import PowerModel

S = 1_000_000_000
MC = 1e8
PERIOD_S = 0.05


@dataclass
class _Channel:
    index: int
    name: str
    driver: ATM90E26Driver


def record(tmp_path: Path, model: PowerModel, cal: Calibration, seconds: float
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
