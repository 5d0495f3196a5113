"""The campaign journal: an append-only JSON-lines file, one fsynced line per event.

A step is *finished* only when its `done` line is on disk; `started` lines let a resumed
campaign say what was interrupted (and clean up what the interrupted step left running).
A line cut short by a power cut (no final newline, or not JSON) is ignored; nothing after it
can exist, because lines are only ever appended.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from epi.core.errors import UserError
from epi.core.files import fsync_dir

JOURNAL = "journal.jsonl"


@dataclass
class JournalState:
    """What the journal says: finished steps, and started-but-unfinished ones."""

    done: dict[str, dict[str, Any]] = field(default_factory=dict)
    interrupted: dict[str, dict[str, Any]] = field(default_factory=dict)
    attempts: dict[str, int] = field(default_factory=dict)
    sessions: int = 0
    torn_line: bool = False
    study_sha256: str | None = None  # of the study file the last session ran


class Journal:
    """Append events; read back the state. One writer at a time (the campaign lock)."""

    def __init__(self, directory: Path) -> None:
        self.path = Path(directory) / JOURNAL

    def read(self) -> JournalState:
        state = JournalState()
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return state
        lines = data.split(b"\n")
        if lines and lines[-1] != b"":
            state.torn_line = True  # the last line never got its newline
        for n, raw in enumerate(lines[:-1], 1):
            try:
                ev = json.loads(raw)
            except ValueError:
                raise UserError(f"{self.path}: line {n} is not JSON (the journal was edited?)"
                                ) from None
            kind, step = ev.get("event"), ev.get("step")
            if kind == "session":
                state.sessions += 1
                state.study_sha256 = ev.get("study_sha256")
            elif kind == "started":
                state.attempts[step] = state.attempts.get(step, 0) + 1
                state.interrupted[step] = ev
            elif kind == "done":
                state.done[step] = ev
                state.interrupted.pop(step, None)
            elif kind == "failed":
                state.interrupted.pop(step, None)
        return state

    def append(self, event: str, step: str | None = None, **fields: Any) -> dict[str, Any]:
        """Write one event line and fsync it before returning."""
        ev = {"event": event, "step": step, "t_real_ns": time.time_ns(), **fields}
        line = (json.dumps(ev, sort_keys=False) + "\n").encode()
        new = not self.path.exists()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._repair_torn_tail()
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line)
            os.fsync(fd)
        finally:
            os.close(fd)
        if new:
            fsync_dir(self.path.parent)
        return ev

    def _repair_torn_tail(self) -> None:
        """Cut a torn last line (power cut mid-write) so the next line starts clean."""
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return
        if data and not data.endswith(b"\n"):
            keep = data.rfind(b"\n") + 1
            with open(self.path, "r+b") as fh:
                fh.truncate(keep)
                fh.flush()
                os.fsync(fh.fileno())
