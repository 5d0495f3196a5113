"""Fan-out of live samples and events to stream clients, bounded so a slow client costs nothing.

The sampler publishes each message once (already serialised to JSON); every subscriber has
its own bounded queue. A client that does not keep up loses its oldest messages, and the
loss is counted and told to it, never allowed to slow the sampling thread or grow memory.
"""

from __future__ import annotations

import json
import threading
from collections import deque
from typing import NamedTuple


class Message(NamedTuple):
    """One published message: its type and channel (for filtering) and its JSON text."""

    type: str
    channel: int | None
    json: str


class Subscription:
    """One client's bounded queue of JSON messages."""

    def __init__(self, hub: LiveHub, maxlen: int) -> None:
        self._hub = hub
        self._queue: deque[Message] = deque()
        self._maxlen = maxlen
        self._cond = threading.Condition()
        self.dropped = 0
        self.closed = False

    def _put(self, message: Message) -> None:
        with self._cond:
            if len(self._queue) >= self._maxlen:
                self._queue.popleft()
                self.dropped += 1
            self._queue.append(message)
            self._cond.notify()

    def get(self, timeout_s: float) -> list[Message]:
        """All pending messages, waiting up to ``timeout_s`` for the first; [] on time-out."""
        with self._cond:
            if not self._queue and not self.closed:
                self._cond.wait(timeout_s)
            out = list(self._queue)
            self._queue.clear()
            return out

    def close(self) -> None:
        """Stop delivering to this subscriber and wake it."""
        with self._cond:
            self.closed = True
            self._cond.notify_all()
        self._hub._remove(self)


class LiveHub:
    """Publish/subscribe for the live stream (`/stream`)."""

    def __init__(self, queue_len: int = 4096) -> None:
        self.queue_len = queue_len
        self._subs: set[Subscription] = set()
        self._lock = threading.Lock()
        self.published = 0
        self.closed = False

    def subscribe(self) -> Subscription:
        sub = Subscription(self, self.queue_len)
        with self._lock:
            if self.closed:
                sub.closed = True
            else:
                self._subs.add(sub)
        return sub

    def _remove(self, sub: Subscription) -> None:
        with self._lock:
            self._subs.discard(sub)

    @property
    def n_clients(self) -> int:
        with self._lock:
            return len(self._subs)

    @property
    def dropped_total(self) -> int:
        with self._lock:
            return sum(s.dropped for s in self._subs)

    def publish(self, message: dict[str, object]) -> None:
        """Serialise once and queue for every subscriber (cheap when nobody listens)."""
        with self._lock:
            subs = list(self._subs)
            self.published += 1
        if not subs:
            return
        channel = message.get("channel")
        msg = Message(
            str(message.get("type", "")),
            channel if isinstance(channel, int) else None,
            json.dumps(message, separators=(",", ":"), allow_nan=False),
        )
        for sub in subs:
            sub._put(msg)

    def close(self) -> None:
        """End every subscription (daemon shutting down)."""
        with self._lock:
            self.closed = True
            subs = list(self._subs)
        for sub in subs:
            sub.close()
