"""What the live view shows, kept from the stream's messages (thread-safe: the stream reader
writes, the view reads a snapshot).

Per channel: the latest power, energy and a short power history (the last `history_s`
seconds on the meter's clock); the sample rate measured from the samples' own meter
timestamps (not from when they arrived); the last events; the messages the daemon dropped
for this client; and the clock offset (meter − local monotonic) from `/clock` exchanges.
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass, field

from epi.core.clocksync import ClockOffset
from epi.formats.json_types import JSONObject
from meter.daemon.live_stream import StreamKind

NS = 1_000_000_000
RATE_WINDOW_S = 5.0


@dataclass
class ChannelView:
    """One channel as the view draws it."""

    channel: int
    name: str = ""
    power_w: float | None = None
    energy_j: float | None = None
    samples: int = 0
    history: deque[tuple[int, float]] = field(default_factory=deque)  # (t_mono_ns, W)

    def rate_hz(self) -> float | None:
        """Samples per second over the last RATE_WINDOW_S of meter time."""
        if len(self.history) < 2:
            return None
        t_end = self.history[-1][0]
        recent = [t for t, _ in self.history if t >= t_end - RATE_WINDOW_S * NS]
        span = (recent[-1] - recent[0]) / NS
        return (len(recent) - 1) / span if span > 0 else None


@dataclass(frozen=True)
class EventView:
    t_mono_ns: int
    channel: int | None
    kind: str
    detail: str


@dataclass
class Snapshot:
    """A consistent copy for one frame of the view."""

    url: str
    hello: JSONObject  # the daemon's run description, as the stream gave it
    channels: list[ChannelView]
    events: list[EventView]
    dropped: int
    last_t_mono_ns: int | None
    offset: ClockOffset | None
    offset_error: str
    ended: str


class WatchState:
    def __init__(self, url: str, *, history_s: float = 30.0, max_events: int = 8) -> None:
        self.url = url
        self.history_ns = int(history_s * NS)
        self._lock = threading.Lock()
        self._hello: JSONObject = {}
        self._channels: dict[int, ChannelView] = {}
        self._events: deque[EventView] = deque(maxlen=max_events)
        self._dropped = 0
        self._last_t: int | None = None
        self._offset: ClockOffset | None = None
        self._offset_error = ""
        self._ended = ""

    # -- the stream reader --------------------------------------------------------------
    def hello(self, msg: JSONObject) -> None:
        with self._lock:
            self._hello = dict(msg)

    def message(self, msg: JSONObject) -> None:
        """Take one stream message (sample, event, heartbeat, dropped; others ignored)."""
        kind = msg.get("type")
        with self._lock:
            if kind == StreamKind.SAMPLE:
                self._sample(msg)
            elif kind == StreamKind.EVENT:
                t = _int(msg.get("t_mono_ns"))
                ch = msg.get("channel")
                self._events.append(EventView(t or 0, ch if isinstance(ch, int) else None,
                                              str(msg.get("kind", "")),
                                              str(msg.get("detail", "") or "")))
            elif kind == StreamKind.DROPPED:
                self._dropped += _int(msg.get("count")) or 0
            if kind in (StreamKind.SAMPLE, StreamKind.EVENT, StreamKind.HEARTBEAT):
                t = _int(msg.get("t_mono_ns"))
                if t is not None:
                    self._last_t = t

    def _sample(self, msg: JSONObject) -> None:
        ch_no = _int(msg.get("channel"))
        t = _int(msg.get("t_mono_ns"))
        if ch_no is None or t is None:
            return
        ch = self._channels.setdefault(ch_no, ChannelView(ch_no))
        ch.name = str(msg.get("name") or ch.name)
        power = _float(msg.get("power_w"))
        ch.power_w = power
        ch.energy_j = _float(msg.get("energy_j"))
        ch.samples += 1
        if power is not None:
            ch.history.append((t, power))
        while ch.history and ch.history[0][0] < t - self.history_ns:
            ch.history.popleft()

    def offset(self, value: ClockOffset | None, error: str = "") -> None:
        with self._lock:
            if value is not None:
                self._offset = value
            self._offset_error = error

    def end(self, reason: str) -> None:
        with self._lock:
            self._ended = reason

    # -- the view -------------------------------------------------------------------------
    @property
    def ended(self) -> str:
        with self._lock:
            return self._ended

    def snapshot(self) -> Snapshot:
        with self._lock:
            chans = [ChannelView(c.channel, c.name, c.power_w, c.energy_j, c.samples,
                                 deque(c.history))
                     for _, c in sorted(self._channels.items())]
            return Snapshot(self.url, dict(self._hello), chans, list(self._events),
                            self._dropped, self._last_t, self._offset, self._offset_error,
                            self._ended)


def _int(x: object) -> int | None:
    return x if isinstance(x, int) and not isinstance(x, bool) else None


def _float(x: object) -> float | None:
    if isinstance(x, int | float) and not isinstance(x, bool):
        return float(x)
    return None
