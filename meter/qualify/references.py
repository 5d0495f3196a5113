"""References a user has for `epi meter qualify`: a plug-in meter, a resistive load, a CT.

Each gives the energy a channel's load really took over a measured window, and its stated
uncertainty (percent, k = 1) that the energy error's uncertainty carries.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from meter.qualify.analysis import Window


class PlugInMeter:
    """A plug-in energy meter between the socket and the load: the user types the Wh it
    counted during the step (`ask(prompt) -> Wh`)."""

    def __init__(self, ask: Callable[[str], float], uncertainty_pct: float) -> None:
        self.ask, self.uncertainty_pct = ask, uncertainty_pct

    def energy_j(self, channel: int, t0_mono_ns: int, t1_mono_ns: int,
                 windows: Sequence[Window]) -> float:
        wh = self.ask(f"Wh the plug-in meter counted during this {windows[channel].seconds:g} s "
                      "step")
        return wh * 3600.0


class ResistiveLoad:
    """A known resistance R (ohm, tolerance in %): P = U²/R with U the chip's own Urms (its
    0.5 % fiducial error enters twice, hence in the uncertainty)."""

    def __init__(self, ohm: float, tolerance_pct: float) -> None:
        self.ohm = ohm
        self.uncertainty_pct = (tolerance_pct ** 2 + (2 * 0.5) ** 2) ** 0.5

    def energy_j(self, channel: int, t0_mono_ns: int, t1_mono_ns: int,
                 windows: Sequence[Window]) -> float:
        w = windows[channel]
        return w.mean_voltage_v ** 2 / self.ohm * w.seconds


class SecondCT:
    """Another channel's CT on the same conductor, itself qualified: its counter."""

    def __init__(self, reference_channel: int, uncertainty_pct: float) -> None:
        self.reference_channel, self.uncertainty_pct = reference_channel, uncertainty_pct

    def energy_j(self, channel: int, t0_mono_ns: int, t1_mono_ns: int,
                 windows: Sequence[Window]) -> float:
        return windows[self.reference_channel].counter_j
