"""ATM90E26 calibration math and the per-channel calibration record.

Formulas from the application note §3.2 as collected in docs/atm90e26.md §6:
PL constant from the meter constant and the analog front end, Lgain/Lphi from a measured
energy error, Ugain/IgainL/IgainN from reference readings, current and power offsets,
start/no-load thresholds, and energy counts -> joules for the configured meter constant.
Results are rounded to the nearest integer, which reproduces every worked example of the
application note (plain truncation misses two of them).

`Calibration` holds one channel's register values (what the driver writes at start-up) with
its meter constant and front-end description, and converts to/from a plain dict for the
calibration file (JSON).

Pure, no I/O, MicroPython subset: the board firmware reuses this module.
"""

from meter.chip import registers as regs
from meter.chip.checksum import cs1, cs2
from meter.chip.errors import CalibrationError

PL_NUMERATOR = 838860800  # AN §3.2.2
THRESHOLD_FACTOR = 93.2067556  # AN §3.2.3: PStartTh/PNolTh per (G_L · V_L · V_U · K)
LPHI_PER_ERROR = 3763.74  # AN §3.2.4.2: Lphi = error at PF 0.5L · 3763.74
JOULES_PER_KWH = 3600000.0
DEFAULT_UGAIN = 0x6720  # 26400
DEFAULT_IGAIN_L = 0x7A13  # 31251
DEFAULT_IGAIN_N = 0x7530  # 30000
SMALL_POWER_EXPONENT = 22  # AN: normal = small-power · Ugain · Igain / (100000 · 2^22); DS: 2^42

CALIBRATION_FORMAT = "epi-atm90e26-calibration"
CALIBRATION_FORMAT_VERSION = 1

CONFIG_NAMES = ("FuncEn", "SagTh")
METERING_NAMES = tuple(regs.BY_ADDRESS[a].name for a in regs.METERING_ADDRESSES)
MEASUREMENT_NAMES = tuple(regs.BY_ADDRESS[a].name for a in regs.MEASUREMENT_CAL_ADDRESSES)
REGISTER_NAMES = CONFIG_NAMES + METERING_NAMES + MEASUREMENT_NAMES
FRONTEND_KEYS = ("un_v", "ib_a", "v_l_mv", "v_u_mv")

# The epi emulator's analog front end: 230 V mains, 1 A basic current, a 2000:1 CT into a
# 100 Ω burden (50 mV at Ib) on the L channel at PGA ×1, 250 mV at the voltage input at Un.
EMULATED_FRONTEND = {"un_v": 230.0, "ib_a": 1.0, "v_l_mv": 50.0, "v_u_mv": 250.0}
DEFAULT_FUNC_EN = 0x0030  # sag detection on WarnOut; direction-change IRQs off
DEFAULT_START_FRACTION = 0.002  # metering starts at 0.2 % of Ib (0.46 W at 230 V, 1 A)


_INF = float("inf")


def round_half_away(x):
    return regs.round_half_away(x)


# ---- metering (energy) ----------------------------------------------------------------------
def l_pga_gain(mmode):
    """L-line PGA gain from MMode's Lgain field: 1xx = 1, 000 = 4, 001 = 8, 010 = 16, 011 = 24."""
    code = regs.MMODE_LGAIN.get(mmode)
    if code & 0x4:
        return 1
    return (4, 8, 16, 24)[code]


def pl_constant(meter_constant_imp_per_kwh, un_v, ib_a, l_gain, v_l_mv, v_u_mv):
    """PL_Constant = 838860800 · G_L · V_L · V_U / (MC · Un · Ib), rounded (AN §3.2.2)."""
    if meter_constant_imp_per_kwh <= 0 or un_v <= 0 or ib_a <= 0:
        raise CalibrationError("meter constant, Un and Ib must be > 0")
    pl = round_half_away(
        PL_NUMERATOR * l_gain * v_l_mv * v_u_mv / (meter_constant_imp_per_kwh * un_v * ib_a)
    )
    if pl < 1 or pl > 0xFFFFFFFF:
        raise CalibrationError(f"PL constant {pl} does not fit 32 bits (PLconstH/PLconstL)")
    return pl


def pl_words(pl):
    """(PLconstH, PLconstL) for a 32-bit PL constant."""
    return (pl >> 16) & 0xFFFF, pl & 0xFFFF


def pl_from_words(high, low):
    return (high << 16) | low


def meter_constant_from_pl(pl, un_v, ib_a, l_gain, v_l_mv, v_u_mv):
    """The meter constant (imp/kWh) a PL constant gives for a front end (inverse of above)."""
    return PL_NUMERATOR * l_gain * v_l_mv * v_u_mv / (pl * un_v * ib_a)


