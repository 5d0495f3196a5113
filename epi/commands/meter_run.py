"""`epi meter run`: the sampling daemon (traces, clock sync, live stream, /metrics)."""

from __future__ import annotations

import faulthandler
import signal
from contextlib import suppress
from pathlib import Path

import click

from epi.commands.params import FiniteFloat, OutputDir, SafeId, check_output_dir
from epi.core.errors import UserError
from meter.daemon.http_server import DEFAULT_HOST, DEFAULT_PORT
from meter.daemon.service import DaemonOptions, MeterDaemon
from meter.daemon.signal_relay import relayed_signals


@click.command("run")
@click.option(
    "--board", "board_path", type=click.Path(path_type=Path, dir_okay=False),
    help="Board file (hardware/epi-meter.toml). Without it, --emulate is required.",
)
@click.option(
    "--emulate", is_flag=True,
    help="Emulated chips (the board file's channels, or 4 channels; channel 0 follows this "
    "machine's CPU activity, modelled as a Pi 5's wall power).",
)
@click.option(
    "--emulate-bridge", is_flag=True,
    help="The board's MCU emulated: its firmware runs here on CPython behind an emumcu:// "
    "serial port and the bridge recorder reads it through pyserial (docs/bridge.md).",
)
@click.option(
    "--out", "out_dir", required=True, type=OutputDir(),
    help="Trace directory; a restarted daemon adds a new segment to it.",
)
@click.option(
    "--rate", "rate_hz", type=FiniteFloat(0, 10_000, lo_open=True), metavar="HZ",
    help="Sweeps per second over all channels [default: the board file's, else a round "
    "rate under 45% of what the bus sustains (20 Hz for 4 chips at 160 kHz)].",
)
@click.option(
    "--duration", "duration_s", type=FiniteFloat(0, 1e7, lo_open=True), metavar="S",
    help="Stop after this many seconds [default: run until SIGTERM/Ctrl-C].",
)
@click.option(
    "--listen", default=f"{DEFAULT_HOST}:{DEFAULT_PORT}", show_default=True,
    metavar="HOST:PORT",
    help="HOST:PORT of the HTTP endpoints (port 0: any free port); 'off' for none.",
)
@click.option(
    "--fault-injection", "faults", multiple=True, metavar="KIND:CHANNEL@START[+DUR][=VALUE]",
    help="Emulated faults (reset, checksum, absent, stuck, bit-errors, partial-frames); "
    "comma-separated or repeated. See docs/daemon.md.",
)
@click.option(
    "--source", "source_spec", default=None, metavar="auto|rapl,hwmon,nvml,pmic",
    help="Software power counters to record too, each on its own thread (component power, "
    "not wall power); alone without --board/--emulate. See docs/sources.md.",
)
@click.option(
    "--source-node", default=None, metavar="NAME", type=SafeId(),  # an empty name is refused
    help="Node name of the software channels (as `epi run --node`) [default: hostname].",
)
def run(
    board_path: Path | None,
    emulate: bool,
    out_dir: Path,
    rate_hz: float | None,
    duration_s: float | None,
    listen: str,
    faults: tuple[str, ...],
    source_spec: str | None,
    source_node: str | None,
    emulate_bridge: bool,
) -> None:
    """Sample every channel on a steady schedule into a crash-safe trace directory."""
    check_output_dir(out_dir, "--out")
    # options that cannot apply together are refused, never one silently ignored
    if emulate and emulate_bridge:
        raise UserError("--emulate and --emulate-bridge: choose one (emulated chips read by "
                        "this Pi, or an emulated MCU that reads them)")
    if emulate_bridge and source_spec is not None:
        raise UserError("--emulate-bridge and --source: software sources run beside chips on "
                        "SPI, not beside a bridge; run a second daemon for them")
    sources: list = []
    if source_spec is not None:
        from meter.sources.factory import open_sources

        sources = open_sources(source_spec, log=lambda line: click.echo(line, err=True))
        if board_path is None and not emulate:
            if faults or rate_hz is not None:
                raise UserError("--fault-injection/--rate: for the board or --emulate; software "
                                "sources keep their own schedule (docs/sources.md)")
            click.echo("epi meter: no board: software sources only, no HTTP server (run "
                       "`epi run` on this machine without --meter: same clock)", err=True)
            _run_sources_alone(sources, out_dir, duration_s, source_node)
            return
    options = DaemonOptions(
        out_dir=out_dir,
        board_path=board_path,
        emulate=emulate,
        rate_hz=rate_hz,
        duration_s=duration_s,
        listen=None if listen.lower() in ("off", "none", "") else listen,
        faults=faults,
        sources=sources,
        source_node=source_node,
        emulate_bridge=emulate_bridge,
    )
    daemon = MeterDaemon(options)
    # SIGUSR1: every thread's stack to stderr (the campaign's meter.log), from C, lock-free —
    # a daemon that does not stop is asked for it before it is killed (host/campaign/meter.py)
    with suppress(AttributeError, OSError, ValueError):  # no real stderr (e.g. captured
        faulthandler.register(signal.SIGUSR1, all_threads=True)  # in-process): no dump
    # SIGHUP: checkpoint, not stop (docs/daemon.md). The calls run on a relay thread, never
    # inside the handler: the handler interrupts the sampler's own thread, which may hold the
    # very lock stop() takes (meter/daemon/signal_relay.py).
    with relayed_signals({signal.SIGTERM: daemon.stop, signal.SIGINT: daemon.stop,
                          signal.SIGHUP: daemon.checkpoint}):
        daemon.run()


def _run_sources_alone(sources: list, out_dir: Path, duration_s: float | None,
                       node: str | None) -> None:
    """No board: a trace with only the software channels, until Ctrl-C/SIGTERM or --duration."""
    import threading

    from meter.clock import SystemClock
    from meter.sources.recorder import record_sources

    stop = threading.Event()  # set by the relay thread: the recording waits on it
    with relayed_signals({signal.SIGTERM: stop.set, signal.SIGINT: stop.set,
                          signal.SIGHUP: stop.set}):
        record_sources(out_dir, sources, clock=SystemClock(), stop=stop, duration_s=duration_s,
                       node=node, log=lambda line: click.echo(line, err=True))
