"""What `epi meter run` was asked to do, and what a finished run reports.

Below both feeders of the daemon (direct SPI in meter/daemon/service.py, the MCU bridge in
meter/bridge/daemon.py) so that neither imports the other.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from epi.formats.json_types import JSON
from meter.chip_factory import PowerModels
from meter.clock import Clock
from meter.recording.session import FeederStats
from meter.sources.common import PowerSource


@dataclass
class DaemonOptions:
    """What `epi meter run` was asked to do."""

    out_dir: Path
    board_path: Path | None = None
    emulate: bool = False
    rate_hz: float | None = None
    duration_s: float | None = None
    listen: str | None = "127.0.0.1:8757"  # None: no HTTP server
    faults: Sequence[str] = ()
    n_emulated_channels: int = 4
    clock: Clock | None = None  # SystemClock unless a test or benchmark gives a SimulatedClock
    power_model: PowerModels = None  # override the emulated channels' models (one, or one each)
    late_tolerance_s: float | None = None
    retry_interval_s: float = 1.0
    stats_interval_s: float = 5.0
    model_bus_timing: bool = True
    extra_meta: dict[str, JSON] = field(default_factory=dict)
    sources: Sequence[PowerSource] = ()  # opened software sources, recorded beside the board
    source_node: str | None = None  # node of the software channels (default: hostname)
    emulate_bridge: bool = False  # the board's MCU firmware emulated, over a pty


@dataclass
class RunResult:
    """What a finished run reports."""

    trace_dir: Path
    segment: int
    stats: FeederStats
    url: str | None
    rate_hz: float
