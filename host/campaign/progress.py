"""A progress bar with an ETA over the whole plan, and one line per finished step.

The ETA is the remaining steps' estimates, scaled per step kind by how long the finished
steps of that kind really took against their estimate (so a slow machine corrects the
projection after its first run). On a terminal the bar is redrawn in place; otherwise it is
printed as a line after every step (logs and CI stay readable).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import TextIO

from host.campaign.plan import Step, format_duration

WIDTH = 30


class Progress:
    def __init__(self, steps: list[Step], done: set[str], *, stream: TextIO | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.steps = steps
        self.done = set(done)
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty()
        self.clock = clock
        self.ratio: dict[str, list[float]] = {}
        self.current: Step | None = None
        self.current_t0 = 0.0

    def _scale(self, kind: str) -> float:
        r = self.ratio.get(kind)
        return sum(r) / len(r) if r else 1.0

    def remaining_s(self) -> float:
        left = 0.0
        for s in self.steps:
            if s.step_id in self.done:
                continue
            est = s.estimate_s * self._scale(s.kind)
            if self.current is not None and s.step_id == self.current.step_id:
                est = max(est - (self.clock() - self.current_t0), 0.0)
            left += est
        return left

    def bar(self) -> str:
        total = sum(s.estimate_s for s in self.steps) or 1.0
        finished = sum(s.estimate_s for s in self.steps if s.step_id in self.done)
        frac = min(finished / total, 1.0)
        n = round(frac * WIDTH)
        what = f"  {self.current.step_id}" if self.current else ""
        return (f"[{'#' * n}{'.' * (WIDTH - n)}] {len(self.done)}/{len(self.steps)} steps "
                f"{frac:4.0%}  ETA {format_duration(self.remaining_s())}{what}")

    def _draw(self) -> None:
        if self.tty:
            self.stream.write("\r\033[K" + self.bar())
            self.stream.flush()

    def start(self, step: Step) -> None:
        self.current, self.current_t0 = step, self.clock()
        self._draw()

    def tick(self) -> None:
        self._draw()

    def line(self, text: str) -> None:
        """A line above the bar (the bar is redrawn under it)."""
        if self.tty:
            self.stream.write("\r\033[K")
        self.stream.write(text + "\n")
        self._draw()
        self.stream.flush()

    def finish(self, step: Step, text: str) -> None:
        took = self.clock() - self.current_t0
        if step.estimate_s > 0 and took > 0:
            self.ratio.setdefault(step.kind, []).append(took / step.estimate_s)
        self.done.add(step.step_id)
        self.current = None
        self.line(f"done {step.step_id} in {format_duration(took)}: {text}")
        if not self.tty:
            self.stream.write(self.bar() + "\n")
            self.stream.flush()

    def close(self) -> None:
        if self.tty:
            self.stream.write("\r\033[K" + self.bar() + "\n")
            self.stream.flush()
