"""`epi meter qualify` end to end on the emulator: every injected fault — gain,
phase, power offset, reversed CT, crosstalk, dead channel — is detected by its own finding,
and a clean board passes.

Expected figures come from the injected faults through closed forms, not from the code under
test: a gain error e reads (1 + e)·E; a phase error δ at PF cos θ reads cos(θ + δ)/cos θ − 1
(θ = 60° at PF 0.5); crosstalk f shows as f of the neighbour's current.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from meter.qualify.analysis import ChannelQualification, Window, energy_error
from meter.qualify.emulated import ChannelFaults, emulated_board
from meter.qualify.references import ResistiveLoad
from meter.qualify.session import QualifyOptions, qualify

REPO = Path(__file__).resolve().parents[2]
OPTS = QualifyOptions(idle_s=6.0, load_s=6.0)
GAIN, PHASE_RAD, OFFSET_W, CROSSTALK = 0.03, 0.02, 0.2, 0.01


def _run(faults: list[ChannelFaults]) -> list[ChannelQualification]:
    drivers, clock, plant, ref = emulated_board(faults)
    names = [f"ch{i}" for i in range(len(faults))]
    return qualify(drivers, names, clock, plant, ref, OPTS)


def _failed(q: ChannelQualification) -> set[str]:
    return {f.name for f in q.findings if not f.ok}


@pytest.fixture(scope="module")
def faulty() -> list[ChannelQualification]:
    return _run([
        ChannelFaults(),
        ChannelFaults(errors={"energy_l": GAIN}),
        ChannelFaults(errors={"phase_l_rad": PHASE_RAD}),
        ChannelFaults(errors={"power_offset_w": OFFSET_W}),
        ChannelFaults(ct_reversed=True),
        ChannelFaults(crosstalk_from=0, crosstalk_fraction=CROSSTALK),
        ChannelFaults(dead=True),
    ])


def test_clean_board_passes() -> None:
    results = _run([ChannelFaults(), ChannelFaults()])
    assert all(q.passed for q in results), [(q.channel, _failed(q)) for q in results]
    for q in results:
        assert q.energy_error_pct is not None and abs(q.energy_error_pct) < 0.05
        assert q.noise_floor_w == 0.0
        # the smallest load metered is the start-up threshold: 0.2 % of Un·Ib = 0.46 W
        assert q.smallest_load_w == pytest.approx(0.002 * 230 * 1.0, rel=1e-3)


def test_clean_channel_of_a_faulty_board_passes(faulty: list[ChannelQualification]) -> None:
    assert faulty[0].passed, _failed(faulty[0])


def test_gain_error_detected(faulty: list[ChannelQualification]) -> None:
    q = faulty[1]
    assert "energy_error" in _failed(q)
    assert q.energy_error_pct == pytest.approx(GAIN * 100, abs=0.05)


def test_phase_error_detected(faulty: list[ChannelQualification]) -> None:
    q = faulty[2]
    assert _failed(q) == {"phase"}
    phase = next(f for f in q.findings if f.name == "phase")
    theta = math.acos(0.5)
    expected = (math.cos(theta + PHASE_RAD) / math.cos(theta) - 1) * 100
    assert phase.value == pytest.approx(expected, abs=0.05)


def test_power_offset_detected(faulty: list[ChannelQualification]) -> None:
    assert "plausible_rows" in _failed(faulty[3])


def test_small_offset_shows_in_the_noise_floor() -> None:
    # 0.04 W: inside the P = U·I·PF tolerance (0.05 W), above the class of 2.7 W (0.027 W)
    q = _run([ChannelFaults(errors={"power_offset_w": 0.04})])[0]
    assert "noise_floor" in _failed(q)
    assert q.noise_floor_w == pytest.approx(0.04, abs=2 / 256)


def test_reversed_ct_detected(faulty: list[ChannelQualification]) -> None:
    assert _failed(faulty[4]) == {"ct_orientation"}


def test_crosstalk_detected(faulty: list[ChannelQualification]) -> None:
    q = faulty[5]
    assert _failed(q) == {"crosstalk"}
    cross = next(f for f in q.findings if f.name == "crosstalk")
    assert cross.value == pytest.approx(CROSSTALK, rel=0.02)


def test_dead_channel_detected(faulty: list[ChannelQualification]) -> None:
    assert _failed(faulty[6]) == {"alive"}


def test_energy_error_uncertainty_closed_form() -> None:
    w = Window(10.0, 101.0, 0.0, 101.0, 10.1, 0.044, 230.0, 200, 0, 0.0036)
    err, u = energy_error(w, 100.0, 1.0)
    assert err == pytest.approx(1.0)
    assert u == pytest.approx(math.sqrt(1.0 ** 2 + (0.0036 / 100 * 100) ** 2 + 0.1 ** 2))


def test_resistive_reference_closed_form() -> None:
    w = Window(10.0, 0.0, 0.0, 0.0, 0.0, 0.0, 230.0, 200, 0, 0.0036)
    ref = ResistiveLoad(5290.0, 1.0)  # 230² / 5290 = 10 W
    assert ref.energy_j(0, 0, 0, [w]) == pytest.approx(100.0)
    assert ref.uncertainty_pct == pytest.approx(math.sqrt(1.0 + 1.0))


def test_cli_saves_the_result_and_exits_1_on_a_fault(tmp_path: Path) -> None:
    out = tmp_path / "q.json"
    cmd = [sys.executable, "-c", "from epi.cli import main; main()", "meter", "qualify",
           "--emulate", "--channels", "2", "--step-s", "2", "--inject", "reversed:1",
           "--out", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, timeout=120)
    assert proc.returncode == 1, proc.stderr
    assert "FAIL ct_orientation" in proc.stdout
    rec = json.loads(out.read_text())
    assert rec["format"] == "epi-meter-qualification" and rec["passed"] is False
    assert [c["passed"] for c in rec["channels"]] == [True, False]
    bad = subprocess.run([*cmd[:-4], "--inject", "gain:7=0.1"], capture_output=True,
                         text=True, cwd=REPO, timeout=120)
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1


def _crosstalk(q: ChannelQualification):  # type: ignore[no-untyped-def]
    return next(f for f in q.findings if f.name == "crosstalk")


@pytest.mark.parametrize("aggressor", [ChannelFaults(errors={"power_offset_w": OFFSET_W}),
                                       ChannelFaults(dead=True)],
                         ids=["offset", "dead"])
def test_crosstalk_from_an_offset_or_dead_channel_is_still_measured(
        aggressor: ChannelFaults) -> None:
    """5 % of ch0's load coupled into ch1. A 0.2 W offset on ch0 makes every one of its
    readings fail P = U·I·PF (no current to divide by): the estimate fell back to energy,
    which ch1's counter never meters below its start-up threshold, and passed at 0 %. A dead
    ch0 read 0 A and gave 152343750000 %. Either way the load ch0 drew is the reference's
    (7 W at PF 1), so ch1 sees 5 % of it by current, as injected."""
    q = _run([aggressor, ChannelFaults(crosstalk_from=0, crosstalk_fraction=0.05)])[1]
    cross = _crosstalk(q)
    assert not cross.ok
    assert cross.value == pytest.approx(0.05, rel=0.02)
    assert "from the reference" in cross.detail


def test_crosstalk_without_anything_to_compare_is_na_not_a_number() -> None:
    from meter.qualify.analysis import crosstalk_fraction, judge_channel

    victim_idle = Window(10.0, 0.0, 0.0, 0.0, 0.0, 0.0001, 230.0, 50, 0, 0.0036)
    victim = Window(10.0, 0.0, 0.0, 0.0, 0.0, 0.0016, 230.0, 50, 0, 0.0036)
    silent = Window(10.0, 0.0, 0.0, 0.0, 0.0, 0.0, 230.0, 50, 0, 0.0036)
    c = crosstalk_fraction(victim, victim_idle, silent, 0.0)  # no current, no reference
    assert c.fraction is None and c.basis.startswith("n/a")
    loaded = Window(10.0, 70.0, 0.0, 70.0, 7.0, 7.0 / 230, 230.0, 50, 0, 0.0036)
    q = judge_channel("ch1", victim_idle, loaded, 70.0, 0.1, 1.0, 0.46, 2.7, {"ch0": c})
    cross = _crosstalk(q)
    assert cross.value is None and not cross.ok and "n/a" in cross.detail
    # by current with a known reference: (0.0016 − 0.0001) A of 7 W / 230 V
    ok = crosstalk_fraction(victim, victim_idle, silent, 70.0)
    assert ok.fraction == pytest.approx(0.0015 / (7.0 / 230.0))