def lgain_ratio(word):
    """Metering gain correction of an Lgain/Ngain word: the chip meters (1 + ratio) × energy."""
    return regs.to_signed16(word) / 32768.0


def lgain_from_error(error, lgain_old=0):
    """New Lgain from a measured energy error (measured/true − 1) at PF 1.0, I = Ib.

    AN §3.2.4.2: LRATIO = −ε / (1 + ε), Lgain = LRATIO · 2^15 as two's complement. With a
    non-zero old Lgain the correction compounds: (1 + new) = (1 + old) / (1 + ε).
    Example: ε = −13.78 % from Lgain 0 -> 0x1475.
    """
    if error <= -1.0:
        raise CalibrationError(f"energy error {error:.4f} is not a plausible metering error")
    ratio = (1.0 + lgain_ratio(lgain_old)) / (1.0 + error) - 1.0
    value = round_half_away(ratio * 32768.0)
    if value < -16384 or value > 16383:
        raise CalibrationError(
            f"Lgain would be {ratio * 100:+.2f} %; the chip corrects only -50 %..+50 %"
        )
    return regs.from_signed16(value)


def lphi_from_error(error, lphi_old=0):
    """New Lphi from the energy error measured at PF 0.5 lagging (AN: Lphi = εL · 3763.74).

    Sign-magnitude with a 10-bit magnitude. Example: εL = 0.95 % from Lphi 0 -> 0x0024.
    """
    value = regs.to_sign_magnitude(lphi_old, 10) + round_half_away(error * LPHI_PER_ERROR)
    if value < -1023 or value > 1023:
        raise CalibrationError(f"Lphi {value} does not fit the chip's 10-bit phase correction")
    return regs.from_sign_magnitude(value, 10)


def lphi_correction_rad(word):
    """Phase correction (radians) an Lphi word applies — derived from the AN's linear formula.

    An error ε at PF 0.5 lagging comes from a phase error δ with ε ≈ −√3·δ, and
    Lphi = ε · 3763.74 must cancel it, so one Lphi LSB shifts the phase by 1/(3763.74·√3) rad.
    """
    return regs.to_sign_magnitude(word, 10) / (LPHI_PER_ERROR * 1.7320508075688772)


def start_threshold(l_gain, v_l_mv, v_u_mv, fraction_of_ib):
    """PStartTh / PNolTh / QStartTh / QNolTh = 93.2067556 · G_L · V_L · V_U · K (AN §3.2.3).

    Example: G_L 24, V_L 1 mV, V_U 250 mV, K = 0.4 % -> 0x08BD (the chip default).
    """
    value = round_half_away(THRESHOLD_FACTOR * l_gain * v_l_mv * v_u_mv * fraction_of_ib)
    if value < 0 or value > 0xFFFF:
        raise CalibrationError(f"threshold {value} does not fit 16 bits")
    return value


def threshold_power_w(word, un_v, ib_a, l_gain, v_l_mv, v_u_mv):
    """The power (W at PF 1) a threshold word stands for: K · Un · Ib."""
    fraction = word / (THRESHOLD_FACTOR * l_gain * v_l_mv * v_u_mv)
    return fraction * un_v * ib_a


# ---- measurement ----------------------------------------------------------------------------
def ugain_from_reading(reference_v, measured_v, ugain_old=DEFAULT_UGAIN):
    """Ugain_new = Ugain_old · Un / Vol_mea (AN §3.2.4.3); bit 15 must stay 0.

    Example: 220.024 V reference, 246.01 V read at 26400 -> 0x5C3B.
    """
    if measured_v <= 0:
        raise CalibrationError("the chip reads 0 V: check the voltage input before calibrating")
    value = round_half_away(ugain_old * reference_v / measured_v)
    if value > 0x7FFF:
        raise CalibrationError(
            f"Ugain would be 0x{value:04X}: bit 15 must be 0 (max 0x7FFF). The voltage input "
            f"reads {measured_v / reference_v:.3f} of the reference; scale the divider or "
            f"calibrate at a quarter and multiply in software"
        )
    if value < 1:
        raise CalibrationError(f"Ugain would be {value}: reference voltage too low")
    return value


def igain_from_reading(reference_a, measured_a, igain_old=DEFAULT_IGAIN_L):
    """Igain_new = Igain_old · Ib / Cur_mea (AN §3.2.4.4); 16 bits unsigned.

    Example: 5.008 A reference, 6.744 A read at 31251 -> 0x5AA7.
    """
    if measured_a <= 0:
        raise CalibrationError("the chip reads 0 A: no load current to calibrate against")
    value = round_half_away(igain_old * reference_a / measured_a)
    if value > 0xFFFF:
        raise CalibrationError(
            f"Igain would be 0x{value:X}: more than 16 bits; the CT/burden gives too little signal"
        )
    if value < 1:
        raise CalibrationError(f"Igain would be {value}: reference current too low")
    return value


