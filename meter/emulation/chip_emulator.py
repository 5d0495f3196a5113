"""A register-level ATM90E26, fed by a power model: the embedded default, not a test mock.

`EmulatedChip` behaves the way docs/atm90e26.md describes the chip:

- registers: power-on reset values, soft reset (789AH), read-clear energy and SysStatus,
  LastData (updated by complete reads and accepted writes; not by partial frames, failed or
  discarded writes), invalid addresses (read 0, write dropped), the CalStart/AdjStart state
  machine (5678H resets the block and runs unchecked, 8765H checks CS1/CS2, 6886H stops,
  anything else stops and flags CalErr/AdjErr), CS1/CS2 reading back the chip's own
  computation, metering frozen on a CS1 error while measurements go on, measurements frozen
  on a CS2 error, the LSB latch (low 16 bits of the last RMS/power register read), the
  24-cycle SPI frame rule (fewer: partial read, no write; more: read completes, write refused),
  small-power mode.
- physics: measurement registers refresh together every `refresh_period_s` (one metering
  cycle) from the power model, each averaged over that cycle: Pmean is the exact mean power,
  Irms the RMS current (64 slices), Smean = Urms·Irms and PowerF = P/S as the chip defines
  them, so a load that changes within a cycle reads as it would; scaled by the gains written
  to the chip and by the front end's own errors (`errors`), so calibration has something to
  correct. Energy accumulates from the model's exact integral at the meter constant set by
  the PL constant, in 0.1-pulse register steps, so energy read from the registers over a run
  equals the model's integral to one register LSB.
- faults: SPI bit errors (MISO and/or MOSI), partial frames, a reset mid-run (now or at a
  scheduled time), a corrupted calibration register (checksum error), a stuck chip (answers
  one word to everything, ignores writes) and an absent one (MISO floats). UART framing and
  noise live in `meter.emulation.uart_emulator`.

Modelling choices where the datasheet is silent (stated so nobody takes them for chip facts):
the measurement refresh period (a parameter, default 0.2 s); a partial read neither clears a
read-clear register nor updates LastData; CalErr/AdjErr are level bits (they re-assert after
a read while the error lasts; `status_errors_clear_on_read` models the other reading of the
datasheet) and a running 8765H check notices a register corrupted later;
current offsets add linearly to Irms; Uoffset is stored but has no effect; one Lphi LSB
shifts the metering phase by 1/(3763.74·√3) rad (derived from the AN's linear formula).
"""

from __future__ import annotations

import math
import random
from typing import Literal

from epi.formats.json_types import JSON
from meter.chip import calibration as calib
from meter.chip import registers as regs
from meter.chip.frames import spi_parse_mosi
from meter.clock import Clock
from meter.emulation.power_models import PowerModel
from meter.emulation.register_file import COVERED, RegisterFile

NS_PER_S = 1_000_000_000
RMS_SAMPLES = 64  # slices of a metering cycle the emulated Irms is the RMS over
#: a CalStart/AdjStart block's state: power-on, calibrating (5678H), checked (8765H) or failed
CheckState = Literal["off", "run", "checked", "error"]

_ERROR_KEYS = (
    "voltage",
    "current_l",
    "current_n",
    "energy_l",
    "phase_l_rad",
    "current_offset_a",
    "power_offset_w",
    "reactive_offset_var",
)

_ENERGY_ADDRESSES = (0x40, 0x41, 0x42, 0x43, 0x44, 0x45)


def _power_factor_and_angle(p_w: float, q_var: float, s_va: float) -> tuple[float, float]:
    """PowerF (P/S, clamped to ±1) and Pangle (degrees) as the chip defines them (DS §5.5)."""
    pf = max(min(p_w / s_va, 1.0), -1.0) if s_va > 0 else 0.0
    return pf, math.degrees(math.atan2(q_var, p_w)) if (p_w or q_var) else 0.0


