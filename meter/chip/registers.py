"""The ATM90E26 register table and value codecs — the one place the register map is typed.

Used by the chip protocol (driver and firmware), the emulator, the CLI, the analysis and the
docs (`register_table_markdown()`, `field_table_markdown()`), so the addresses, access rules,
reset values, codecs, units and bit fields (`FIELDS`) are written down exactly once.
Source: docs/atm90e26.md §2–3 (datasheet Table-10 and register pages).

Pure functions, no I/O, and only the Python subset MicroPython also runs (no dataclasses, no
typing imports, no f-string `=`), because the board's firmware reuses this module.
"""

# ---- access kinds -------------------------------------------------------------------------
W = "W"  # write-only
R = "R"  # read-only
RW = "RW"  # read/write
RC = "RC"  # read, cleared on read

# ---- codecs -------------------------------------------------------------------------------
U16 = "u16"  # unsigned 16-bit
S16 = "s16"  # two's complement (Pmean, Qmean, offsets, Lgain)
SM16 = "sm16"  # sign-magnitude, bit 15 = sign (PowerF, Pangle)
PHI = "phi"  # sign-magnitude with a 10-bit magnitude (Lphi, Nphi; bits 14:10 reserved)
ENERGY = "energy"  # 0.1 CF pulse per LSB, wraps at 0xFFFF
CHECKSUM = "checksum"
MAGIC = "magic"  # control words (SoftReset, CalStart, AdjStart, SmallPMod)

# ---- register blocks ----------------------------------------------------------------------
STATUS = "status"
METERING = "metering"  # 21H..2BH, covered by CS1
MEASUREMENT_CAL = "measurement_cal"  # 31H..3AH, covered by CS2
ENERGY_BLOCK = "energy"
MEASUREMENT = "measurement"  # 48H..4FH and 68H..6FH (frozen on CS2 error)


class Register:
    """One register: address, name, access, reset value, codec, unit and scale per LSB.

    `extended` registers latch their low 16 bits into the LSB register (08H) when read.
    """

    def __init__(self, address, name, access, reset, codec, unit, scale, block, extended, doc):
        self.address = address
        self.name = name
        self.access = access
        self.reset = reset
        self.codec = codec
        self.unit = unit
        self.scale = scale
        self.block = block
        self.extended = extended
        self.doc = doc

    @property
    def readable(self):
        return self.access != W

    @property
    def writable(self):
        return self.access in (W, RW)

    @property
    def read_clear(self):
        return self.access == RC

    def decode(self, raw):
        """Register word -> value in `unit` (without the LSB extension)."""
        return decode(self.codec, raw) * self.scale

    def __repr__(self):
        return "Register(0x%02X %s)" % (self.address, self.name)


def _r(address, name, access, reset, codec, unit, scale, block, extended=False, doc=""):
    return Register(address, name, access, reset, codec, unit, scale, block, extended, doc)


