"""One disk-full path for every recorder: count an episode once, stop if the trace is gone.

The trace writer itself drops rows while the disk is full and writes the ``disk_full`` event
and the gap when space returns; what a recorder adds is the fault count (stats and /metrics),
once per episode rather than once per dropped write, and the check that the trace directory
still exists (a removed directory stops the recorder with its one-line message).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

DISK_FULL = "disk_full"  # the fault kind, as the trace's events and /metrics name it


class _Writer(Protocol):
    @property
    def disk_full(self) -> bool: ...

    def check_present(self) -> None: ...


class DiskFullWatch:
    """Remembers whether the last look saw a full disk, so each episode counts once."""

    def __init__(self) -> None:
        self._seen = False

    def check(self, writer: _Writer, faults: dict[str, int],
              on_fault: Callable[[int | None, str], None] | None) -> None:
        """Count a newly full disk in `faults` and tell `on_fault`; raise TraceLostError
        (from the writer) when the trace directory was removed."""
        full = writer.disk_full
        if full and not self._seen:
            faults[DISK_FULL] = faults.get(DISK_FULL, 0) + 1
            if on_fault is not None:
                on_fault(None, DISK_FULL)
        self._seen = full
        writer.check_present()