def current_offset(irms_a, igain, ioffset_old=0):
    """IoffsetL from the Irms read at Un with no current (AN §3.2.4.5).

    Irms (in the register's 1 mA units) · Igain / 2^16 · 2^8, written as two's complement
    (negated); an existing offset compounds. Returns the register word.
    """
    x = irms_a * 1000.0 * igain / 65536.0 * 256.0
    value = regs.to_signed16(ioffset_old) - round_half_away(x)
    if value < -0x8000 or value > 0x7FFF:
        raise CalibrationError(f"current offset {value} does not fit 16 bits: is a load on?")
    return regs.from_signed16(value)


def current_offset_correction_a(ioffset_word, igain):
    """Current (A) an IoffsetL word adds to Irms: the inverse of `current_offset`."""
    return regs.to_signed16(ioffset_word) * 65536.0 / (igain * 256.0) / 1000.0


def small_power_w_per_lsb(ugain, igain):
    """Watts per Pmean LSB in small-power mode: Ugain · Igain / (100000 · 2^22) (AN).

    The datasheet prints 2^42 here; which exponent is right is unverified (reference §4.2).
    """
    return ugain * igain / (100000.0 * (1 << SMALL_POWER_EXPONENT))


def power_offset(mean_small_power_lsb, poffset_old=0):
    """PoffsetL/QoffsetL: the complement of the mean small-power Pmean with no current.

    Example: mean 0xFFCB (-53) -> 0x0035. An existing offset compounds.
    """
    value = regs.to_signed16(poffset_old) - round_half_away(mean_small_power_lsb)
    if value < -0x8000 or value > 0x7FFF:
        raise CalibrationError(f"power offset {value} does not fit 16 bits: is a load on?")
    return regs.from_signed16(value)


# ---- energy ---------------------------------------------------------------------------------
def joules_per_count(meter_constant_imp_per_kwh):
    """Joules per energy-register LSB (0.1 pulse) for a meter constant in imp/kWh."""
    return regs.PULSES_PER_COUNT * JOULES_PER_KWH / meter_constant_imp_per_kwh


def counts_to_joules(counts, meter_constant_imp_per_kwh):
    return counts * joules_per_count(meter_constant_imp_per_kwh)


# ---- the calibration record -----------------------------------------------------------------
def _parse_word(value, where):
    if isinstance(value, bool):
        raise CalibrationError(f"{where}: expected a 16-bit value, got {value!r}")
    if isinstance(value, str):
        text = value.strip().lower()
        try:
            value = int(text, 16) if text.startswith("0x") else int(text)
        except ValueError:
            raise CalibrationError(f"{where}: not a number: {value!r}") from None
    if not isinstance(value, int) or value < 0 or value > 0xFFFF:
        raise CalibrationError(f"{where}: expected 0..0xFFFF, got {value!r}")
    return value


