"""Checks that keep a sweep line from the MCU from becoming energy it cannot be.

The bridge's host side treats every MCU line as untrusted input: a line that passed its CRC
can still come from buggy or corrupt firmware. These checks say why a sweep, or one channel
of it, must not be written; the recorder turns each answer into an event and never into
energy (docs/bridge.md "What the host never trusts"):

* `sweep_problem`: a channel given twice in one sweep (which counts would be true?);
* `time_problem`: a sweep stamped later than it was received (a timestamp in the future) or
  earlier than the sweep before it of the same boot;
* `counts_problem`: cumulative counts that went back, or that grew faster than the power
  read at both ends of the interval allows (the direct path's bound), or, without a power,
  than any load the chip can meter (its registers' full scale at the top of the mains range);
* `power_problem`: a power beyond that full scale;
* `pong_problem`: a clock pong whose MCU time cannot have been read within its round trip
  (beyond 64 bits, negative, or far from the clock mapping so far).
"""

from __future__ import annotations

from meter.bridge.clockmap import Mapping
from meter.bridge.protocol import Sweep
from meter.chip.plausibility import LAG_FACTOR, REGISTER_MAX_CURRENT_A, SLACK_COUNTS

# The most power one channel can meter: 1.5 × 240 V (the top of every front end's voltage
# range) at the current registers' full scale. Anything faster is not a load.
MAX_CHANNEL_POWER_W = 1.5 * 240.0 * REGISTER_MAX_CURRENT_A
# The power floor of the host's bound (the MCU knows the channel's own floor; the host does
# not): a few watts of any front end's noise, well below what a bit error adds.
HOST_FLOOR_W = 25.0
# A sweep may be mapped this far after its receipt (plus the mapping's own uncertainty):
# the mapping's drift between refits stays far below it.
FUTURE_TOLERANCE_NS = 1_000_000_000
# A sweep may be mapped this far before the one before it (offset changes between refits).
BACKWARD_TOLERANCE_NS = 1_000_000_000
MAX_MONO_NS = 2**63 - 1  # a trace's t_mono_ns is a signed 64-bit time
# The latest MCU time a pong may carry: mapped onto nanoseconds it must stay a 64-bit time.
MAX_MCU_US = MAX_MONO_NS // 1000


def sweep_problem(sw: Sweep) -> str | None:
    """Why this sweep's channel list cannot be believed, or None."""
    seen: set[int] = set()
    for r in sw.channels:
        if r.channel in seen:
            return f"channel {r.channel} given twice"
        seen.add(r.channel)
    return None


def time_problem(t_line_ns: int, t_recv_ns: int, uncertainty_ns: float,
                 last_line_ns: int | None) -> str | None:
    """Why a sweep mapped to `t_line_ns` (CLOCK_MONOTONIC) cannot have been measured then."""
    if not 0 <= t_line_ns <= MAX_MONO_NS:  # a row the trace reader would refuse
        return f"stamped at {t_line_ns} ns, outside CLOCK_MONOTONIC's 0..2^63-1"
    ahead = t_line_ns - t_recv_ns
    if ahead > FUTURE_TOLERANCE_NS + max(uncertainty_ns, 0):
        return f"stamped {ahead / 1e9:.3f} s after it was received (a time in the future)"
    if last_line_ns is not None and t_line_ns < last_line_ns - BACKWARD_TOLERANCE_NS:
        return (f"stamped {(last_line_ns - t_line_ns) / 1e9:.3f} s before the sweep before it "
                "(time went back within one boot)")
    return None




def pong_problem(t_send_ns: int, t_mcu_us: int, t_recv_ns: int,
                 mapping: Mapping | None) -> str | None:
    """Why a pong's MCU time cannot have been read between the ping's send and the answer's
    receipt: outside 0..MAX_MCU_US, or, once a mapping exists, mapped further outside that
    round trip than the sweeps' tolerance plus the mapping's uncertainty."""
    if not 0 <= t_mcu_us <= MAX_MCU_US:
        return f"time {t_mcu_us} µs is outside 0..{MAX_MCU_US}"
    if mapping is None:
        return None
    at = mapping.to_mono_ns(t_mcu_us)
    tol = FUTURE_TOLERANCE_NS + max(mapping.uncertainty_ns, 0)
    if at > t_recv_ns + tol:
        return f"time maps {(at - t_recv_ns) / 1e9:.3f} s after the answer was received"
    if at < t_send_ns - tol:
        return f"time maps {(t_send_ns - at) / 1e9:.3f} s before the ping was sent"
    return None


def max_counts(dt_s: float, joules_per_count: float,
               powers_w: list[float] | None = None) -> float:
    """The most counts a channel can meter in `dt_s` seconds: with the power (and apparent
    power) read at both ends of the interval, what such a load allows (the direct path's
    bound, plausibility.energy_bound_counts, with HOST_FLOOR_W); without, what any load the
    chip can meter allows."""
    physical = MAX_CHANNEL_POWER_W * max(dt_s, 0.0) / joules_per_count + SLACK_COUNTS
    if not powers_w:
        return physical
    p = max(abs(x) for x in powers_w)
    return min(physical, (p * LAG_FACTOR + HOST_FLOOR_W) * max(dt_s, 0.0) / joules_per_count
               + SLACK_COUNTS)


def counts_problem(last_counts: int, counts: int, dt_s: float, joules_per_count: float,
                   powers_w: list[float] | None = None) -> str | None:
    """Why cumulative `counts`, `dt_s` after `last_counts`, cannot be metered energy."""
    if counts < last_counts:
        return f"cumulative counts went back from {last_counts} to {counts}"
    bound = max_counts(dt_s, joules_per_count, powers_w)
    if counts - last_counts > bound:
        why = (f"the power read around it ({max(abs(x) for x in powers_w):.1f} W)" if powers_w
               else f"any load the chip can meter ({MAX_CHANNEL_POWER_W:.0f} W)")
        return (f"cumulative counts rose by {counts - last_counts} in {dt_s:.3f} s, more than "
                f"the {int(bound)} {why} allows")
    return None


def power_problem(power_w: float | None) -> str | None:
    """Why a reading's power cannot be a load the chip meters, or None."""
    if power_w is not None and abs(power_w) > MAX_CHANNEL_POWER_W:
        return f"power {power_w:.0f} W beyond any load the chip can meter"
    return None
