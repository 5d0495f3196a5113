"""The emulated meter daemon a campaign starts when its study says `emulate = true`.

It runs as its own session with its process group recorded in `daemon.json`, so a campaign
resumed after kill -9 stops a daemon the killed one left behind before starting its own (one
trace directory, one writer). The trace directory persists: every start adds a segment.

Which activity drives channel 0's modelled power (`activity`):
* ``"process_tree"`` (default): the CPU time of this campaign's process tree — the run steps,
  their inference child and its threads — and nothing else (ProcessTreeActivityModel,
  labelled `modelled (ActivityModel, process tree)`). The campaign writes its own PID to
  `follow.pids` in the campaign directory and starts the daemon with `EPI_METER_FOLLOW`
  naming that file; the daemon leaves itself out of the tree. A background job on the
  machine no longer counts as inference power. No HTTP call and no change to the daemon's
  options: the follow file is read by the power model.
* ``"machine"``: the whole machine's CPU activity (ActivityModel, `modelled (ActivityModel)`),
  every process counting, as before.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from epi.core.errors import UserError
from epi.core.files import write_json_atomic
from epi.core.net import free_port
from host.campaign import procs
from meter.emulation.power_models import FOLLOW_ENV

DAEMON_JSON = "daemon.json"
FOLLOW_PIDS = "follow.pids"
ACTIVITIES = ("process_tree", "machine")
ACTIVITY_TEXT = {"process_tree": "channel 0 follows the CPU time of this campaign's processes "
                                 "(ActivityModel, process tree)",
                 "machine": "channel 0 follows this machine's CPU (ActivityModel)"}


def stop_stale_daemon(campaign_dir: Path) -> bool:
    path = campaign_dir / DAEMON_JSON
    try:
        info = json.loads(path.read_text())
    except (OSError, ValueError):
        return False
    return procs.stop_stale_group(int(info["pgid"]), info["marker"])


def follow_env(campaign_dir: Path, activity: str) -> dict[str, str]:
    """The daemon's extra environment for `activity`; writes the follow file it names."""
    if activity not in ACTIVITIES:
        raise UserError(f"meter activity must be one of {', '.join(ACTIVITIES)}, "
                        f"got {activity!r}")
    if activity == "machine":
        return {}
    path = campaign_dir / FOLLOW_PIDS
    path.write_text(f"{os.getpid()}\n")
    return {FOLLOW_ENV: str(path.resolve())}


@contextmanager
def emulated_daemon(campaign_dir: Path, trace_dir: Path, rate_hz: float | None,
                    activity: str = "process_tree") -> Iterator[str]:
    """Start `epi meter run --emulate`; yield its URL; stop it (SIGTERM, clean stop) after.

    `activity`: what channel 0's modelled power follows (see the module docstring).
    """
    stop_stale_daemon(campaign_dir)
    env = follow_env(campaign_dir, activity)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    argv = [sys.executable, "-m", "epi", "meter", "run", "--emulate", "--out", str(trace_dir),
            "--listen", f"127.0.0.1:{port}"]
    if rate_hz is not None:
        argv += ["--rate", f"{rate_hz:g}"]
    marker = f"daemon:{campaign_dir.resolve()}"
    log = campaign_dir / "meter.log"
    proc = procs.start(argv, log, marker, death_signal=signal.SIGTERM, extra_env=env)
    write_json_atomic(campaign_dir / DAEMON_JSON, {"pgid": proc.pid, "marker": marker,
                                                   "url": url, "argv": argv})
    try:
        deadline = time.monotonic() + 60
        while True:
            if proc.poll() is not None:
                raise UserError(f"meter daemon exited with code {proc.returncode}: see {log}")
            try:
                with urllib.request.urlopen(url + "/status", timeout=1):
                    break
            except OSError:
                if time.monotonic() > deadline:
                    raise UserError(f"meter daemon did not answer at {url}: see {log}"
                                    ) from None
                time.sleep(0.2)
        yield url
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                procs.stop(proc)
        (campaign_dir / DAEMON_JSON).unlink(missing_ok=True)
