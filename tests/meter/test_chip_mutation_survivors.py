"""Tests for real gaps that `make mutate` (scripts/mutate.py) found in meter/chip: a mutant
survived every test covering its module. Expected values from the module's documented rule."""

from __future__ import annotations

from typing import Any

import pytest

from meter.chip.energy_window import REL_ALLOWANCE, SLACK_COUNTS, counts_range


@pytest.mark.parametrize("dt_s", [0.0, -0.5])
def test_a_window_of_no_time_holds_only_the_counters_own_step(dt_s: float) -> None:
    """No elapsed time (or a clock read backwards): the load metered nothing, so the range is
    just the counter's step at the ends, [0, SLACK_COUNTS], whatever the power."""
    assert counts_range(9.0, 12.0, dt_s, 0.36) == (0.0, SLACK_COUNTS)


def test_the_range_is_the_lower_and_higher_power_times_the_time() -> None:
    """9 W then 12 W for 10 s at 0.36 J/count: between 9·10/0.36 = 250 and 12·10/0.36 = 333.3
    counts, widened by the relative allowance and the counter's step at each end."""
    lo, hi = counts_range(12.0, -9.0, 10.0, 0.36)  # absolute: the sign does not matter
    assert lo == pytest.approx(250 * (1 - REL_ALLOWANCE) - SLACK_COUNTS)
    assert hi == pytest.approx(12 * 10 / 0.36 * (1 + REL_ALLOWANCE) + SLACK_COUNTS)


def test_a_pl_constant_of_exactly_32_bits_fits() -> None:
    """PL_Constant = 838860800 · G_L · V_L · V_U / (MC · Un · Ib), rounded (AN §3.2.2), must
    fit the 32-bit PLconstH/PLconstL pair: 0xFFFFFFFF fits, one more does not."""
    from meter.chip.calibration import CalibrationError, pl_constant

    mc = 838860800 / 0xFFFFFFFF  # every other factor 1: the constant is exactly 0xFFFFFFFF
    assert pl_constant(mc, 1.0, 1.0, 1, 1.0, 1.0) == 0xFFFFFFFF
    with pytest.raises(CalibrationError, match="32 bits"):
        pl_constant(838860800 / (0xFFFFFFFF + 1), 1.0, 1.0, 1, 1.0, 1.0)


def test_a_read_a_register_wrap_late_gets_its_wrap_back() -> None:
    """The design calibration at 1e6 imp/kWh counts 0.36 J, so 9 W is 25 counts/s and 3000 s
    between reads 75 000 counts, more than the 16-bit register holds: the wrap is added back
    and the energy is 9 W × the time, within one count."""
    from meter.chip.calibration import Calibration
    from meter.clock import SimulatedClock
    from meter.driver.atm90e26 import ATM90E26Driver
    from meter.emulation.chip_emulator import EmulatedChip
    from meter.emulation.emulated_bus import FRAME_TIME_160K_S, EmulatedSpiBus
    from meter.emulation.power_models import ConstantPower

    clock = SimulatedClock()
    chip = EmulatedChip(ConstantPower(9.0), clock, meter_constant_imp_per_kwh=1e6)
    driver = ATM90E26Driver(EmulatedSpiBus(chip, frame_time_s=FRAME_TIME_160K_S),
                            Calibration.default(1e6), clock=clock)
    driver.start()
    clock.advance(3000 * 10**9)
    driver.read_sample()
    elapsed_s = (driver.energy_t_mono_ns - driver.energy_epoch_mono_ns) / 1e9  # type: ignore[operator]
    assert 9.0 * elapsed_s / driver.calibration.joules_per_count() > 0xFFFF
    assert abs(driver.energy_j - 9.0 * elapsed_s) < driver.calibration.joules_per_count()


def _limits() -> object:
    from meter.chip.plausibility import Limits

    # 230 V mains, Ib 1 A: floor 0.05 · 230 · 1 = 11.5 W, at most 60 A
    return Limits.for_frontend({"un_v": 230.0, "ib_a": 1.0})


