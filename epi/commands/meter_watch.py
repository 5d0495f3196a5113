"""`epi meter watch URL`: a terminal live view of a running meter daemon's stream (rich).

Per-channel power with a short history, events as they happen, the sample rate and the clock
offset. Ctrl-C ends it, and so does the daemon stopping (the stream ends): both exit 0 with one
line saying why; a daemon that cannot be reached at the start is a one-line error.
"""

from __future__ import annotations

import click

from epi.commands.params import BoundedInt, FiniteFloat


@click.command("watch")
@click.argument("url")
@click.option("--history", "history_s", default=30.0, show_default=True,
              type=FiniteFloat(1, 3600), help="Seconds of power history per channel.")
@click.option("--refresh", "refresh_hz", default=4.0, show_default=True,
              type=FiniteFloat(0.2, 30), help="Redraws per second.")
@click.option("--sync-every", "sync_every_s", default=10.0, show_default=True,
              type=FiniteFloat(0.5, 3600), help="Seconds between clock-offset estimates.")
@click.option("--channel", "channels", multiple=True, type=BoundedInt(0, 1023),
              help="Show only this channel (repeatable).")
@click.option("--idle-timeout", "idle_timeout_s", default=5.0, show_default=True,
              type=FiniteFloat(1.5, 600),
              help="Seconds without any message (the daemon sends a heartbeat every second) "
                   "before the daemon counts as gone.")
def watch(url: str, history_s: float, refresh_hz: float, sync_every_s: float,
          channels: tuple[int, ...], idle_timeout_s: float) -> None:
    """Live view of the meter daemon at URL (http://HOST:PORT): power, events, rate, clock."""
    from meter.watch.app import WatchOptions
    from meter.watch.app import watch as run_watch

    reason = run_watch(WatchOptions(url, history_s, refresh_hz, sync_every_s, tuple(channels),
                                    idle_timeout_s))
    if reason == "interrupted":
        click.echo("epi meter watch: stopped (Ctrl-C)")
    else:
        click.echo(f"epi meter watch: the daemon's stream ended: {reason}")
