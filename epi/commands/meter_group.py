"""`epi meter ...`: the meter side's commands. Imports nothing from host/."""

from __future__ import annotations

import click

from epi.cli import LazyGroup

METER_COMMANDS = {
    "read": "epi.commands.meter_read:read",
    "calibrate": "epi.commands.meter_calibrate:calibrate",
    "run": "epi.commands.meter_run:run",
    "sync": "epi.commands.meter_sync:sync",
    "firmware": "epi.commands.meter_firmware:firmware",
    "watch": "epi.commands.meter_watch:watch",
    "plan": "epi.commands.meter_plan:plan",
    "qualify": "epi.commands.meter_qualify:qualify",
}

METER_HELP = {
    "read": "One reading of every channel, as a table.",
    "calibrate": "Calibrate one channel's gains against reference readings.",
    "run": "Run the sampling daemon: traces, clock sync, live stream, /metrics.",
    "sync": "Estimate the clock offset to a running meter daemon.",
    "firmware": "The board MCU's firmware: build (mpy-cross), deploy (mpremote), console.",
    "watch": "A terminal live view of a running daemon: power, events, sample rate, clock.",
    "plan": "What each channel's CT, burden, gain and meter constant resolve at a load.",
    "qualify": "Qualify each channel against a reference: error, floor, CT, crosstalk.",
}


@click.group(cls=LazyGroup, commands=METER_COMMANDS, help_lines=METER_HELP)
def meter() -> None:
    """The meter side: ATM90E26 chips (or their emulator), sampling daemon, clock sync."""
