"""MCU time as a 64-bit microsecond count that never wraps.

MicroPython's `time.ticks_us()` wraps (at 2**30 on the rp2 port, about 17.9 minutes);
`ticks_diff` gives the signed difference of two readings less than half a period apart.
`TickExtender.now_us()` adds those differences to a Python int, so it keeps counting past
every wrap as long as it is called at least once per half period (the firmware calls it
several times a second). MicroPython subset.
"""


class TickExtender:
    """Extends a wrapping tick counter (ticks_us, ticks_diff) to a monotonic int."""

    def __init__(self, ticks_us, ticks_diff):
        self._ticks_us = ticks_us
        self._ticks_diff = ticks_diff
        self._last = ticks_us()
        self._total = 0

    def now_us(self):
        """Microseconds since this extender was made (monotonic, never wraps)."""
        t = self._ticks_us()
        d = self._ticks_diff(t, self._last)
        if d > 0:
            self._total += d
            self._last = t
        return self._total