REGISTERS = (
    # status and special
    _r(0x00, "SoftReset", W, 0x0000, MAGIC, "", 1, STATUS, doc="789AH resets the chip"),
    _r(0x01, "SysStatus", RC, 0x0000, U16, "", 1, STATUS, doc="checksum errors, direction, sag"),
    _r(0x02, "FuncEn", RW, 0x000C, U16, "", 1, STATUS, doc="sag and direction detection (FIELDS)"),
    _r(0x03, "SagTh", RW, 0x1D6A, U16, "", 1, STATUS, doc="voltage sag threshold"),
    _r(0x04, "SmallPMod", RW, 0x0000, MAGIC, "", 1, STATUS, doc="A987H = small-power mode"),
    _r(0x06, "LastData", R, 0x0000, U16, "", 1, STATUS, doc="last word read or written"),
    _r(0x08, "LSB", R, 0x0000, U16, "", 1, STATUS, doc="low 16 bits of the last RMS/power read"),
    # metering calibration (CS1 covers 21H..2BH)
    _r(0x20, "CalStart", RW, 0x6886, MAGIC, "", 1, METERING, doc="5678H start, 8765H check"),
    _r(0x21, "PLconstH", RW, 0x0015, U16, "", 1, METERING, doc="PL constant, high word"),
    _r(0x22, "PLconstL", RW, 0xD174, U16, "", 1, METERING, doc="PL constant, low word"),
    _r(0x23, "Lgain", RW, 0x0000, S16, "", 1, METERING, doc="L-line metering gain"),
    _r(0x24, "Lphi", RW, 0x0000, PHI, "", 1, METERING, doc="L-line phase angle correction"),
    _r(0x25, "Ngain", RW, 0x0000, S16, "", 1, METERING, doc="N-line metering gain"),
    _r(0x26, "Nphi", RW, 0x0000, PHI, "", 1, METERING, doc="N-line phase angle correction"),
    _r(0x27, "PStartTh", RW, 0x08BD, U16, "", 1, METERING, doc="active start-up threshold"),
    _r(0x28, "PNolTh", RW, 0x0000, U16, "", 1, METERING, doc="active no-load threshold"),
    _r(0x29, "QStartTh", RW, 0x0AEC, U16, "", 1, METERING, doc="reactive start-up threshold"),
    _r(0x2A, "QNolTh", RW, 0x0000, U16, "", 1, METERING, doc="reactive no-load threshold"),
    _r(0x2B, "MMode", RW, 0x9422, U16, "", 1, METERING, doc="PGA gains, line, HPF, CF modes"),
    _r(0x2C, "CS1", RW, 0x0000, CHECKSUM, "", 1, METERING, doc="reads the chip's computation"),
    # measurement calibration (CS2 covers 31H..3AH)
    _r(0x30, "AdjStart", RW, 0x6886, MAGIC, "", 1, MEASUREMENT_CAL, doc="5678H/8765H as CalStart"),
    _r(0x31, "Ugain", RW, 0x6720, U16, "", 1, MEASUREMENT_CAL, doc="voltage gain, bit15 = 0"),
    _r(0x32, "IgainL", RW, 0x7A13, U16, "", 1, MEASUREMENT_CAL, doc="L-line current gain"),
    _r(0x33, "IgainN", RW, 0x7530, U16, "", 1, MEASUREMENT_CAL, doc="N-line current gain"),
    _r(0x34, "Uoffset", RW, 0x0000, S16, "", 1, MEASUREMENT_CAL, doc="voltage offset"),
    _r(0x35, "IoffsetL", RW, 0x0000, S16, "", 1, MEASUREMENT_CAL, doc="L-line current offset"),
    _r(0x36, "IoffsetN", RW, 0x0000, S16, "", 1, MEASUREMENT_CAL, doc="N-line current offset"),
    _r(0x37, "PoffsetL", RW, 0x0000, S16, "", 1, MEASUREMENT_CAL, doc="L-line active offset"),
    _r(0x38, "QoffsetL", RW, 0x0000, S16, "", 1, MEASUREMENT_CAL, doc="L-line reactive offset"),
    _r(0x39, "PoffsetN", RW, 0x0000, S16, "", 1, MEASUREMENT_CAL, doc="N-line active offset"),
    _r(0x3A, "QoffsetN", RW, 0x0000, S16, "", 1, MEASUREMENT_CAL, doc="N-line reactive offset"),
    _r(0x3B, "CS2", RW, 0x0000, CHECKSUM, "", 1, MEASUREMENT_CAL, doc="reads chip's own CS"),
    # energy (read-clear; 0.1 CF pulse per LSB)
    _r(0x40, "APenergy", RC, 0x0000, ENERGY, "pulse", 0.1, ENERGY_BLOCK, doc="forward active"),
    _r(0x41, "ANenergy", RC, 0x0000, ENERGY, "pulse", 0.1, ENERGY_BLOCK, doc="reverse active"),
    _r(0x42, "ATenergy", RC, 0x0000, ENERGY, "pulse", 0.1, ENERGY_BLOCK, doc="absolute active"),
    _r(0x43, "RPenergy", RC, 0x0000, ENERGY, "pulse", 0.1, ENERGY_BLOCK, doc="forward reactive"),
    _r(0x44, "RNenergy", RC, 0x0000, ENERGY, "pulse", 0.1, ENERGY_BLOCK, doc="reverse reactive"),
    _r(0x45, "RTenergy", RC, 0x0000, ENERGY, "pulse", 0.1, ENERGY_BLOCK, doc="absolute reactive"),
    _r(0x46, "EnStatus", R, 0xC800, U16, "", 1, ENERGY_BLOCK, doc="no-load, direction, line"),
    # measurement (L line)
    _r(0x48, "Irms", R, 0x0000, U16, "A", 0.001, MEASUREMENT, True, "L-line current RMS"),
    _r(0x49, "Urms", R, 0x0000, U16, "V", 0.01, MEASUREMENT, True, "voltage RMS"),
    _r(0x4A, "Pmean", R, 0x0000, S16, "W", 1.0, MEASUREMENT, True, "L-line mean active power"),
    _r(0x4B, "Qmean", R, 0x0000, S16, "var", 1.0, MEASUREMENT, True, "L-line mean reactive power"),
    _r(0x4C, "Freq", R, 0x0000, U16, "Hz", 0.01, MEASUREMENT, doc="line frequency"),
    _r(0x4D, "PowerF", R, 0x0000, SM16, "", 0.001, MEASUREMENT, doc="L-line power factor"),
    _r(0x4E, "Pangle", R, 0x0000, SM16, "deg", 0.1, MEASUREMENT, doc="L-line phase angle"),
    _r(0x4F, "Smean", R, 0x0000, U16, "VA", 1.0, MEASUREMENT, True, "L-line mean apparent power"),
    # measurement (N line)
    _r(0x68, "Irms2", R, 0x0000, U16, "A", 0.001, MEASUREMENT, True, "N-line current RMS"),
    _r(0x6A, "Pmean2", R, 0x0000, S16, "W", 1.0, MEASUREMENT, True, "N-line mean active power"),
    _r(0x6B, "Qmean2", R, 0x0000, S16, "var", 1.0, MEASUREMENT, True, "N-line reactive power"),
    _r(0x6D, "PowerF2", R, 0x0000, SM16, "", 0.001, MEASUREMENT, doc="N-line power factor"),
    _r(0x6E, "Pangle2", R, 0x0000, SM16, "deg", 0.1, MEASUREMENT, doc="N-line phase angle"),
    _r(0x6F, "Smean2", R, 0x0000, U16, "VA", 1.0, MEASUREMENT, True, "N-line apparent power"),
)

