"""Run the live view: a reader thread follows `/stream`, a sync thread estimates the clock
offset every few seconds, and the main thread redraws with rich.Live until Ctrl-C or until the
stream ends (the daemon stopped, went silent or vanished) — both a clean exit, no traceback.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

from rich.console import Console
from rich.live import Live

from epi.core.clocksync import estimate_offset
from epi.core.errors import UserError
from meter.watch.state import WatchState
from meter.watch.stream import StreamClient, StreamEnded
from meter.watch.view import frame


@dataclass(frozen=True)
class WatchOptions:
    url: str
    history_s: float = 30.0
    refresh_hz: float = 4.0
    sync_every_s: float = 10.0
    channels: tuple[int, ...] = ()
    idle_timeout_s: float = 5.0


def _read(client: StreamClient, state: WatchState) -> None:
    try:
        for msg in client.messages():
            state.message(msg)
    except StreamEnded as exc:
        state.end(str(exc))
    finally:
        client.close()


def _sync(opts: WatchOptions, state: WatchState, stop: threading.Event) -> None:
    while not stop.is_set():
        try:
            state.offset(estimate_offset(opts.url, samples=8, timeout_s=2.0))
        except UserError as exc:
            state.offset(None, str(exc).split("(")[0].strip())
        stop.wait(opts.sync_every_s)


def watch(opts: WatchOptions, console: Console | None = None) -> str:
    """Show the live view until Ctrl-C ('interrupted') or the stream's end (its reason).

    A daemon that cannot be reached at the start is a one-line `UserError`.
    """
    console = console or Console()
    client = StreamClient(opts.url, channels=opts.channels, idle_timeout_s=opts.idle_timeout_s)
    state = WatchState(opts.url, history_s=opts.history_s)
    state.hello(client.open())
    stop = threading.Event()
    reader = threading.Thread(target=_read, args=(client, state), daemon=True,
                              name="watch-stream")
    syncer = threading.Thread(target=_sync, args=(opts, state, stop), daemon=True,
                              name="watch-sync")
    reader.start()
    syncer.start()
    period = 1.0 / max(opts.refresh_hz, 0.2)
    reason = ""
    try:
        with Live(frame(state.snapshot(), opts.history_s), console=console,
                  refresh_per_second=max(opts.refresh_hz, 0.2), transient=False) as live:
            while True:
                time.sleep(period)
                live.update(frame(state.snapshot(), opts.history_s))
                if state.ended:
                    reason = state.ended
                    break
    except KeyboardInterrupt:
        reason = "interrupted"
    finally:
        stop.set()
        client.close()
    console.line()  # the last frame may end without a line end
    return reason
