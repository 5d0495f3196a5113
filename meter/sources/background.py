"""Record software sources in the background of another command (``epi run --power``).

For the single-machine user with no meter daemon: the runner opens the sources before it
starts (an unreadable source named explicitly stops it with the fix, before any log is made),
records them into ``RUN_DIR/power`` (an epi-trace directory) for the whole run, and stops them
when the run ends, however it ends. The trace shares the runner's monotonic clock (same boot
id), so ``epi analyze RUN_DIR --trace RUN_DIR/power`` needs no clock sync.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

from epi.core.errors import UserError
from meter.clock import SystemClock
from meter.sources.common import NullSource
from meter.sources.factory import open_sources
from meter.sources.recorder import record_sources

POWER_DIR = "power"


class BackgroundRecording:
    """Software sources recorded on their own threads until ``stop()``."""

    def __init__(self, spec: str, *, log: Callable[[str], None] = lambda _l: None) -> None:
        self.sources = open_sources(spec, log=log)
        if all(isinstance(s, NullSource) for s in self.sources):
            raise UserError(f"--power {spec}: no readable software power counter on this "
                            "machine (run `epi doctor` for what is missing and the fix)")
        self.log = log
        self._stop = threading.Event()
        self._started = threading.Event()
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self.trace_dir: Path | None = None

    def start(self, trace_dir: Path, node: str | None) -> None:
        """Begin recording into ``trace_dir``; returns once the segment is open."""
        self.trace_dir = out = Path(trace_dir)

        def work() -> None:
            try:
                record_sources(out, self.sources, clock=SystemClock(),
                               stop=self._stop, node=node, log=self.log,
                               started=self._started)
            except BaseException as exc:  # reported by stop(), never lost
                self._error = exc
                self._started.set()

        self._thread = threading.Thread(target=work, name="power-sources", daemon=True)
        self._thread.start()
        self._started.wait()
        if self._error is not None:
            raise self._error

    def stop(self) -> None:
        """Stop and close the trace; raises what went wrong in the recording thread."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if self._error is not None:
            raise self._error