class EmulatedChip:
    """One emulated ATM90E26 on a power model.

    Args:
        power_model: a `power_models` model (voltage, current, PF, frequency, energy).
        clock: `SystemClock` or `SimulatedClock`; the chip's time.
        meter_constant_imp_per_kwh: the meter constant the front end was designed for: the
            chip meters exactly this when its PL constant is `calibration.pl_constant(...)`
            for this front end (as if a bench calibration had absorbed the PL rounding).
        refresh_period_s: how often measurement registers (Urms .. Smean) refresh.
        frontend: analog front end (`calibration.EMULATED_FRONTEND` keys).
        errors: front-end errors a calibration must remove: `voltage`, `current_l`,
            `current_n`, `energy_l` (fractions: the chip at reset gains reads (1 + e)·true),
            `phase_l_rad`, `current_offset_a`, `power_offset_w`, `reactive_offset_var`.
        n_line: whether the N line carries the load current (else N-line registers read 0).
        ln_mode: the MMD1:MMD0 pins (EnStatus bits 1:0).
        seed: seed of the fault-injection random generator.
        ct_reversed: the CT clamped the wrong way round: the chip sees the load's power with
            its sign flipped (Pmean < 0, energy in ANenergy instead of APenergy).
        status_errors_clear_on_read: SysStatus CalErr/AdjErr read as set once per error and
            then as clear while the error (and the stopped block) lasts — what a real chip may
            do, since the datasheet calls SysStatus read-clear. Default False: level bits.
    """

    def __init__(
        self,
        power_model: PowerModel,
        clock: Clock,
        *,
        meter_constant_imp_per_kwh: float = 1_000_000.0,
        refresh_period_s: float = 0.2,
        frontend: dict[str, float] | None = None,
        errors: dict[str, float] | None = None,
        n_line: bool = False,
        ln_mode: int = 0,
        seed: int = 0,
        status_errors_clear_on_read: bool = False,
        ct_reversed: bool = False,
    ) -> None:
        self.model = power_model
        self.clock = clock
        self.meter_constant_imp_per_kwh = float(meter_constant_imp_per_kwh)
        self.refresh_ns = max(int(refresh_period_s * NS_PER_S), 1)
        self.frontend = dict(frontend) if frontend else dict(calib.EMULATED_FRONTEND)
        self.errors = dict.fromkeys(_ERROR_KEYS, 0.0)
        for key, value in (errors or {}).items():
            if key not in self.errors:
                raise ValueError(f"unknown front-end error {key!r} (known: {_ERROR_KEYS})")
            self.errors[key] = float(value)
        self.n_line = bool(n_line)
        self.ln_mode = ln_mode & regs.EN_LN_MODE
        self.status_errors_clear_on_read = bool(status_errors_clear_on_read)
        self.ct_reversed = bool(ct_reversed)
        fe = self.frontend
        self._design_gain = calib.l_pga_gain(regs.BY_NAME["MMode"].reset)
        self.design_pl = calib.pl_constant(
            self.meter_constant_imp_per_kwh,
            fe["un_v"],
            fe["ib_a"],
            self._design_gain,
            fe["v_l_mv"],
            fe["v_u_mv"],
        )
        self._rng = random.Random(seed)
        # faults
        self.miso_bit_error_rate = 0.0
        self.mosi_bit_error_rate = 0.0
        self.partial_frame_rate = 0.0
        self.absent = False
        self.absent_level = 0xFF
        self.stuck_word: int | None = None
        self._scheduled_resets: list[int] = []
        self.stats = {
            "frames": 0,
            "reads": 0,
            "writes": 0,
            "writes_dropped": 0,
            "partial_frames": 0,
            "bit_errors": 0,
            "resets": 0,
            "soft_resets": 0,
        }
        self.power_on()

    # ---- state ----------------------------------------------------------------------------
    def power_on(self) -> None:
        """Power-on / reset: every register at its reset value, metering and measurement off."""
        now = self.clock.monotonic_ns()
        self._regs = RegisterFile((r.address, r.reset) for r in regs.REGISTERS)
        self._cs_written = {regs.CS1: 0x0000, regs.CS2: 0x0000}
        self.cal_state: CheckState = "off"
        self.adj_state: CheckState = "off"
        self.last_data = 0x0000
        self.lsb_latch = 0x0000
        self._latched_status = 0
        self._levels_read = 0  # error levels a read already reported (clear-on-read mode)
        self._acc_counts = dict.fromkeys(_ENERGY_ADDRESSES, 0.0)
        self._t_energy = now
        self._t_power_on = now
        self._noload_p = True
        self._noload_q = True
        self._rev_p = False
        self._meas_cache: tuple | None = None
        self._frozen: dict[str, float] | None = None
        self._version = 0

    def reset_now(self) -> None:
        """Fault: the chip resets (brown-out, glitch on RESET): everything back to defaults."""
        self._advance()
        self.stats["resets"] += 1
        self.power_on()

    def schedule_reset(self, at_mono_ns: int) -> None:
        """Fault: reset the chip when the clock passes `at_mono_ns`."""
        self._scheduled_resets.append(int(at_mono_ns))
        self._scheduled_resets.sort()

    def corrupt_register(self, name: str, xor_mask: int = 0x0001) -> None:
        """Fault: flip bits of a calibration register behind the checksum's back (an upset)."""
        address = regs.address(name)
        self._advance()
        self._latch_measurements()
        self._regs[address] ^= xor_mask & 0xFFFF
        self._version += 1
        self._check_blocks()

    def set_stuck(self, word: int | None = 0x1234) -> None:
        """Fault: the chip answers `word` to every read and ignores writes (None: recover)."""
        self.stuck_word = None if word is None else word & 0xFFFF

    def set_absent(self, absent: bool = True, level: int = 0xFF) -> None:
        """Fault: the chip is unplugged; MISO floats to `level` (0xFF pull-up, 0x00 pull-down).

        Coming back (`absent=False`) is a power-on: registers at reset values.
        """
        if self.absent and not absent:
            self.power_on()
        self.absent = bool(absent)
        self.absent_level = level & 0xFF

    def set_spi_faults(
        self,
        *,
        bit_error_rate: float | None = None,
        partial_frame_rate: float | None = None,
        mosi_bit_error_rate: float | None = None,
        seed: int | None = None,
    ) -> None:
        """Fault: flip MISO (chip→host) and/or MOSI (host→chip) bits with the given per-bit
        probability, and cut a fraction of frames short (the chip sees fewer than 24 clocks).
        Arguments left out keep their current setting; 0 turns a fault off.

        MOSI errors can turn a read into a write or change its address; the chip protocol has
        no address echo, so LastData cannot catch a redirected read (the driver does catch
        the configuration changes such a frame causes).
        """
        if bit_error_rate is not None:
            self.miso_bit_error_rate = float(bit_error_rate)
        if mosi_bit_error_rate is not None:
            self.mosi_bit_error_rate = float(mosi_bit_error_rate)
        if partial_frame_rate is not None:
            self.partial_frame_rate = float(partial_frame_rate)
        if seed is not None:
            self._rng.seed(seed)

    # ---- time and physics -----------------------------------------------------------------
    def now_ns(self) -> int:
        return self.clock.monotonic_ns()

    def _advance(self) -> None:
        """Bring energy up to now, applying any scheduled reset on the way.

        Runs on every register access, mostly with the clock where the last one left it: that
        case costs one clock read and one comparison.
        """
        now = self.clock.monotonic_ns()
        while self._scheduled_resets and self._scheduled_resets[0] <= now:
            t_reset = self._scheduled_resets.pop(0)
            self._integrate(max(t_reset, self._t_energy))
            self.stats["resets"] += 1
            self.power_on()
            self._t_energy = self._t_power_on = max(t_reset, 0)
        if now > self._t_energy:  # `_integrate` does nothing otherwise
            self._integrate(now)

    def _metering_gain(self) -> float:
        """Register counts per joule of true active energy, as the chip is now configured."""
        pl = calib.pl_from_words(self._regs[0x21], self._regs[0x22])
        if pl == 0:
            return 0.0
        gain = calib.l_pga_gain(self._regs[0x2B]) / self._design_gain
        counts_per_j = self.meter_constant_imp_per_kwh / calib.JOULES_PER_KWH * 10.0
        return (
            counts_per_j
            * (self.design_pl / pl)
            * gain
            * (1.0 + self.errors["energy_l"])
            * (1.0 + calib.lgain_ratio(self._regs[0x23]))
        )

    def _threshold_w(self, address: int) -> float:
        fe = self.frontend
        return calib.threshold_power_w(
            self._regs[address], fe["un_v"], fe["ib_a"], self._design_gain, fe["v_l_mv"],
            fe["v_u_mv"],
        )

    def _integrate(self, t_ns: int) -> None:
        t0 = self._t_energy
        if t_ns <= t0:
            return
        self._t_energy = t_ns
        if self.cal_state not in ("run", "checked"):
            return
        fwd_j, rev_j = self.model.energy_parts_j(t0, t_ns)
        if self.ct_reversed:  # the current, hence the power, is seen with its sign flipped
            fwd_j, rev_j = rev_j, fwd_j
        dt_s = (t_ns - t0) / NS_PER_S
        mean_abs_w = (fwd_j + rev_j) / dt_s
        t_mid = (t0 + t_ns) // 2
        pf = min(max(self.model.power_factor(t_mid), 1e-6), 1.0)
        theta = math.acos(pf)
        phase = self.errors["phase_l_rad"] + calib.lphi_correction_rad(self._regs[0x24])
        factor = self._metering_gain()
        if phase:
            factor *= math.cos(theta + phase) / pf
        start_w = self._threshold_w(0x27)
        nol_w = self._threshold_w(0x28) if self._regs[0x28] else start_w
        self._noload_p = mean_abs_w < nol_w
        self._noload_q = mean_abs_w * math.tan(theta) < self._threshold_w(0x29)
        if mean_abs_w < start_w or factor <= 0:
            return
        acc = self._acc_counts
        fwd, rev = fwd_j * factor, rev_j * factor
        acc[0x40] += fwd
        acc[0x41] += rev
        acc[0x42] += fwd + rev
        if not self._noload_q:
            tan = math.tan(theta)
            acc[0x43] += fwd * tan
            acc[0x44] += rev * tan
            acc[0x45] += (fwd + rev) * tan
        if fwd != rev:
            rev_now = rev > fwd
            rev_p_enabled = self._regs[regs.FUNC_EN] & regs.field("FuncEn", "RevPEn").mask
            if rev_now != self._rev_p and rev_p_enabled:
                self._latched_status |= regs.REV_P_CHG
            self._rev_p = rev_now

    def _measurements(self) -> dict[str, float]:
        """Values of the measurement registers now (refreshed every `refresh_period_s`)."""
        if self.adj_state == "error":
            return self._frozen or {}
        if self.adj_state == "off":
            return {}
        k = (self.now_ns() - self._t_power_on) // self.refresh_ns
        key = (k, self._version)
        if self._meas_cache is not None and self._meas_cache[0] == key:
            return self._meas_cache[1]
        values = self._compute_measurements(k) if k >= 1 else {}
        self._meas_cache = (key, values)
        return values

    def _compute_measurements(self, k: int) -> dict[str, float]:
        m = self.model
        t1 = self._t_power_on + k * self.refresh_ns
        t0 = t1 - self.refresh_ns
        p_true = m.energy_j(t0, t1) / (self.refresh_ns / NS_PER_S)
        if self.ct_reversed:
            p_true = -p_true
        v_true = m.voltage_v(t1)
        pf_true = min(max(m.power_factor(t1), 1e-6), 1.0)
        freq = m.frequency_hz(t1)
        i_true = self._rms_power_w(t0, t1) / (v_true * pf_true)
        q_true = abs(p_true) * math.tan(math.acos(pf_true))
        r = self._regs
        e = self.errors
        pga = calib.l_pga_gain(r[0x2B]) / self._design_gain
        ugain, igain_l, igain_n = r[0x31], r[0x32], r[0x33]
        ku = (1.0 + e["voltage"]) * ugain / calib.DEFAULT_UGAIN
        ki = (1.0 + e["current_l"]) * igain_l / calib.DEFAULT_IGAIN_L * pga
        u = v_true * ku
        i = (i_true + e["current_offset_a"]) * ki + calib.current_offset_correction_a(
            r[0x35], igain_l
        )
        i = abs(i)
        w_per_sp = calib.small_power_w_per_lsb(ugain, igain_l)
        p = (p_true + e["power_offset_w"]) * ku * ki + regs.to_signed16(r[0x37]) * w_per_sp
        q = (q_true + e["reactive_offset_var"]) * ku * ki + regs.to_signed16(r[0x38]) * w_per_sp
        s = u * i
        pf, angle = _power_factor_and_angle(p, q, s)
        out = {"Urms": u, "Irms": i, "Freq": freq, "Smean": s, "PowerF": pf, "Pangle": angle}
        if r[regs.SMALL_P_MOD] == regs.SMALL_POWER_CODE:
            out["Pmean"], out["Qmean"] = p / w_per_sp, q / w_per_sp
        else:
            out["Pmean"], out["Qmean"] = p, q
        if self.n_line:
            kn = (1.0 + e["current_n"]) * igain_n / calib.DEFAULT_IGAIN_N
            i_n = abs(i_true * kn + calib.current_offset_correction_a(r[0x36], igain_n))
            p_n = p_true * ku * kn + regs.to_signed16(r[0x39]) * w_per_sp
            q_n = q_true * ku * kn + regs.to_signed16(r[0x3A]) * w_per_sp
            s_n = u * i_n
            pf_n, angle_n = _power_factor_and_angle(p_n, q_n, s_n)
            out.update({"Irms2": i_n, "Pmean2": p_n, "Qmean2": q_n, "Smean2": s_n,
                        "PowerF2": pf_n, "Pangle2": angle_n})
        return out

    def _rms_power_w(self, t0: int, t1: int) -> float:
        """RMS of the model's power over one metering cycle (midpoints of `RMS_SAMPLES`
        slices): the chip's Irms is an RMS over its cycle, so a load that changes within it
        reads a larger current than the mean power gives, and PowerF = P / (U·Irms) smaller."""
        m, n = self.model, RMS_SAMPLES
        step = (t1 - t0) / n
        total = 0.0
        for j in range(n):
            p = m.power_w(t0 + int((j + 0.5) * step))
            total += p * p
        return math.sqrt(total / n)

    def _measurement_word(self, register: regs.Register) -> tuple[int, int]:
        """(register word, LSB latch word) for a measurement register."""
        value = self._measurements().get(register.name, 0.0)
        if register.extended:
            return regs.split_extended(value, register)
        scaled = regs.round_half_away(value / register.scale)
        if register.codec == regs.SM16:
            scaled = max(min(scaled, 0x7FFF), -0x7FFF)
            return regs.from_sign_magnitude(scaled), self.lsb_latch
        return max(min(scaled, 0xFFFF), 0), self.lsb_latch

    def _status_levels(self) -> int:
        bits = 0
        if self.cal_state == "error":
            bits |= regs.CAL_ERR_MASK
        if self.adj_state == "error":
            bits |= regs.ADJ_ERR_MASK
        return bits

    def _computed_cs(self, address: int) -> int:
        """The chip's own CS1/CS2 over its block now (kept by the register file until a
        covered register changes, since every access consults it)."""
        return self._regs.computed_cs(address)

    def _check_blocks(self) -> None:
        """A running 8765H check notices a block that no longer matches its checksum."""
        written = self._cs_written
        if self.cal_state == "checked" and self._computed_cs(regs.CS1) != written[regs.CS1]:
            self.cal_state = "error"
        if self.adj_state == "checked" and self._computed_cs(regs.CS2) != written[regs.CS2]:
            self._frozen = dict(self._meas_cache[1]) if self._meas_cache else {}
            self.adj_state = "error"

    def _latch_measurements(self) -> None:
        """Bring the measurement cache up to now before a register change can freeze it."""
        if self.adj_state == "checked":
            self._measurements()

    # ---- register access (the chip's core; buses call these) --------------------------------
    def peek(self, address: int) -> int:
        """A register's word without side effects (no clearing, no LastData, no latch)."""
        self._advance()
        return self._word(address, side_effects=False)

    def _word(self, address: int, *, side_effects: bool) -> int:
        r = regs.BY_ADDRESS.get(address)
        if r is None or r.access == regs.W:
            return 0x0000
        if address == regs.SYS_STATUS:
            levels = self._status_levels()
            if self.status_errors_clear_on_read:
                levels &= ~self._levels_read  # reported once per onset, then read as clear
            value = self._latched_status | levels
            if side_effects:
                self._latched_status = 0
                self._levels_read = self._status_levels()
            return value
        if address == regs.LAST_DATA:
            return self.last_data
        if address == regs.LSB:
            return self.lsb_latch
        if address in (regs.CS1, regs.CS2):
            return self._computed_cs(address)
        if address in _ENERGY_ADDRESSES:
            counts = int(self._acc_counts[address])
            if side_effects:
                self._acc_counts[address] -= counts
            return counts % regs.ENERGY_WRAP
        if address == regs.EN_STATUS:
            bits = self.ln_mode
            if self._noload_q:
                bits |= regs.EN_Q_NOLOAD
            if self._noload_p:
                bits |= regs.EN_P_NOLOAD
            if self._rev_p:
                bits |= regs.EN_REV_P
            if self._regs[regs.address("MMode")] & regs.MMODE_LNSEL.mask:
                bits |= regs.EN_L_LINE
            return bits
        if r.block == regs.MEASUREMENT:
            word, lsb = self._measurement_word(r)
            if side_effects and r.extended:
                self.lsb_latch = lsb
            return word
        return self._regs[address]

    def read_register(self, address: int) -> int:
        """A complete read: returns the word; clears read-clear registers; updates LastData."""
        self._advance()
        self._check_blocks()
        self.stats["reads"] += 1
        value = self._word(address & 0x7F, side_effects=True)
        self.last_data = value
        return value

    def write_register(self, address: int, value: int) -> bool:
        """A complete write; False if the chip discarded it (read-only or invalid address)."""
        self._advance()
        address &= 0x7F
        value &= 0xFFFF
        r = regs.BY_ADDRESS.get(address)
        if r is None or not r.writable:
            self.stats["writes_dropped"] += 1
            return False
        self.stats["writes"] += 1
        self.last_data = value
        self._latch_measurements()
        if address == regs.SOFT_RESET:
            if value == regs.SOFT_RESET_CODE:
                self.stats["soft_resets"] += 1
                self.power_on()
            return True
        if address in (regs.CAL_START, regs.ADJ_START):
            self._regs[address] = value
            self._start_word(address, value)
        elif address in (regs.CS1, regs.CS2):
            self._cs_written[address] = value
        else:
            self._regs[address] = value
        self._version += 1
        self._check_blocks()
        return True

    def _start_word(self, address: int, value: int) -> None:
        metering = address == regs.CAL_START
        cs_address = regs.CS1 if metering else regs.CS2
        covered = COVERED[cs_address]
        state: CheckState
        if value == regs.START_CODE:
            for a in covered:
                self._regs[a] = regs.BY_ADDRESS[a].reset
            state = "run"
        elif value == regs.CHECK_CODE:
            ok = self._computed_cs(cs_address) == self._cs_written[cs_address]
            state = "checked" if ok else "error"
        elif value == regs.POWER_ON_CODE:
            state = "off"
        else:
            state = "error"
        if metering:
            self._integrate(self.now_ns())
            self.cal_state = state
        else:
            if state == "error" and self.adj_state != "error":
                self._frozen = dict(self._measurements())
            self.adj_state = state

    # ---- SPI front end --------------------------------------------------------------------
    def _flip(self, data: bytearray, rate: float) -> None:
        if rate <= 0:
            return
        for i in range(len(data)):
            for bit in range(8):
                if self._rng.random() < rate:
                    data[i] ^= 1 << bit
                    self.stats["bit_errors"] += 1

    def spi_transfer(self, mosi: bytes, sclk_cycles: int | None = None) -> bytes:
        """One CS-low period: `mosi` bytes in, MISO bytes out, under the 24-cycle rule.

        `sclk_cycles` is how many clocks the chip saw (default 8 per byte); fewer than 24
        make a partial frame (a read returns the bits shifted so far, LastData unchanged; a
        write is dropped); more than 24 complete a read but refuse a write.
        """
        n = len(mosi)
        self.stats["frames"] += 1
        if self.absent:
            return bytes([self.absent_level] * n)
        cycles = 8 * n if sclk_cycles is None else int(sclk_cycles)
        if self.partial_frame_rate and self._rng.random() < self.partial_frame_rate:
            cycles = self._rng.randint(1, 23)
        # Copy (and pad) the frame only where MOSI errors may flip it or it is not 3 bytes:
        # the sampler's millions of clean frames take no copies and no calls.
        frame: bytes | bytearray = mosi
        if n != 3 or self.mosi_bit_error_rate > 0:
            copy = bytearray(mosi[:3]) + bytearray(max(0, 3 - n))
            self._flip(copy, self.mosi_bit_error_rate)
            frame = copy
        if cycles < 8:
            self.stats["partial_frames"] += 1
            return bytes([0xFF] * n)  # SDO is high impedance outside the data phase
        is_read, address, value = spi_parse_mosi(frame)
        if self.stuck_word is not None:
            word = self.stuck_word if is_read else 0xFFFF
        elif is_read:
            if cycles < 24:
                self.stats["partial_frames"] += 1
                word = self.peek(address)
            else:
                word = self.read_register(address)
        else:
            if cycles == 24:
                self.write_register(address, value)
            else:
                self.stats["partial_frames"] += 1
                self.stats["writes_dropped"] += 1
            word = 0xFFFF
        if cycles < 24:  # bits the chip never shifted out read as the idle level
            word = (word | ((1 << (16 - max(cycles - 8, 0))) - 1)) & 0xFFFF
        # byte 0 is high impedance (0xFF), then the word; bytes past the 24th clock read 0
        out = bytearray((0xFF, word >> 8, word & 0xFF)[:n])
        if n > 3:
            out += bytes(n - 3)
        if self.miso_bit_error_rate > 0:
            self._flip(out, self.miso_bit_error_rate)
        return bytes(out)

    # ---- introspection for tests and benchmarks -------------------------------------------
    def true_energy_j(self, t0_mono_ns: int, t1_mono_ns: int) -> float:
        """The model's exact active energy between two times (ground truth)."""
        return self.model.energy_j(t0_mono_ns, t1_mono_ns)

    def pending_counts(self, address: int = regs.AT_ENERGY) -> float:
        """Energy counts accumulated but not yet read (including the sub-LSB remainder)."""
        self._advance()
        return self._acc_counts[address]

    def describe(self) -> dict[str, JSON]:
        return {
            "kind": "atm90e26-emulator",
            "meter_constant_imp_per_kwh": self.meter_constant_imp_per_kwh,
            "refresh_period_s": self.refresh_ns / NS_PER_S,
            "frontend": dict(self.frontend),
            "errors": {k: v for k, v in self.errors.items() if v},
            "power_model": self.model.describe(),
            "status_errors_clear_on_read": self.status_errors_clear_on_read,
        }
