"""One channel's run of failed readings, closed by a ``gap`` event when data resumes.

Every recorder (the chip sampler, the MCU bridge recorder, the software counters) declares
missing data the same way: the first failure opens a run at its time; later failures are
counted by their reason; when a good reading comes back (or the recorder stops) one ``gap``
event spans the run and names what failed, how often. This class keeps that bookkeeping in
one place so the three recorders cannot drift apart in what a gap says.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class ClosedFailureRun:
    """What a finished run of failures declares: where it began and what failed."""

    start_mono_ns: int
    start_real_ns: int
    counts: dict[str, int] = field(default_factory=dict)  # reason -> failures, first seen first

    @property
    def failures(self) -> int:
        """How many readings failed in the run, all reasons together."""
        return sum(self.counts.values())

    def counts_text(self) -> str:
        """The counts as a gap's reason lists them: ``reason ×n, other ×m``."""
        return ", ".join(f"{k} ×{n}" for k, n in self.counts.items())


class FailureRun:
    """The open run of failed readings of one channel (none while data flows)."""

    def __init__(self) -> None:
        self.since: tuple[int, int] | None = None  # (t_mono_ns, t_real_ns) of the first failure
        self.counts: dict[str, int] = {}

    @property
    def failing(self) -> bool:
        """Whether a run of failures is open."""
        return self.since is not None

    def book(self, t_mono_ns: int, t_real_ns: int, reason: str) -> bool:
        """Count one failed reading; returns True when it opened a new run."""
        opened = self.since is None
        if opened:
            self.since = (t_mono_ns, t_real_ns)
            self.counts = {}
        self.counts[reason] = self.counts.get(reason, 0) + 1
        return opened

    def close(self) -> ClosedFailureRun | None:
        """End the run (data resumed or the recorder stopped): what its gap must declare,
        or None when no run was open."""
        if self.since is None:
            return None
        closed = ClosedFailureRun(self.since[0], self.since[1], self.counts)
        self.since = None
        self.counts = {}
        return closed
