"""Plausibility checks of a chip reading: what a bit error or a cut frame can produce.

Applied by the one chip protocol (meter.chip.protocol), which the Pi's driver and the board
firmware both run: one set of rules, one source file. MicroPython subset (no dataclasses, no
annotations).

The ATM90E26's SPI has no checksum on reads and no address echo. LastData confirms that the
word we received is the word the chip sent, but a MOSI bit error can redirect a read to
another register, which LastData then confirms. What remains is physics and the chip's own
definitions of its registers (docs/atm90e26.md §Consistency):

* ranges: mains voltage within [0.5, 1.5]·Un, frequency 45..65 Hz, |PF| ≤ 1, current at most
  ``MAX_CURRENT_X_IB``·Ib (and never above the register's full scale);
* consistency: apparent power S = Urms·Irms (when Smean was read) and active power
  P = Urms·Irms·PF, within ``REL_TOL`` of U·I plus ``ABS_TOL_W`` (register resolution and a
  refresh straddled between two register reads);
* energy: the ATenergy counts since the last read cannot exceed what the power allows over
  that interval (``energy_bound_counts``), nor what any load within the channel's ranges can
  meter (``physical_bound_counts``); counts far from what the power leads to expect are
  re-read (``energy_unexpected``).

Callers re-read once on a failed check (a straddled refresh or a redirected read passes the
second time) and report what they rejected, with these reasons, as ``implausible`` events.
"""

REL_TOL = 0.01
ABS_TOL_W = 0.05
MAX_CURRENT_X_IB = 60.0
REGISTER_MAX_CURRENT_A = 65.535
FREQUENCY_RANGE_HZ = (45.0, 65.0)
VOLTAGE_RANGE_X_UN = (0.5, 1.5)
# Energy bound: the power registers are the mean of the last complete refresh window, so the
# load may have risen since; allow LAG_FACTOR times the power read, plus FLOOR_X_UNIB·Un·Ib.
LAG_FACTOR = 4.0
FLOOR_X_UNIB = 0.05
SLACK_COUNTS = 2
# Counts further than this fraction (plus the floor) from what the power leads to expect are
# re-read once: the re-read tells a redirected read from a genuine one (a fast load change).
ENERGY_REREAD_REL = 0.25


class Limits:
    """The physical ranges of one channel (from its analog front end)."""

    def __init__(self, voltage_v, frequency_hz, max_current_a, floor_w):
        self.voltage_v = (float(voltage_v[0]), float(voltage_v[1]))
        self.frequency_hz = (float(frequency_hz[0]), float(frequency_hz[1]))
        self.max_current_a = float(max_current_a)
        self.floor_w = float(floor_w)

    def __eq__(self, other):
        return isinstance(other, Limits) and self.describe() == other.describe()

    def __repr__(self):
        return f"Limits({self.describe()!r})"

    @property
    def max_power_w(self):
        return self.voltage_v[1] * self.max_current_a

    @classmethod
    def for_frontend(cls, frontend):
        """Limits of a front end {"un_v": nominal V, "ib_a": basic current A, ...}."""
        un, ib = float(frontend["un_v"]), float(frontend["ib_a"])
        lo, hi = VOLTAGE_RANGE_X_UN
        return cls(
            (lo * un, hi * un),
            FREQUENCY_RANGE_HZ,
            min(MAX_CURRENT_X_IB * ib, REGISTER_MAX_CURRENT_A),
            FLOOR_X_UNIB * un * ib,
        )

    def describe(self):
        return {"voltage_v": list(self.voltage_v), "frequency_hz": list(self.frequency_hz),
                "max_current_a": self.max_current_a, "floor_w": self.floor_w}


def check_measurements(values, limits, quanta=None):
    """Reasons why a set of register values (Urms, Irms, Pmean, PowerF, Freq and, where it was
    read, Smean) cannot be one measurement of a mains channel; empty when they can.

    `quanta` ({name: half a register step}) widens the consistency tolerance by what reading a
    register without its LSB extension can round away (the firmware reads Urms and Irms in
    whole register steps: 1 mA is 0.23 W at 230 V); None for values read extended."""
    u, i, p = values["Urms"], values["Irms"], values["Pmean"]
    pf, f = values["PowerF"], values["Freq"]
    s = values.get("Smean")
    reasons = []
    lo, hi = limits.voltage_v
    if not lo <= u <= hi:
        reasons.append(f"voltage {u:.2f} V outside {lo:g}..{hi:g} V")
    flo, fhi = limits.frequency_hz
    if not flo <= f <= fhi:
        reasons.append(f"frequency {f:.2f} Hz outside {flo:g}..{fhi:g} Hz")
    if not -1.0005 <= pf <= 1.0005:
        reasons.append(f"power factor {pf:.3f} outside -1..1")
    if not 0 <= i <= limits.max_current_a:
        reasons.append(f"current {i:.3f} A outside 0..{limits.max_current_a:g} A")
    if reasons:
        return reasons
    ui = u * i
    tol = REL_TOL * ui + ABS_TOL_W
    if quanta:
        du, di = quanta.get("Urms", 0.0), quanta.get("Irms", 0.0)
        tol += (abs(u) * di + abs(i) * du) * max(abs(pf), 1.0 if s is not None else 0.0) \
            + ui * quanta.get("PowerF", 0.0) + quanta.get("Pmean", 0.0)
    if s is not None and abs(s - ui) > tol:
        reasons.append(f"apparent power {s:.3f} VA but U·I = {ui:.3f} VA")
    if abs(p - ui * pf) > tol:
        reasons.append(f"active power {p:.3f} W but U·I·PF = {ui * pf:.3f} W")
    return reasons


def energy_bound_counts(powers_w, dt_s, joules_per_count, limits):
    """The most ATenergy counts a load whose power reads ``powers_w`` can meter in ``dt_s``."""
    p = 0.0
    for x in powers_w:
        if abs(x) > p:
            p = abs(x)
    return (p * LAG_FACTOR + limits.floor_w) * max(dt_s, 0.0) / joules_per_count + SLACK_COUNTS


def energy_unexpected(counts, expected_counts, dt_s, joules_per_count, limits):
    """Whether ATenergy counts differ from what the power read leads to expect by more than
    ``ENERGY_REREAD_REL`` of it plus the channel's floor: a read redirected to another register
    (EnStatus 46H is one MOSI bit from ATenergy 42H and reads 0800H) can give a word within
    the bounds. Such counts are re-read, not rejected: a genuine read leaves next to nothing."""
    floor = limits.floor_w * max(dt_s, 0.0) / joules_per_count + SLACK_COUNTS
    return abs(counts - expected_counts) > ENERGY_REREAD_REL * expected_counts + floor


def physical_bound_counts(dt_s, joules_per_count, limits):
    """The most counts any load within the channel's ranges can meter in ``dt_s``."""
    return limits.max_power_w * max(dt_s, 0.0) / joules_per_count + SLACK_COUNTS
