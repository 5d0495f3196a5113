"""Signals to a daemon's control calls (stop, checkpoint), made outside the signal handler.

Why: CPython runs a Python signal handler in the main thread, between two bytecodes, wherever
that thread happens to be. The daemon's main thread is its sampler: it waits for the next
sweep in `threading.Event.wait`, which holds the event's (non-reentrant) lock for a few
bytecodes on its way into and out of the wait. A handler that called `daemon.stop()` there ran
`Event.set()` on that same event and blocked forever on a lock its own thread held: sampling
stopped, the daemon neither wrote its ``stop`` nor exited, later signals (SIGINT) queued
behind the same lock, and only SIGKILL ended it (a campaign waited 15 + 15 s for it). Every
lock the handler takes has the same hazard (an `Event.clear()` in the loop, a second signal
arriving while the first handler runs).

So the handler here takes no lock: it writes the signal's number into a pipe. A relay thread
reads it and makes the call (``stop()``, ``checkpoint()``) from a thread of its own, where
waiting for a lock is safe: the main thread releases it within microseconds.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager, suppress
from types import FrameType

#: what `signal.signal` returns and takes back: a handler, SIG_DFL/SIG_IGN, or None
Handler = Callable[[int, FrameType | None], object] | int | signal.Handlers | None


def _relay(read_fd: int, actions: Mapping[int, Callable[[], None]]) -> None:
    """Make the call of each signal number read from the pipe, until its write end closes."""
    while True:
        try:
            data = os.read(read_fd, 64)
        except OSError:
            return
        if not data:
            return
        for signum in data:
            action = actions.get(signum)
            if action is not None:
                action()


@contextmanager
def relayed_signals(actions: Mapping[int, Callable[[], None]]) -> Iterator[None]:
    """While the body runs, each signal in `actions` makes its call on a relay thread (never
    inside the handler); the previous handlers are restored afterwards. Main thread only."""
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)  # a full pipe (64 KiB of signals) drops, never blocks

    def handler(signum: int, _frame: object) -> None:
        # no lock taken here; a full pipe means the request is queued many times already
        with suppress(OSError):
            os.write(write_fd, bytes([signum]))

    relay = threading.Thread(target=_relay, args=(read_fd, dict(actions)),
                             name="signal-relay", daemon=True)
    relay.start()
    previous: dict[int, Handler] = {}  # signal → the handler it had before
    try:
        for sig in actions:
            previous[sig] = signal.signal(sig, handler)
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
        os.close(write_fd)  # the relay reads end-of-file and ends
        relay.join(timeout=5)
        if not relay.is_alive():  # a relay still inside a call keeps its descriptor
            os.close(read_fd)