def test_the_energy_bound_allows_four_times_the_larger_power_plus_the_floor() -> None:
    """docs/atm90e26.md §7: (4·|P|max + 0.05·Un·Ib)·Δt / (J per count) + 2 counts. Powers 3 W
    and −5 W for 2 s at 0.1 J/count: (4·5 + 11.5)·2/0.1 + 2 = 632 counts."""
    from meter.chip.plausibility import energy_bound_counts

    assert energy_bound_counts([3.0, -5.0], 2.0, 0.1, _limits()) == pytest.approx(632.0)
    # no time (or a clock read backwards): the counter's step only
    assert energy_bound_counts([3.0, -5.0], -1.0, 0.1, _limits()) == pytest.approx(2.0)


def _reading(u: float, i: float, pf: float, off_w: float) -> dict[str, float]:
    """A reading whose active power is off U·I·PF by `off_w` (Smean not read)."""
    return {"Urms": u, "Irms": i, "Pmean": u * i * pf + off_w, "PowerF": pf, "Freq": 50.0}


def test_register_steps_widen_the_consistency_tolerance_by_what_they_round_away() -> None:
    """3.15 W at 230 V: the base tolerance is 1 % of U·I + 0.05 W = 0.0815 W; Irms read in
    whole mA (half a step 0.5 mA) adds |U|·ΔI·max(|PF|, 0) = 230 · 0.0005 = 0.115 W. A power
    0.15 W off U·I·PF fails the first and passes the second."""
    from meter.chip.plausibility import check_measurements

    r = _reading(230.0, 3.15 / 230.0, 1.0, 0.15)
    assert check_measurements(r, _limits()) != []
    assert check_measurements(r, _limits(), quanta={"Irms": 0.0005}) == []


@pytest.mark.parametrize("missing", ["Urms", "Irms", "PowerF", "Pmean"])
def test_a_register_read_extended_adds_nothing_to_the_tolerance(missing: str) -> None:
    """Each Δ of §7 that `quanta` does not name is 0: at 230 V, 10 A, PF 0.5 (1150 W), with the
    other three named, a power off by the documented tolerance + 0.5 W is refused and one off
    by the tolerance − 0.5 W passes. (A missing Δ read as 1 would widen it by ≥ 1 W.)"""
    from meter.chip.plausibility import check_measurements

    u, i, pf = 230.0, 10.0, 0.5
    quanta = {k: q for k, q in {"Urms": 0.005, "Irms": 0.0005, "PowerF": 0.0005,
                               "Pmean": 0.05}.items() if k != missing}
    du, di = quanta.get("Urms", 0.0), quanta.get("Irms", 0.0)
    tol = (0.01 * u * i + 0.05 + (u * di + i * du) * max(pf, 0.0)
           + u * i * quanta.get("PowerF", 0.0) + quanta.get("Pmean", 0.0))
    assert check_measurements(_reading(u, i, pf, tol + 0.5), _limits(), quanta) != []
    assert check_measurements(_reading(u, i, pf, tol - 0.5), _limits(), quanta) == []


class _Bus:
    """A chip's words behind the access layer: LastData (06H) holds the word of the last read
    that reached the chip; a read listed in `lost` (its count) never reaches it and returns
    noise, leaving LastData as it was."""

    def __init__(self, words: dict[int, int], lost: dict[int, int] | None = None,
                 lastdata_stuck: int | None = None) -> None:
        from meter.chip import registers as regs

        self.regs = regs
        self.words = dict(words)
        self.lost = dict(lost or {})
        self.lastdata = 0x0000
        self.lastdata_stuck = lastdata_stuck

    def read_word(self, address: int) -> int:
        if address == self.regs.LAST_DATA:
            return self.lastdata if self.lastdata_stuck is None else self.lastdata_stuck
        if self.lost.get(address, 0) > 0:
            self.lost[address] -= 1
            return 0x0BAD
        self.lastdata = self.words.get(address, 0x0000)
        return self.lastdata

    def write_word(self, address: int, value: int) -> bool:
        self.words[address] = value
        self.lastdata = value
        return True