BY_NAME = {}
BY_ADDRESS = {}
for _reg in REGISTERS:
    BY_NAME[_reg.name] = _reg
    BY_ADDRESS[_reg.address] = _reg


def reg(name_or_address):
    """The Register for a name ("Urms") or an address (0x49); KeyError if unknown."""
    if isinstance(name_or_address, int):
        return BY_ADDRESS[name_or_address]
    return BY_NAME[name_or_address]


def address(name):
    return BY_NAME[name].address


def block_registers(block):
    """Registers of one block in address order (e.g. METERING without CalStart/CS1)."""
    out = []
    for r in REGISTERS:
        if r.block == block and r.codec not in (MAGIC, CHECKSUM):
            out.append(r)
    return out


# Addresses used everywhere.
SOFT_RESET = 0x00
SYS_STATUS = 0x01
FUNC_EN = 0x02
SAG_TH = 0x03
SMALL_P_MOD = 0x04
LAST_DATA = 0x06
LSB = 0x08
CAL_START = 0x20
CS1 = 0x2C
ADJ_START = 0x30
CS2 = 0x3B
AP_ENERGY = 0x40  # forward active energy
AN_ENERGY = 0x41  # reverse active energy
AT_ENERGY = 0x42  # absolute active energy = forward + reverse
EN_STATUS = 0x46

# Control words.
SOFT_RESET_CODE = 0x789A
START_CODE = 0x5678  # CalStart/AdjStart: reset the block to defaults and run without checking
CHECK_CODE = 0x8765  # CalStart/AdjStart: check the block against CS1/CS2
POWER_ON_CODE = 0x6886  # CalStart/AdjStart after power-on: block not running
SMALL_POWER_CODE = 0xA987

# ---- bit fields ---------------------------------------------------------------------------
class Field:
    """A named bit field of one register: bits `hi`..`lo` of its word (datasheet register pages).

    `mask` is the field in place, `get(word)` its value (shifted down), `put(word, value)` the
    word with the field replaced. Every mask the code uses comes from these, never a literal.
    """

    def __init__(self, register, name, hi, lo, doc):
        self.register = register
        self.name = name
        self.hi = hi
        self.lo = lo
        self.doc = doc
        self.width = hi - lo + 1
        self.mask = ((1 << self.width) - 1) << lo

    def get(self, word):
        return (word & self.mask) >> self.lo

    def put(self, word, value):
        if value < 0 or value >= (1 << self.width):
            raise ValueError("%s.%s holds %d bits, not %r" % (self.register, self.name,
                                                               self.width, value))
        return (word & ~self.mask & 0xFFFF) | (value << self.lo)

    def __repr__(self):
        return "Field(%s.%s b%d:%d)" % (self.register, self.name, self.hi, self.lo)


