"""Child processes a campaign can always find again: each step runs in its own session.

A step's process group id is written to the journal before the step runs. If the campaign is
killed (kill -9, power cut), the children may outlive it; the resumed campaign kills what is
left of an interrupted step's group first, so a stale inference process never runs beside
(and heats the machine under) a new measurement. `prctl(PR_SET_PDEATHSIG)` also asks the
kernel to signal the direct child when the campaign dies.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

PR_SET_PDEATHSIG = 1


def _child_setup(death_signal: int) -> None:
    os.setsid()
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, death_signal, 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: the journal's pgid still finds it
        pass


def start(argv: Sequence[str], log_path: Path, marker: str, *,
          death_signal: int = signal.SIGINT, cwd: Path | None = None,
          extra_env: Mapping[str, str] | None = None) -> subprocess.Popen:
    """Start `argv` in a new session, output appended to `log_path`, marked with `marker`."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, **(extra_env or {}), MARK_VAR: marker}
    with open(log_path, "ab") as log:
        return subprocess.Popen(list(argv), stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, cwd=cwd, env=env,
                                preexec_fn=lambda: _child_setup(death_signal))


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _group_members(pgid: int) -> list[int]:
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[2]) == pgid:  # field 5 of /proc/PID/stat: pgrp
            out.append(int(entry.name))
    return out


MARK_VAR = "EPI_CAMPAIGN_STEP"


def _marked(pid: int, marker: str) -> bool:
    """Whether the process carries EPI_CAMPAIGN_STEP=marker in its environment (children
    inherit it, so the inference grandchild of a step is recognised too)."""
    try:
        env = (Path("/proc") / str(pid) / "environ").read_bytes().split(b"\0")
    except OSError:
        return False
    return f"{MARK_VAR}={marker}".encode() in env


def stop_stale_group(pgid: int, marker: str, *, timeout_s: float = 10.0) -> bool:
    """Kill what is left of a group this campaign started (only if a member still carries
    the step's `marker` in its environment, so a reused process id is never touched)."""
    members = _group_members(pgid)
    if not members or not any(_marked(p, marker) for p in members):
        return False
    for sig in (signal.SIGINT, signal.SIGKILL):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            return True
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and _group_members(pgid):
            time.sleep(0.1)
        if not _group_members(pgid):
            return True
    return True


def stop(proc: subprocess.Popen, *, timeout_s: float = 15.0) -> None:
    """Interrupt a step's whole group (SIGINT, then SIGKILL) and reap the child."""
    if proc.poll() is not None and not group_alive(proc.pid):
        return
    for sig in (signal.SIGINT, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            proc.wait(timeout=timeout_s)
            break
        except subprocess.TimeoutExpired:
            continue
    proc.wait()
