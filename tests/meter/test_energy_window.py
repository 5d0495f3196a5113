"""The energy check's range comes from the readings around the window: the Pmean
before and after, the elapsed time and the register step, never a fixed allowance. Expected
counts are computed here from P·t / (J per count), not with the module's arithmetic."""

from __future__ import annotations

from meter.chip.energy_window import counts_range

JPC = 0.0036  # J per count
DT_S = 0.05


def _counts(power_w: float, dt_s: float = DT_S) -> float:
    return power_w * dt_s / JPC


def test_a_7x_word_on_a_steady_load_is_outside_the_range() -> None:
    lo, hi = counts_range(3.15, 3.15, DT_S, JPC)
    assert lo <= _counts(3.15) <= hi
    assert not lo <= 7 * _counts(3.15) <= hi  # a bit error's 306-for-44 word: caught
    assert not lo <= _counts(3.15) / 7 <= hi
    assert not lo <= _counts(3.15) * 1.15 <= hi  # a 15 % off word is re-read too


def test_a_genuine_x4_load_step_within_the_window_is_inside() -> None:
    for before, after in ((3.0, 12.0), (12.0, 3.0)):
        lo, hi = counts_range(before, after, DT_S, JPC)
        for frac in (0.0, 0.3, 0.7, 1.0):  # the step anywhere in the window
            genuine = _counts(before, frac * DT_S) + _counts(after, (1 - frac) * DT_S)
            assert lo <= genuine <= hi, (before, after, frac)


def test_the_register_step_widens_the_range() -> None:
    lo0, hi0 = counts_range(3.0, 3.0, DT_S, JPC)
    lo1, hi1 = counts_range(3.0, 3.0, DT_S, JPC, step_w=0.5)
    assert lo1 < lo0 and hi1 - hi0 >= _counts(0.5) - 1e-9
