"""A per-(channel, kind) cap on written events, so a chip failing every read cannot flood the
trace: the first few events of each kind each second are written, the rest are counted, and the
next written one says how many similar events were not written (nothing is lost silently)."""

from __future__ import annotations

EVENTS_PER_SECOND = 5  # per (channel, kind); the daemon and the bridge recorder share it
_WINDOW_NS = 1_000_000_000


class EventBudget:
    """Decides, per (channel, kind), which events are written within each one-second window."""

    def __init__(self, per_second: int = EVENTS_PER_SECOND) -> None:
        self.per_second = per_second
        self._windows: dict[tuple[int | None, str], tuple[int, int, int]] = {}

    def admit(self, channel: int | None, kind: str, t_mono_ns: int, detail: str) -> str | None:
        """The detail to write (noting the events suppressed since the last written one), or
        None when this event is over the budget and only counted."""
        key = (channel, kind)
        start, n, suppressed = self._windows.get(key, (t_mono_ns, 0, 0))
        if t_mono_ns - start >= _WINDOW_NS:
            start, n = t_mono_ns, 0
        if n >= self.per_second:
            self._windows[key] = (start, n, suppressed + 1)
            return None
        self._windows[key] = (start, n + 1, 0)
        if suppressed:
            return f"{detail} (+{suppressed} similar events not written)"
        return detail