FIELDS = (
    Field("SysStatus", "CalErr", 15, 14, "11: CS1 checksum error, metering stopped"),
    Field("SysStatus", "AdjErr", 13, 12, "11: CS2 checksum error, measurements frozen"),
    Field("SysStatus", "LNchange", 7, 7, "metering line changed (L/N)"),
    Field("SysStatus", "RevQchg", 6, 6, "reactive power direction changed"),
    Field("SysStatus", "RevPchg", 5, 5, "active power direction changed"),
    Field("SysStatus", "SagWarn", 1, 1, "voltage sag"),
    Field("FuncEn", "SagEn", 5, 5, "voltage sag detection enabled"),
    Field("FuncEn", "SagWo", 4, 4, "sag warning on WarnOut"),
    Field("FuncEn", "RevQEn", 3, 3, "reactive direction change detection"),
    Field("FuncEn", "RevPEn", 2, 2, "active direction change detection"),
    Field("MMode", "Lgain", 15, 13,
          "L-line PGA gain: 1xx = 1, 000 = 4, 001 = 8, 010 = 16, 011 = 24"),
    Field("MMode", "Ngain", 12, 11, "N-line PGA gain code (reset 10)"),
    Field("MMode", "LNSel", 10, 10, "metering line: 1 = L, 0 = N"),
    Field("MMode", "DisHPF", 9, 8, "high-pass filter disable bits"),
    Field("MMode", "Amod", 7, 6, "CF1 (active) pulse output mode"),
    Field("MMode", "Rmod", 5, 4, "CF2 (reactive) pulse output mode"),
    Field("MMode", "Zxcon", 3, 2, "zero-crossing output mode"),
    Field("MMode", "Pthresh", 1, 0, "L/N power difference threshold (anti-tamper)"),
    Field("EnStatus", "Qnoload", 15, 15, "reactive no-load"),
    Field("EnStatus", "Pnoload", 14, 14, "active no-load"),
    Field("EnStatus", "RevQ", 13, 13, "reactive power reverse"),
    Field("EnStatus", "RevP", 12, 12, "active power reverse"),
    Field("EnStatus", "Lline", 11, 11, "1: L line metered"),
    Field("EnStatus", "LNMode", 1, 0, "MMD1:MMD0 pins"),
)

FIELD = {}
for _field in FIELDS:
    FIELD[_field.register + "." + _field.name] = _field


def field(register_name, field_name):
    """The Field `field_name` of register `register_name` (KeyError if unknown)."""
    return FIELD[register_name + "." + field_name]


# SysStatus bits.
CAL_ERR_MASK = FIELD["SysStatus.CalErr"].mask
ADJ_ERR_MASK = FIELD["SysStatus.AdjErr"].mask
LN_CHANGE = FIELD["SysStatus.LNchange"].mask
REV_Q_CHG = FIELD["SysStatus.RevQchg"].mask
REV_P_CHG = FIELD["SysStatus.RevPchg"].mask
SAG_WARN = FIELD["SysStatus.SagWarn"].mask

# EnStatus bits.
EN_Q_NOLOAD = FIELD["EnStatus.Qnoload"].mask
EN_P_NOLOAD = FIELD["EnStatus.Pnoload"].mask
EN_REV_Q = FIELD["EnStatus.RevQ"].mask
EN_REV_P = FIELD["EnStatus.RevP"].mask
EN_L_LINE = FIELD["EnStatus.Lline"].mask
EN_LN_MODE = FIELD["EnStatus.LNMode"].mask

# MMode fields.
MMODE_LGAIN = FIELD["MMode.Lgain"]
MMODE_LNSEL = FIELD["MMode.LNSel"]

# Metering block (CS1) and measurement-calibration block (CS2), in address order.
METERING_ADDRESSES = tuple(range(0x21, 0x2C))
MEASUREMENT_CAL_ADDRESSES = tuple(range(0x31, 0x3B))

ENERGY_WRAP = 0x10000  # the energy registers count modulo this
PULSES_PER_COUNT = 0.1


# ---- codecs -------------------------------------------------------------------------------
def check_u16(value):
    if not isinstance(value, int) or value < 0 or value > 0xFFFF:
        raise ValueError("not a 16-bit register word: %r" % (value,))
    return value


