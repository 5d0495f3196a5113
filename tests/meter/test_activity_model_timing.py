"""ActivityModel timing: modelled power follows the CPU activity it models, without lag.

A controlled activity source (cumulative busy/total jiffies as a function of the simulated
clock) runs 100 % busy from 1.0 to 1.3 s and idle otherwise. Asked the way the meter daemon's
20 Hz sweeps ask (every 50 ms), the model must show the power from 1.0 to 1.3 s — within one
sample period — not one update period later (the old model showed it from 1.1 to 1.4 s).
"""

from __future__ import annotations

import pytest

from meter.clock import SimulatedClock
from meter.emulation.chip_emulator import EmulatedChip
from meter.emulation.power_models import ActivityModel

S = 1_000_000_000
IDLE_W, MAX_W = 2.7, 9.5
BUSY_FROM_S, BUSY_TO_S = 1.0, 1.3
TICKS_PER_S = 1000  # fine ticks, so the source itself adds no quantisation


class BurstSource:
    """Cumulative (busy, total) CPU ticks of a machine busy only in [1.0, 1.3) s."""

    def __init__(self, clock: SimulatedClock, t0_ns: int) -> None:
        self.clock, self.t0 = clock, t0_ns

    def __call__(self) -> tuple[int, int]:
        t_s = (self.clock.monotonic_ns() - self.t0) / S
        total = round(t_s * TICKS_PER_S)
        busy_s = min(max(t_s, BUSY_FROM_S), BUSY_TO_S) - BUSY_FROM_S
        return round(busy_s * TICKS_PER_S), total


def _drive(period_s: float, update_period_s: float, until_s: float = 2.0):
    clock = SimulatedClock()
    t0 = clock.monotonic_ns()
    model = ActivityModel(clock, idle_w=IDLE_W, max_w=MAX_W, update_period_s=update_period_s,
                          cpu_times=BurstSource(clock, t0))
    k = 1
    while k * period_s <= until_s + 1e-9:  # the daemon's sweeps ask about "now"
        clock.sleep_until(t0 + round(k * period_s * S))
        model.power_w(clock.monotonic_ns())
        k += 1
    return model, t0


@pytest.mark.parametrize("update_period_s", [0.02, 0.05, 0.1])
def test_burst_shows_from_1_0_to_1_3_s_within_one_sample_period(update_period_s):
    period_s = 0.05  # 20 Hz, the default sample rate
    model, t0 = _drive(period_s, update_period_s)
    at = lambda t_s: model.power_w(t0 + round(t_s * S))  # noqa: E731
    step = max(period_s, update_period_s)
    # inside the burst (one step in from each edge) the power is the busy power ...
    for t in (BUSY_FROM_S + step + 0.001, 1.15, BUSY_TO_S - step / 2 - 0.001):
        if BUSY_FROM_S + step <= t < BUSY_TO_S - step / 2:
            assert at(t) == pytest.approx(MAX_W), t
    # ... and outside it (beyond one step) the idle power: no power after 1.3 s + step
    for t in (0.5, BUSY_FROM_S - 0.001, BUSY_TO_S + step + 0.001, 1.6):
        assert at(t) == pytest.approx(IDLE_W), t
    # the burst's energy lies in [1.0, 1.3] s, not shifted into what follows
    e_burst = model.energy_j(t0 + round(BUSY_FROM_S * S), t0 + round(BUSY_TO_S * S))
    e_after = model.energy_j(t0 + round(BUSY_TO_S * S), t0 + round((BUSY_TO_S + 0.3) * S))
    assert e_burst == pytest.approx(MAX_W * 0.3, rel=1e-9)
    assert e_after == pytest.approx(IDLE_W * 0.3, rel=1e-9)


def test_chip_integrates_the_burst_where_it_happened():
    """Through the emulated chip, asked at 20 Hz: its ground truth has the burst at 1.0–1.3 s."""
    clock = SimulatedClock()
    t0 = clock.monotonic_ns()
    model = ActivityModel(clock, idle_w=IDLE_W, max_w=MAX_W, update_period_s=0.05,
                          cpu_times=BurstSource(clock, t0))
    chip = EmulatedChip(model, clock, refresh_period_s=0.1)
    for k in range(1, 41):
        clock.sleep_until(t0 + k * S // 20)
        chip.true_energy_j(t0, clock.monotonic_ns())
    # ground truth the chip integrates: 0.3 s at the busy power, idle elsewhere
    assert chip.true_energy_j(t0, t0 + 2 * S) == pytest.approx(
        IDLE_W * 1.7 + MAX_W * 0.3, rel=1e-9)
    assert chip.true_energy_j(t0 + 13 * S // 10, t0 + 14 * S // 10) == pytest.approx(
        IDLE_W * 0.1, rel=1e-9)


def test_describe_says_what_it_reads():
    clock = SimulatedClock()
    d = ActivityModel(clock).describe()
    assert d["modelled"] is True and "whole-machine" in d["reads"]
    assert d["source"] == "/proc/stat"
