"""The daemon on the system clock with every fault kind injected in turn (a short soak).

One 6 s soak (meter/emulation/fault_soak.py) is shared by the tests below: every fault in a
0.75 s slot, the span faults 0.375 s long — long enough for the daemon to see each fault and
recover (three failed reads, a re-initialisation); an absent chip's 1 s retry outlasts its
slot, and each fault's ±2 s explanation window covers much of this short run, so "no
unexplained row" is checked at full strength by the simulated-clock soak named below. The expected
energies are computed here in closed form from the trace as read back (constant loads:
P·t), not with the soak's own arithmetic. The 10-minute version is bench/bench_fault_soak.py;
tests/meter/test_fault_soak_paths.py runs 80 s of it on a SimulatedClock, where each fault's
±EXPLAIN_WINDOW_S window covers a smaller part of the run than here.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from epi.formats.trace import read_trace
from meter.daemon.trace import UNMETERED_GAP_REASON
from meter.emulation.fault_soak import (
    ENERGY_TOLERANCE,
    FAULT_KINDS,
    LOADS_W,
    SoakResult,
    check_trace,
    fault_schedule,
    run_fault_soak,
)

pytestmark = pytest.mark.slow

DURATION_S = 6.0  # real seconds on the system clock (was 30: 30 s of set-up)
KINDS = FAULT_KINDS  # both bit-error rates (0.001 and 0.002) in every soak


@pytest.fixture(scope="module")
def soak(tmp_path_factory: pytest.TempPathFactory) -> tuple[SoakResult, Path]:
    out = tmp_path_factory.mktemp("soak") / "trace"
    # Both bit-error rates: the energy check re-reads a word outside what the Pmean before
    # and after allow (meter/chip/energy_window.py) and declares a discarded word's window.
    return run_fault_soak(out, duration_s=DURATION_S, kinds=KINDS), out


def _closed_form(out: Path, channel: int, stopped: list[int]) -> tuple[float, float, float]:
    """(trace energy, P·(span − lost), declared s) of one channel, from the trace and the
    instants a checksum fault stopped the chip (before those, a declared interval was metered
    and counted: only the rest is lost)."""
    trace = read_trace(out)
    rows = sorted((r["t_mono_ns"], r["energy_j"]) for r in trace.samples()
                  if r["channel"] == channel)
    (t0, e0), (t1, e1) = rows[0], rows[-1]
    declared = [(max(g.start_mono_ns, t0), min(g.end_mono_ns, t1)) for g in trace.gaps
                if g.channel == channel and g.reason.startswith(UNMETERED_GAP_REASON)
                and g.end_mono_ns > t0 and g.start_mono_ns < t1]
    lost_ns = 0
    for a, b in declared:
        a = max([a] + [t for t in stopped if a <= t < b])
        lost_ns += b - a
    declared_s = sum(b - a for a, b in declared) / 1e9
    return e1 - e0, LOADS_W[channel] * (t1 - t0 - lost_ns) / 1e9, declared_s


def test_every_fault_in_turn_leaves_no_zero_and_no_unexplained_row(
    soak: tuple[SoakResult, Path],
) -> None:
    res, _ = soak
    assert res.zero_rows == 0
    assert res.unexplained_rows == []
    assert res.rows > 0.8 * res.sweeps * 4 * 0.8
    # every fault kind left its mark
    assert res.events.get("chip_reset") and res.events.get("checksum_error")
    assert res.events.get("absent") and res.events.get("gap")
    assert "bit-errors" in KINDS and "bit-errors=0.002" in KINDS  # both rates


def test_trace_energy_is_within_0_2_percent_of_the_truth_on_every_channel(
    soak: tuple[SoakResult, Path],
) -> None:
    res, out = soak
    for ch in range(len(LOADS_W)):
        trace_j, truth_j, declared_s = _closed_form(out, ch, res.metering_stopped.get(ch, []))
        assert abs(trace_j / truth_j - 1) <= ENERGY_TOLERANCE, (ch, trace_j, truth_j)
        # the soak's own figures agree with the closed form (its truth is the emulator's)
        e = res.energy[ch]
        assert e.trace_j == pytest.approx(trace_j, rel=1e-12)
        assert e.truth_j == pytest.approx(truth_j, rel=1e-9)
        assert e.declared_s == pytest.approx(declared_s, rel=1e-9)
    assert res.max_energy_error <= ENERGY_TOLERANCE and res.ok


def test_energy_is_declared_lost_only_where_a_fault_lost_it(
    soak: tuple[SoakResult, Path],
) -> None:
    res, _ = soak
    assert res.undeclared_fault_intervals == 0
    slot_s = DURATION_S / (len(KINDS) + 1)
    # reset (ch0), checksum (ch1): a re-initialisation each, well under a second lost
    assert 0 < res.energy[0].declared_s < 1.0 and 0 < res.energy[1].declared_s < 1.0
    # the checksum's declared interval begins at the last good read, before the bit flipped
    (flipped,) = res.metering_stopped[1]
    (declared,) = [d for d in res.energy[1].declared if d[0] <= flipped < d[1]]
    assert res.energy[1].declared_counted_s == pytest.approx((flipped - declared[0]) / 1e9)
    # absent (ch2): the counter is lost for at least the time the chip was away
    assert slot_s / 2 <= res.energy[2].declared_s < slot_s / 2 + 2.0
    # stuck (ch3): the re-initialisation after it clears what the chip metered meanwhile
    assert slot_s / 2 <= res.energy[3].declared_s < slot_s / 2 + 2.0


def test_the_check_fails_a_trace_whose_lost_energy_is_not_declared(
    soak: tuple[SoakResult, Path], tmp_path: Path,
) -> None:
    """The same trace with the unmetered gaps removed: the absent channel then reads about
    P·(slot / 2) short of the truth, far outside the tolerance."""
    _, out = soak
    copy = tmp_path / "trace"
    shutil.copytree(out, copy)
    for events in copy.glob("seg-*.events.csv"):
        lines = events.read_text().splitlines(keepends=True)
        events.write_text("".join(ln for ln in lines if UNMETERED_GAP_REASON not in ln))

    def closed_form(channel: int, t0: int, t1: int) -> float:
        return LOADS_W[channel] * (t1 - t0) / 1e9

    _, found = check_trace(copy, closed_form, fault_schedule(DURATION_S, KINDS))
    errors = {ch: e.error for ch, e in found["energy"].items()}
    slot_s = DURATION_S / (len(KINDS) + 1)
    assert errors[2] < -0.5 * (slot_s / 2) / DURATION_S < -ENERGY_TOLERANCE, errors
    assert all(not e.declared for e in found["energy"].values())