def test_a_read_never_confirmed_counts_one_verify_failure() -> None:
    """A read whose LastData never agrees raises VerifyError and counts one failure in
    `stats["verify_failures"]` (one per failed access, not per try); a confirmed read none."""
    from meter.chip import registers as regs
    from meter.chip.access import VerifiedAccess
    from meter.chip.errors import VerifyError

    bus = _Bus({regs.CAL_START: 0x5678})
    acc = VerifiedAccess(bus.read_word, bus.write_word, lambda: 0, retries=3)
    assert acc.read(regs.CAL_START) == 0x5678 and acc.stats["verify_failures"] == 0
    bus.lastdata_stuck = 0x1234  # LastData answers another word, whatever was read
    with pytest.raises(VerifyError):
        acc.read(regs.CAL_START)
    assert acc.stats["verify_failures"] == 1
    assert acc.stats["read_retries"] == 2  # 3 tries: the count is per access, not per try


def test_a_read_clear_frame_that_never_reached_the_chip_is_repeated() -> None:
    """LastData still holding the sentinel (the verified word before) means the read-clear
    frame never reached the chip: nothing was cleared, so it is read again and the chip's
    word returned, never the sentinel's (application note §4.3; meter/chip/access.py)."""
    from meter.chip import registers as regs
    from meter.chip.access import VerifiedAccess

    at_energy = regs.address("ATenergy")
    bus = _Bus({regs.CAL_START: 0x5678, at_energy: 123}, lost={at_energy: 1})
    acc = VerifiedAccess(bus.read_word, bus.write_word, lambda: 7, retries=3)
    assert acc.read_clear(at_energy) == 123
    assert acc.stats["read_retries"] == 1 and acc.stats["verify_failures"] == 0


class _ChipStub:
    """What an EnergyAccount reads of its protocol (meter/chip/energy_account.py's docstring):
    ticks in ns, the reading's rejected/unconfirmed words, the last read-clear's record."""

    def __init__(self) -> None:
        self.rejected: list[int] = []
        self.unconfirmed: list[int] = []
        self.known_words: list[int] = []
        self.quanta = None
        self.t_read_clear = 0
        self.read_clear_other: int | None = None
        self.read_clear_seen: list[int] = []
        self.events: list[tuple[str, str]] = []

    def seconds(self, ticks: int) -> float:
        return ticks / 1e9

    def event(self, kind: str, detail: str) -> None:
        self.events.append((kind, detail))


def test_a_word_a_redirected_read_cleared_is_added_back() -> None:
    """36 W for 10 s at 0.36 J/count is 1000 counts. ATenergy gave 100, and a misread word
    of the same reading was 900 (a read redirected to ATenergy cleared it and returned its
    counts): the counts are 100 + 900 = 1000, the power's."""
    from meter.chip.energy_account import EnergyAccount

    chip = _ChipStub()
    chip.rejected = [900]
    acc = EnergyAccount(chip)
    assert acc._recovered_counts(100, 10.0, 36.0, 0.36) == 1000
    assert chip.events and chip.events[0][0] == "misread"


def test_a_settled_reread_is_judged_over_the_window_since_the_last_energy_read() -> None:
    """The window is last ATenergy read (5 s) → this read-clear (15 s): 10 s at 36 W, 0.36
    J/count, 1000 counts, range 1000·(1 ± 3 %) ∓ 2 = [968, 1032] (energy_window). A re-read
    of 2000 lies outside it; the word LastData then held, 1000, inside: that one is taken.
    (Over 20 s, a window measured from the epoch, 2000 would pass.)"""
    from meter.chip.energy_account import EnergyAccount

    chip = _ChipStub()
    chip.t_read_clear = 15 * 10**9
    chip.read_clear_other = 1000
    acc = EnergyAccount(chip)
    acc.t_energy = 5 * 10**9
    assert acc._settled_reread(2000, 36.0, 36.0, 0.36) == 1000
    chip.read_clear_other = 1500  # outside too: nothing better, the re-read stands
    assert acc._settled_reread(2000, 36.0, 36.0, 0.36) == 2000