def to_signed16(raw):
    """Two's complement word -> int (-32768..32767)."""
    raw = check_u16(raw)
    return raw - 0x10000 if raw & 0x8000 else raw


def from_signed16(value):
    """int (-32768..32767) -> two's complement word."""
    if value < -0x8000 or value > 0x7FFF:
        raise ValueError("does not fit a signed 16-bit register: %r" % (value,))
    return value & 0xFFFF


def to_sign_magnitude(raw, magnitude_bits=15):
    """Sign-magnitude word (bit 15 = sign) -> int. 0x83E8 -> -1000."""
    raw = check_u16(raw)
    magnitude = raw & ((1 << magnitude_bits) - 1)
    return -magnitude if raw & 0x8000 else magnitude


def from_sign_magnitude(value, magnitude_bits=15):
    """int -> sign-magnitude word. -1000 -> 0x83E8."""
    magnitude = -value if value < 0 else value
    if magnitude >= (1 << magnitude_bits):
        raise ValueError(
            "magnitude %r does not fit %d bits" % (magnitude, magnitude_bits)
        )
    return (0x8000 | magnitude) if value < 0 else magnitude


def decode(codec, raw):
    """Register word -> integer value for the codec (scale not applied)."""
    if codec == S16:
        return to_signed16(raw)
    if codec == SM16:
        return to_sign_magnitude(raw)
    if codec == PHI:
        return to_sign_magnitude(raw, 10)
    return check_u16(raw)


def encode(codec, value):
    """Integer value -> register word for the codec."""
    if codec == S16:
        return from_signed16(value)
    if codec == SM16:
        return from_sign_magnitude(value)
    if codec == PHI:
        return from_sign_magnitude(value, 10)
    return check_u16(value)


def extended_value(register, raw, lsb_raw):
    """Value with the LSB extension: (raw << 16 | LSB) / 65536, times the register's scale.

    Signed registers (Pmean, Qmean) are read as one 32-bit two's complement number. LSB bits
    7:0 are always zero on the chip, so the extension adds 8 bits of resolution.
    """
    word = (check_u16(raw) << 16) | check_u16(lsb_raw)
    if register.codec == S16 and word & 0x80000000:
        word -= 0x100000000
    return word / 65536.0 * register.scale


def split_extended(value, register):
    """Inverse of `extended_value` (for the emulator): value -> (raw, lsb_raw), LSB 7:0 = 0.

    Rounds to the nearest step of the 24 bits the chip resolves (1/256 of the register LSB).
    """
    word = round_half_away(value / register.scale * 256.0) * 256
    if register.codec == S16:
        lo, hi = -0x80000000, 0x7FFFFFFF
    else:
        lo, hi = 0, 0xFFFFFFFF
    if word < lo:
        word = lo
    if word > hi:
        word = hi
    word &= 0xFFFFFFFF
    return (word >> 16) & 0xFFFF, word & 0xFF00


def round_half_away(x):
    """Round to the nearest integer, halves away from zero (same on CPython and MicroPython)."""
    if x >= 0:
        return int(x + 0.5)
    return -int(-x + 0.5)


def energy_delta(previous_raw, raw):
    """Counts between two readings of a free-running 16-bit energy counter (one wrap at most)."""
    return (raw - previous_raw) % ENERGY_WRAP


def register_table_markdown():
    """The register table as Markdown (for docs/meter.md), generated from `REGISTERS`."""
    lines = [
        "| Addr | Name | Access | Reset | Codec | Unit/LSB |",
        "|---|---|---|---|---|---|",
    ]
    for r in REGISTERS:
        unit = ""
        if r.unit:
            unit = "%g %s" % (r.scale, r.unit)
        lines.append(
            "| %02XH | %s | %s | %04XH | %s | %s |"
            % (r.address, r.name, r.access, r.reset, r.codec, unit)
        )
    return "\n".join(lines)


def field_table_markdown():
    """The bit fields as Markdown (docs/atm90e26.md carries it; a test compares)."""
    lines = ["| Register | Bits | Field | Meaning |", "|---|---|---|---|"]
    for f in FIELDS:
        bits = "%d" % f.hi if f.hi == f.lo else "%d:%d" % (f.hi, f.lo)
        lines.append("| %s | %s | %s | %s |" % (f.register, bits, f.name, f.doc))
    return "\n".join(lines)
