"""The ATenergy counts one read may hold, from the readings around its window.

An ATenergy read covers the window since the last one. The chip's mean power was read at
both ends of it (Pmean before: the last reading's; Pmean after: this reading's), so a load
that stays, rises or falls within the window meters between the smaller and the larger of
the two, times the elapsed time — plus what the readings cannot resolve: the Pmean register
step (read without its LSB extension on the board: half a watt), the chip's energy pulses
against its power averaging (`REL_ALLOWANCE`) and the counter's own step (`SLACK_COUNTS`).
A count outside that range is re-read (`meter.chip.protocol`): the re-read tells a word that
did not come from ATenergy (the register still holds the window's counts) from a genuine one.
No fixed allowance: a 7x word on a steady load is outside the range whatever the load.
MicroPython subset (the board's firmware runs it).
"""

REL_ALLOWANCE = 0.03  # chip energy vs its own Pmean over one window, and the clear's timing
SLACK_COUNTS = 2  # the counter's step at each end of the window


def counts_range(p_before_w, p_after_w, dt_s, joules_per_count, step_w=0.0):
    """(lowest, highest) ATenergy counts a load read at `p_before_w` then `p_after_w` (W;
    absolute: ATenergy is absolute) meters in `dt_s`; `step_w` is the Pmean register step."""
    a = abs(p_before_w)
    b = abs(p_after_w)
    lo_w = a if a < b else b
    hi_w = b if a < b else a
    dt = dt_s if dt_s > 0 else 0.0
    lo = (lo_w - step_w) * dt / joules_per_count * (1.0 - REL_ALLOWANCE) - SLACK_COUNTS
    hi = (hi_w + step_w) * dt / joules_per_count * (1.0 + REL_ALLOWANCE) + SLACK_COUNTS
    return (lo if lo > 0 else 0.0), hi