def test_en_status_is_46h() -> None:
    """EnStatus is register 46H (datasheet Table-10; one MOSI bit from ATenergy 42H, which is
    why a redirected energy read can return its 0800H)."""
    from meter.chip import registers as regs

    assert regs.EN_STATUS == 0x46 == regs.address("EnStatus")
    assert regs.EN_STATUS ^ regs.AT_ENERGY == 0x04  # one bit apart


def test_a_refuted_checksum_error_leaves_a_16_bit_status_without_its_bits() -> None:
    """A SysStatus read a bit error sent to SagTh (1D6AH: AdjErr bits set), refuted by CS1/CS2
    read back as calibrated: the reading's status word is still a 16-bit word, with the
    checksum-error bits (CalErr/AdjErr) cleared, so nothing downstream sees a checksum
    error that was not one."""
    from meter.chip import registers as regs
    from meter.chip.protocol import CHECKSUM_ERR_MASK
    from tests.meter.test_chip_protocol import Rig

    rig = Rig("driver", clear_on_read=False, steps=[(0, 60.0)])
    for _ in range(4):
        rig.sample()
    rig.bus.redirect = (regs.SYS_STATUS, regs.SAG_TH)
    rig.clock.advance(1_000_000_000 // 4)
    sample = rig.driver.read_sample()
    assert 0 <= sample.status <= 0xFFFF
    assert sample.status & CHECKSUM_ERR_MASK == 0


def test_a_chip_reading_zero_everywhere_is_absent_and_named_so() -> None:
    """A bus on which every register, LastData included, reads 0000H (no chip, MISO pulled
    low) confirms every read: FuncEn and CalStart both 0000H mean no chip answers, reported
    as ChipAbsentError with the two words, not as a stuck chip or a crash."""
    from meter.errors import ChipAbsentError
    from tests.meter.test_driver_buses import Rig

    rig = Rig("emulated")
    rig.driver.start()
    try:
        rig.run(2)
        rig.chip.set_stuck(0x0000)
        _, errors = rig.run(2)
    finally:
        rig.close()
    assert errors and all(isinstance(e, ChipAbsentError) for e in errors)
    assert "FuncEn and CalStart read 0x0000/0x0000: no chip answers" in str(errors[0])


def test_the_protocol_tries_an_access_five_times_by_default() -> None:
    """docs/atm90e26.md §8: an access is tried at most 5 times. A LastData that never agrees:
    the register is read 5 times, then VerifyError."""
    from meter.chip import registers as regs
    from meter.chip.calibration import Calibration
    from meter.chip.errors import VerifyError
    from meter.chip.protocol import Protocol

    bus = _Bus({regs.CAL_START: 0x5678}, lastdata_stuck=0x1234)
    reads: list[int] = []

    def read_word(address: int) -> int:
        reads.append(address)
        return bus.read_word(address)

    proto = Protocol(read_word, bus.write_word, Calibration.default(1e8), lambda: 0, 10**9, ())
    with pytest.raises(VerifyError):
        proto.read(regs.CAL_START)
    assert reads.count(regs.CAL_START) == 5


@pytest.mark.parametrize("field", ["mc", "un", "ib"])
def test_a_pl_constant_of_a_zero_factor_is_refused(field: str) -> None:
    """PL_Constant divides by MC · Un · Ib (AN §3.2.2): a zero in any of them is refused as a
    calibration error, never a division by zero."""
    from meter.chip.calibration import CalibrationError, pl_constant

    args = {"mc": 1e8, "un": 230.0, "ib": 5.0}
    args[field] = 0.0
    with pytest.raises(CalibrationError, match="must be > 0"):
        pl_constant(args["mc"], args["un"], args["ib"], 1, 250.0, 250.0)


def test_an_unmetered_interval_is_estimated_at_the_last_power_over_its_length() -> None:
    """From 2 s to 5 s at a last power of −10 W (a reversed CT reads negative): 3 s not
    metered, ≈ 30 J at the last power, kept with the interval."""
    from meter.chip.energy_account import EnergyAccount

    acc = EnergyAccount(_ChipStub())
    acc.last_power = -10.0
    note = acc.note_unmetered(2 * 10**9, 5 * 10**9, "chip reset")
    assert "energy over 3.000 s not metered" in note and "≈30.000 J" in note
    assert acc.unmetered == [(2 * 10**9, 5 * 10**9, "chip reset", pytest.approx(30.0))]
    assert acc.note_unmetered(5 * 10**9, 5 * 10**9, "x") == "no metered interval lost"


def test_every_register_has_a_positive_scale_and_a_raw_word_has_scale_one() -> None:
    """A scale per LSB of 0 would decode every word of the register as 0 (a silent zero).
    Registers without a unit are raw words, scale 1 (status, magic words, calibration gains
    and offsets: datasheet Table-10), except the power factors, 0.001 per LSB (§5.5)."""
    from meter.chip.registers import REGISTERS

    assert all(r.scale > 0 for r in REGISTERS)
    raw = [r for r in REGISTERS if r.unit == "" and not r.name.startswith("PowerF")]
    assert raw and all(r.scale == 1 for r in raw), [r.name for r in raw if r.scale != 1]


def test_the_soft_reset_writes_789ah_to_register_00h() -> None:
    """Datasheet §3.7 (docs/atm90e26.md §2): SoftReset (00H) resets the chip only when 789AH
    is written. The initialisation's first bus access is that write."""
    from meter.chip.calibration import Calibration
    from meter.chip.protocol import Protocol

    class _Stop(Exception):
        """Ends the initialisation after its first write: only that write is checked."""

    writes: list[tuple[int, int]] = []

    def write_word(address: int, value: int) -> bool:
        writes.append((address, value))
        raise _Stop  # the rest of the sequence is not under test

    proto = Protocol(lambda a: 0, write_word, Calibration.default(1e8), lambda: 0, 10**9, ())
    with pytest.raises(_Stop):
        proto.init_chip()
    assert writes == [(0x00, 0x789A)]


@pytest.mark.parametrize("value", [-1e9, -40_000.0, -0.3, 0.0, 1.0, 12_345.6, 40_000.0, 1e9])
def test_an_emulated_lsb_extension_word_has_bits_7_to_0_clear(value: float) -> None:
    """DS p.26, AN §4.4 (docs/atm90e26.md §3): the LSB register's bits 7:0 are always 0, also
    for a value beyond the register's range (clipped to the largest the 24 bits hold: 7FFFH
    and FF00H for Pmean, FFFFH and FF00H for Urms)."""
    from meter.chip import registers as regs

    for name in ("Pmean", "Urms"):
        raw, lsb = regs.split_extended(value, regs.BY_NAME[name])
        assert 0 <= raw <= 0xFFFF and lsb & 0x00FF == 0
        if value >= 1e9:
            assert (raw, lsb) == ((0x7FFF if name == "Pmean" else 0xFFFF), 0xFF00)


def test_a_stuck_chip_is_reported_with_the_word_it_answers() -> None:
    """FuncEn and CalStart reading the same word (re-read as well) is a chip stuck at that
    word: ChipStuckError names it, "every register reads 0x1234: chip stuck"."""
    from meter.chip import registers as regs
    from meter.chip.calibration import Calibration
    from meter.chip.errors import ChipStuckError
    from meter.chip.protocol import Protocol

    bus = _Bus({regs.FUNC_EN: 0x1234, regs.CAL_START: 0x1234})
    proto = Protocol(bus.read_word, bus.write_word, Calibration.default(1e8), lambda: 0, 10**9,
                     ())
    with pytest.raises(ChipStuckError) as exc:
        proto.classify(0x1234, 0x1234, 0, 0, 0)
    assert str(exc.value).startswith("every register reads 0x1234: chip stuck")
    assert len(str(exc.value)) < 200


def test_an_lgain_of_exactly_minus_50_percent_is_accepted() -> None:
    """AN §3.2.5.1 (docs/atm90e26.md §6): Lgain corrects −50 %…+50 %, LRATIO·2^15 as two's
    complement. A chip metering double (ε = +100 %) needs LRATIO = −ε/(1 + ε) = −0.5, the
    bottom of the range: −16384 = C000H. One step further is refused."""
    from meter.chip.calibration import CalibrationError, lgain_from_error

    assert lgain_from_error(1.0) == 0xC000
    with pytest.raises(CalibrationError, match="-50 %"):
        lgain_from_error(1.0 + 1e-3)  # LRATIO −0.50025: −16392


@pytest.mark.parametrize("pf", [0.5, -0.5])
def test_register_steps_widen_the_tolerance_by_u_and_i_times_1_when_smean_was_read(
        pf: float) -> None:
    """docs/atm90e26.md §7: the steps of Urms and Irms widen the tolerance by
    (|U|·ΔI + |I|·ΔU)·max(|PF|, 1 if Smean was read else 0). At 230 V, 10 A, |PF| 0.5, ΔU
    0.005 V and ΔI 0.005 A that is 1.2 W with Smean read and 0.6 W without; the base
    tolerance is 1 % of U·I + 0.05 W = 23.05 W. A power off by the tolerance ∓ 0.2 W passes /
    is refused in each case."""
    from meter.chip.plausibility import check_measurements

    u, i = 230.0, 10.0
    quanta = {"Urms": 0.005, "Irms": 0.005}
    for smean, widen in ((u * i, 1.2), (None, 0.6)):
        tol = 0.01 * u * i + 0.05 + widen
        for off, ok in ((tol - 0.2, True), (tol + 0.2, False)):
            r = _reading(u, i, pf, off)
            if smean is not None:
                r["Smean"] = smean
            assert (check_measurements(r, _limits(), quanta) == []) is ok, (smean, off)


class _GarbledBus(_Bus):
    """A `_Bus` whose reads listed in `garbled` (their count) reach the chip (LastData gets
    the word) but come back garbled on MISO."""

    def __init__(self, words: dict[int, int], garbled: dict[int, int]) -> None:
        super().__init__(words)
        self.garbled = dict(garbled)

    def read_word(self, address: int) -> int:
        word = super().read_word(address)
        if self.garbled.get(address, 0) > 0:
            self.garbled[address] -= 1
            return word ^ 0x0100
        return word


def test_a_read_clear_word_recovered_from_lastdata_counts_one_recovery() -> None:
    """A read-clear read that reached the chip but came back garbled is never re-read: its
    word is LastData's once LastData settles (application note §4.3; docs/atm90e26.md §8),
    and that recovery counts once in `stats["lastdata_recoveries"]`."""
    from meter.chip import registers as regs
    from meter.chip.access import VerifiedAccess

    at_energy = regs.address("ATenergy")
    bus = _GarbledBus({regs.CAL_START: 0x5678, at_energy: 123}, garbled={at_energy: 1})
    acc = VerifiedAccess(bus.read_word, bus.write_word, lambda: 7, retries=3)
    assert acc.read_clear(at_energy) == 123
    assert acc.read_clear_other == 123 ^ 0x0100
    assert acc.stats["lastdata_recoveries"] == 1 and acc.stats["read_retries"] == 0


class _EnergyChip(_ChipStub):
    """A `_ChipStub` that re-reads ATenergy: each read-clear 1 ms after the last returns the
    next of `rereads`. 0.36 J/count (10⁶ imp/kWh); limits of 230 V, Ib 1 A (`_limits`)."""

    def __init__(self, rereads: list[int]) -> None:
        from types import SimpleNamespace

        super().__init__()
        self.calibration = SimpleNamespace(joules_per_count=lambda: 0.36)
        self.limits = _limits()
        self.stats = {"energy_misreads": 0, "energy_rereads": 0}
        self.disagreements = 0
        self.rereads = list(rereads)

    def read_clear(self, address: int) -> int:
        from meter.chip import registers as regs

        assert address == regs.AT_ENERGY
        self.t_read_clear += 1_000_000
        return self.rereads.pop(0)


def _account(chip: _EnergyChip) -> Any:
    """An account whose last ATenergy read was at 5 s, at 36 W; this read-clear at 15 s."""
    from meter.chip.energy_account import EnergyAccount

    acc = EnergyAccount(chip)
    acc.t_energy = 5 * 10**9
    acc.last_power = 36.0
    chip.t_read_clear = 15 * 10**9
    return acc


def test_a_word_the_re_read_shows_was_not_atenergys_counts_one_energy_misread() -> None:
    """36 W for 10 s at 0.36 J/count: 1000 counts expected, range [968, 1032]. A read
    redirected to EnStatus returns 0800H = 2048 (within the §7 bound, outside the range):
    re-read, the register still holds 1000, so the first word was not ATenergy's
    (docs/atm90e26.md §8): 1000 counted, one re-read and one energy misread in `stats`."""
    chip = _EnergyChip([1000])
    acc = _account(chip)
    assert acc.checked_energy(0x0800, 15 * 10**9, 36.0, None) == 1000
    assert chip.stats == {"energy_misreads": 1, "energy_rereads": 1}
    assert chip.events and chip.events[-1][0] == "misread"


def test_a_word_above_the_energy_bound_whose_re_read_finds_nothing_is_discarded() -> None:
    """docs/atm90e26.md §7: at 36 W both ends, 10 s, 0.36 J/count and a floor of 11.5 W, the
    bound is (4·36 + 11.5)·10/0.36 + 2 = 4321.4 counts. 4400 counts lie above it (though
    within what any load of the channel's ranges allows): re-read, the register holds next to
    nothing (1), so 4400 is not believable: discarded, the 1 counted, the interval unmetered."""
    chip = _EnergyChip([1])
    acc = _account(chip)
    assert acc.checked_energy(4400, 15 * 10**9, 36.0, None) == 1
    assert chip.stats["energy_misreads"] == 1 and chip.stats["energy_rereads"] == 0
    assert [k for k, _ in chip.events] == ["implausible"]
    assert acc.unmetered and acc.unmetered[0][:2] == (5 * 10**9, 15 * 10**9)


def test_a_reading_without_a_trusted_power_checks_its_counts_against_the_power_before() -> None:
    """No trusted Pmean in this reading (None): the bound is what any load in the channel's
    ranges allows, and the counts are checked against the power before (36 W over 10 s:
    1000 counts, range [968, 1032]): 1000 counted as read, nothing re-read."""
    chip = _EnergyChip([])
    acc = _account(chip)
    assert acc.checked_energy(1000, 15 * 10**9, None, None) == 1000
    assert chip.stats == {"energy_misreads": 0, "energy_rereads": 0} and chip.events == []


@pytest.mark.parametrize("again", [968, 1032])
def test_a_settled_reread_at_either_end_of_the_range_is_taken(again: int) -> None:
    """The range of 36 W over the 10 s window at 0.36 J/count is [968, 1032], both ends
    included (energy_window: a count outside it is re-read). A re-read of 968 or 1032 lies
    within: it is taken, not the word LastData held (1000)."""
    from meter.chip.energy_account import EnergyAccount

    chip = _ChipStub()
    chip.t_read_clear = 15 * 10**9
    chip.read_clear_other = 1000
    acc = EnergyAccount(chip)
    acc.t_energy = 5 * 10**9
    assert acc._settled_reread(again, 36.0, 36.0, 0.36) == again
