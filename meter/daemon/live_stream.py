"""Fan-out of live samples and events to stream clients: nothing a client does reaches the
sampling thread.

The sampler publishes each message once (serialised to JSON once) into one bounded ring;
publishing costs the same with 0 or 64 clients — no per-client queue, no wake-up. Each
subscriber keeps its own cursor into the ring and collects what is new every
`POLL_INTERVAL_S` (live data is at most that much late). A client that falls further behind
than the ring holds loses its oldest messages; the loss is counted and told to it. At most
`max_clients` subscribe at once (the server answers the others 503).
"""

from __future__ import annotations

import json
import threading
import time
from collections import deque
from typing import NamedTuple

from epi.core.vocabulary import Word

POLL_INTERVAL_S = 0.1
MAX_CLIENTS = 64


class StreamKind(Word):
    """The ``type`` of a /stream message (docs/meter.md)."""

    HELLO = "hello"  # the first message: the daemon's run description
    SAMPLE = "sample"
    EVENT = "event"
    HEARTBEAT = "heartbeat"
    DROPPED = "dropped"  # how many messages this client lost by reading too slowly


class Message(NamedTuple):
    """One published message: its type and channel (for filtering) and its JSON text."""

    type: str
    channel: int | None
    json: str


class Subscription:
    """One client's cursor into the hub's ring."""

    def __init__(self, hub: LiveHub, cursor: int) -> None:
        self._hub = hub
        self.cursor = cursor  # sequence number of the next message this client gets
        self.dropped = 0
        self._closed = threading.Event()

    @property
    def closed(self) -> bool:
        return self._closed.is_set()

    def get(self, timeout_s: float) -> list[Message]:
        """All pending messages, waiting up to ``timeout_s`` for the first; [] on time-out or
        once closed."""
        deadline = time.monotonic() + timeout_s
        while True:
            out = self._hub._since(self)
            if out or self.closed:
                return out
            left = deadline - time.monotonic()
            if left <= 0:
                return []
            self._closed.wait(min(left, POLL_INTERVAL_S))

    def close(self) -> None:
        """Stop delivering to this subscriber and wake it."""
        self._closed.set()
        self._hub._remove(self)


class LiveHub:
    """Publish/subscribe for the live stream (`/stream`)."""

    def __init__(self, queue_len: int = 4096, max_clients: int = MAX_CLIENTS) -> None:
        self.queue_len = queue_len
        self.max_clients = max_clients
        self._ring: deque[Message] = deque(maxlen=queue_len)
        self._next = 0  # sequence number of the next message published
        self._subs: set[Subscription] = set()
        self._lock = threading.Lock()
        self.published = 0
        self.refused = 0  # subscriptions refused: max_clients were following already
        self.closed = False

    def subscribe(self) -> Subscription | None:
        """A new subscriber from the next message on; None when `max_clients` follow already."""
        with self._lock:
            if not self.closed and len(self._subs) >= self.max_clients:
                self.refused += 1
                return None
            sub = Subscription(self, self._next)
            if self.closed:
                sub._closed.set()
            else:
                self._subs.add(sub)
        return sub

    def _remove(self, sub: Subscription) -> None:
        with self._lock:
            self._subs.discard(sub)

    def _since(self, sub: Subscription) -> list[Message]:
        """The messages published since the subscriber's cursor (counting what the ring lost)."""
        with self._lock:
            oldest = self._next - len(self._ring)
            if sub.cursor < oldest:
                sub.dropped += oldest - sub.cursor
                sub.cursor = oldest
            start = sub.cursor - oldest
            out = [self._ring[i] for i in range(start, len(self._ring))]
            sub.cursor = self._next
        return out

    @property
    def n_clients(self) -> int:
        with self._lock:
            return len(self._subs)

    @property
    def dropped_total(self) -> int:
        with self._lock:
            return sum(s.dropped for s in self._subs)

    def publish(self, message: dict[str, object]) -> None:
        """Serialise once and append to the ring (nothing at all when nobody listens)."""
        with self._lock:
            self.published += 1
            if not self._subs:
                return
        channel = message.get("channel")
        msg = Message(
            str(message.get("type", "")),
            channel if isinstance(channel, int) else None,
            json.dumps(message, separators=(",", ":"), allow_nan=False),
        )
        with self._lock:
            self._ring.append(msg)
            self._next += 1

    def close(self) -> None:
        """End every subscription (daemon shutting down)."""
        with self._lock:
            self.closed = True
            subs = list(self._subs)
        for sub in subs:
            sub.close()