class Calibration:
    """One channel's calibration: register words, meter constant and front end.

    `registers` maps register names (FuncEn, SagTh, PLconstH .. MMode, Ugain .. QoffsetN) to
    16-bit words; names left out take the chip's reset values (FuncEn defaults to 0x0030).
    """

    def __init__(self, meter_constant_imp_per_kwh, registers=None, frontend=None, note=""):
        if not meter_constant_imp_per_kwh or meter_constant_imp_per_kwh <= 0:
            raise CalibrationError(
                f"meter_constant_imp_per_kwh: must be > 0, got {meter_constant_imp_per_kwh!r}"
            )
        self.meter_constant_imp_per_kwh = float(meter_constant_imp_per_kwh)
        self.frontend = dict(frontend) if frontend else None
        self.note = note
        self.registers = {}
        for name in REGISTER_NAMES:
            self.registers[name] = regs.BY_NAME[name].reset
        self.registers["FuncEn"] = DEFAULT_FUNC_EN
        if registers:
            for name in registers:
                self.set(name, registers[name])

    @classmethod
    def default(cls, meter_constant_imp_per_kwh, frontend=None, start_fraction=None):
        """A calibration from design values: PL constant and thresholds from the front end,
        gains at the chip's defaults (exact for the emulator's front end)."""
        fe = dict(frontend) if frontend else dict(EMULATED_FRONTEND)
        mmode = regs.BY_NAME["MMode"].reset
        g = l_pga_gain(mmode)
        pl = pl_constant(
            meter_constant_imp_per_kwh, fe["un_v"], fe["ib_a"], g, fe["v_l_mv"], fe["v_u_mv"]
        )
        high, low = pl_words(pl)
        frac = DEFAULT_START_FRACTION if start_fraction is None else start_fraction
        th = start_threshold(g, fe["v_l_mv"], fe["v_u_mv"], frac)
        return cls(
            meter_constant_imp_per_kwh,
            {"PLconstH": high, "PLconstL": low, "PStartTh": th, "QStartTh": th, "MMode": mmode},
            fe,
            "design values (not calibrated against a reference)",
        )

    def copy(self):
        return Calibration(
            self.meter_constant_imp_per_kwh, dict(self.registers), self.frontend, self.note
        )

    def get(self, name):
        return self.registers[name]

    def set(self, name, value):
        if name not in self.registers:
            raise CalibrationError(f"registers.{name}: not a calibration register")
        word = _parse_word(value, "registers." + name)
        if name == "Ugain" and word & 0x8000:
            raise CalibrationError(
                f"registers.Ugain: 0x{word:04X} has bit 15 set; the chip requires it 0"
            )
        if name in ("Lphi", "Nphi") and word & 0x7C00:
            raise CalibrationError(f"registers.{name}: 0x{word:04X} sets reserved bits 14:10")
        self.registers[name] = word

    @property
    def pl_constant(self):
        return pl_from_words(self.registers["PLconstH"], self.registers["PLconstL"])

    def metering_words(self):
        return [self.registers[n] for n in METERING_NAMES]

    def measurement_words(self):
        return [self.registers[n] for n in MEASUREMENT_NAMES]

    def cs1(self):
        return cs1(self.metering_words())

    def cs2(self):
        return cs2(self.measurement_words())

    def joules_per_count(self):
        return joules_per_count(self.meter_constant_imp_per_kwh)

    def to_dict(self):
        out = {
            "format": CALIBRATION_FORMAT,
            "format_version": CALIBRATION_FORMAT_VERSION,
            "meter_constant_imp_per_kwh": self.meter_constant_imp_per_kwh,
            "frontend": self.frontend,
            "registers": {},
            "checksums": {"CS1": f"0x{self.cs1():04X}", "CS2": f"0x{self.cs2():04X}"},
            "note": self.note,
        }
        for name in REGISTER_NAMES:
            out["registers"][name] = f"0x{self.registers[name]:04X}"
        return out

    @classmethod
    def from_dict(cls, data):
        """Parse a calibration record; CalibrationError names the field and the problem."""
        if not isinstance(data, dict):
            raise CalibrationError("top level: expected an object")
        fmt = data.get("format")
        if fmt != CALIBRATION_FORMAT:
            raise CalibrationError(f"format: expected {CALIBRATION_FORMAT!r}, got {fmt!r}")
        version = data.get("format_version")
        if not isinstance(version, int) or version > CALIBRATION_FORMAT_VERSION or version < 1:
            raise CalibrationError(
                f"format_version: {version!r} is not a version this epi reads "
                f"(<= {CALIBRATION_FORMAT_VERSION})"
            )
        mc = data.get("meter_constant_imp_per_kwh")
        if isinstance(mc, bool) or not isinstance(mc, (int, float)) or not 0 < mc < _INF:
            raise CalibrationError(f"meter_constant_imp_per_kwh: must be a number > 0, got {mc!r}")
        frontend = data.get("frontend")
        if frontend is not None:
            if not isinstance(frontend, dict):
                raise CalibrationError("frontend: expected an object or null")
            for key in FRONTEND_KEYS:
                v = frontend.get(key)
                if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v < _INF:
                    raise CalibrationError(f"frontend.{key}: must be a number > 0, got {v!r}")
        registers = data.get("registers", {})
        if not isinstance(registers, dict):
            raise CalibrationError("registers: expected an object of name -> value")
        for name in registers:
            if name not in REGISTER_NAMES:
                raise CalibrationError(
                    f"registers.{name}: unknown register (known: {', '.join(REGISTER_NAMES)})"
                )
        cal = cls(mc, registers, frontend, data.get("note", ""))
        checks = data.get("checksums")
        if checks is not None and not isinstance(checks, dict):
            raise CalibrationError("checksums: expected an object {CS1, CS2} or null")
        if isinstance(checks, dict):
            for key in checks:
                if key not in ("CS1", "CS2"):
                    raise CalibrationError(f"checksums.{key}: unknown key (CS1, CS2)")
            for key, computed in (("CS1", cal.cs1()), ("CS2", cal.cs2())):
                if key in checks and _parse_word(checks[key], "checksums." + key) != computed:
                    raise CalibrationError(
                        f"checksums.{key}: file says {checks[key]}, registers give "
                        f"0x{computed:04X} (edited registers? remove the checksums entry)"
                    )
        return cal
