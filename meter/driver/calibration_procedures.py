"""Calibration procedures for one ATM90E26: gains against a reference load, offsets at no load.

Kept out of the driver class (meter/driver/atm90e26.py, the chip protocol over a bus): these
procedures only use its public operations (`read_value`,
`read_clear`, `write_register`, `apply_calibration`, the clock). Formulas: docs/atm90e26.md §6
(application note 46102B §3.2), code in meter/chip/calibration.py.
"""

from __future__ import annotations

from dataclasses import dataclass

from meter.chip import calibration as calib
from meter.chip import registers as regs
from meter.chip.calibration import CalibrationError
from meter.driver.atm90e26 import ATM90E26Driver

# register name -> (old value, new value), for the registers a procedure changed
Changes = dict[str, tuple[int, int]]


@dataclass
class GainReport:
    """What `calibrate_gains` did: mean readings before and after (Urms V, Irms A, Pmean W),
    the energy error against the reference before and after (fractions; None without
    `watts`), the registers it changed, and the calibration now on the chip."""

    reference_volts: float
    reference_amps: float
    reference_watts: float | None
    before: dict[str, float]
    after: dict[str, float]
    changed: Changes
    calibration: calib.Calibration
    energy_error_before: float | None = None
    energy_error_after: float | None = None
    energy_window_s: float | None = None
    energy_counts: int | None = None


@dataclass
class OffsetReport:
    """What `calibrate_offsets` did: no-load Irms (A) before, small-power-mode Pmean/Qmean
    (LSB) before, Irms/Pmean after, the registers changed, the calibration on the chip."""

    irms_before_a: float
    small_power_before: dict[str, float]
    after: dict[str, float]
    changed: Changes
    calibration: calib.Calibration


def _changes(old: calib.Calibration, new: calib.Calibration, names: tuple[str, ...]
             ) -> Changes:
    return {name: (old.get(name), new.get(name)) for name in names
            if old.get(name) != new.get(name)}


def average(driver: ATM90E26Driver, names: tuple[str, ...], n: int, interval_s: float
            ) -> dict[str, float]:
    """Mean of `n` readings of each register, `interval_s` apart (one refresh or more)."""
    sums = dict.fromkeys(names, 0.0)
    for k in range(n):
        if k:
            driver.clock.sleep_until(
                driver.clock.monotonic_ns() + int(interval_s * 1e9)
            )
        for name in names:
            sums[name] += driver.read_value(name)
    return {name: total / n for name, total in sums.items()}


def measure_energy(
    driver: ATM90E26Driver, seconds: float, poll_s: float = 1.0
) -> tuple[int, float]:
    """(counts, elapsed_s) of ATenergy over a window, read every `poll_s` so the register
    cannot wrap; the counts also go to energy_j."""
    driver.add_energy_counts(driver.read_clear(regs.AT_ENERGY))
    t0 = driver.last_read_clear_t_ns
    end = t0 + int(seconds * 1e9)
    step = max(int(poll_s * 1e9), 1)
    counts = 0
    t = t0
    while t < end:
        t = min(t + step, end)
        driver.clock.sleep_until(t)
        counts += driver.read_clear(regs.AT_ENERGY)
    t1 = driver.last_read_clear_t_ns
    driver.add_energy_counts(counts, t1)
    return counts, (t1 - t0) / 1e9


def calibrate_gains(
    driver: ATM90E26Driver,
    volts: float,
    amps: float,
    watts: float | None = None,
    *,
    seconds: float = 30.0,
    n_readings: int = 5,
    interval_s: float = 1.0,
    min_counts: int = 200,
) -> GainReport:
    """Calibrate Ugain, IgainL (and Lgain from energy, when `watts` is given).

    The load must be steady at the reference values. Writes the new gains with
    checksums, verifies them, and returns a report with the readings before and after.
    Raises CalibrationError for values the chip cannot hold (e.g. Ugain bit 15).
    """
    names = ("Urms", "Irms", "Pmean")
    before = average(driver, names, n_readings, interval_s)
    old = driver.calibration
    new = old.copy()
    new.set("Ugain", calib.ugain_from_reading(volts, before["Urms"], old.get("Ugain")))
    new.set("IgainL", calib.igain_from_reading(amps, before["Irms"], old.get("IgainL")))
    energy_error_before = energy_window_s = None
    energy_counts = None
    if watts is not None:
        if watts <= 0:
            raise CalibrationError("--watts must be > 0 (a resistive reference load)")
        counts, elapsed_s = measure_energy(driver, seconds)
        if counts < min_counts:
            need = seconds * min_counts / max(counts, 1)
            raise CalibrationError(
                f"only {counts} energy counts in {elapsed_s:.1f} s (need {min_counts} for "
                f"0.5 % resolution): measure for at least {need:.0f} s"
            )
        energy_j = counts * old.joules_per_count()
        error = energy_j / (watts * elapsed_s) - 1.0
        new.set("Lgain", calib.lgain_from_error(error, old.get("Lgain")))
        energy_error_before, energy_window_s, energy_counts = error, elapsed_s, counts
    new.note = "calibrated against " + ", ".join(
        f"{v} {u}" for v, u in ((volts, "V"), (amps, "A"), (watts, "W")) if v is not None
    )
    driver.apply_calibration(new)
    refresh_s = max(interval_s, 0.0)
    driver.clock.sleep_until(driver.clock.monotonic_ns() + int(refresh_s * 1e9))
    after = average(driver, names, n_readings, interval_s)
    energy_error_after = None
    if watts is not None:
        counts, elapsed_s = measure_energy(driver, seconds)
        energy_error_after = counts * new.joules_per_count() / (watts * elapsed_s) - 1.0
    return GainReport(
        reference_volts=volts, reference_amps=amps, reference_watts=watts, before=before,
        after=after, changed=_changes(old, new, tuple(calib.REGISTER_NAMES)), calibration=new,
        energy_error_before=energy_error_before, energy_error_after=energy_error_after,
        energy_window_s=energy_window_s, energy_counts=energy_counts)


def calibrate_offsets(
    driver: ATM90E26Driver, *, n_readings: int = 8, interval_s: float = 1.0
) -> OffsetReport:
    """Current and power offsets (AN §3.2.4.5/§3.2.4.6) — with NO load current flowing.

    IoffsetL from Irms; PoffsetL/QoffsetL from the mean small-power-mode Pmean/Qmean.
    """
    old = driver.calibration
    new = old.copy()
    base = average(driver, ("Irms",), n_readings, interval_s)
    ioffset = calib.current_offset(base["Irms"], old.get("IgainL"), old.get("IoffsetL"))
    new.set("IoffsetL", ioffset)
    driver.write_register(regs.SMALL_P_MOD, regs.SMALL_POWER_CODE)
    try:
        driver.clock.sleep_until(driver.clock.monotonic_ns() + int(interval_s * 1e9))
        small = average(driver, ("Pmean", "Qmean"), n_readings, interval_s)
    finally:
        driver.write_register(regs.SMALL_P_MOD, 0x0000)
    new.set("PoffsetL", calib.power_offset(small["Pmean"], old.get("PoffsetL")))
    new.set("QoffsetL", calib.power_offset(small["Qmean"], old.get("QoffsetL")))
    new.note = (old.note + "; " if old.note else "") + "offsets calibrated at no load"
    driver.apply_calibration(new)
    driver.clock.sleep_until(driver.clock.monotonic_ns() + int(interval_s * 1e9))
    after = average(driver, ("Irms", "Pmean"), n_readings, interval_s)
    return OffsetReport(
        irms_before_a=base["Irms"], small_power_before=small, after=after,
        changed=_changes(old, new, ("IoffsetL", "PoffsetL", "QoffsetL")), calibration=new)
