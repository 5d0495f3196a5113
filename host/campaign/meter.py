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

Several meters (a study's `[[meter]]` tables): each emulated daemon k (0-based) has its own
port, trace directory, log (`meter.log`, `meter-2.log`, ...) and record (`daemon.json`,
`daemon-2.json`, ...), and with `nodes` a board file (`meter-K.board.toml`) whose channels
carry those node names in order (the analysis maps each node to its (meter, channel) by
them); channel 0 follows the activity, the others idle at Pi-5-like constant powers.
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
from contextlib import contextmanager, suppress
from pathlib import Path

from epi.core.errors import UserError
from epi.core.files import write_json_atomic
from epi.core.net import free_port
from epi.core.vocabulary import Word
from host.campaign import procs
from meter.emulation.power_models import ACTIVITY_ENV, FOLLOW_ENV

DAEMON_JSON = "daemon.json"
FOLLOW_PIDS = "follow.pids"


class Activity(Word):
    """What drives the emulated meter's channel 0 (see above)."""

    PROCESS_TREE = "process_tree"
    MACHINE = "machine"


ACTIVITIES = Activity.values()
ACTIVITY_TEXT = {"process_tree": "channel 0 follows the CPU time of this campaign's processes "
                                 "(ActivityModel, process tree)",
                 "machine": "channel 0 follows this machine's CPU (ActivityModel)"}


def _suffix(index: int) -> str:
    """'' for the first meter, '-2', '-3', ... for the others (file names)."""
    return "" if index == 0 else f"-{index + 1}"


def daemon_json(campaign_dir: Path, index: int = 0) -> Path:
    return campaign_dir / f"daemon{_suffix(index)}.json"


def stop_stale_daemon(campaign_dir: Path, index: int | None = None) -> bool:
    """Stop what a killed campaign left of its emulated daemon `index` (None: of every one)."""
    paths = ([daemon_json(campaign_dir, index)] if index is not None
             else sorted(campaign_dir.glob("daemon*.json")))
    stopped = False
    for path in paths:
        try:
            info = json.loads(path.read_text())
            stopped |= procs.stop_stale_group(int(info["pgid"]), str(info["marker"]))
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return stopped


def trace_nodes(trace_dir: Path) -> set[str]:
    """The node names on a trace directory's channels (every segment's metadata,
    docs/formats.md §1); unreadable metadata counts as none (the analysis says why)."""
    nodes: set[str] = set()
    for meta in sorted(trace_dir.glob("seg-*.meta.json")):
        try:
            doc = json.loads(meta.read_text())
        except (OSError, ValueError):
            continue
        chans = doc.get("channels") if isinstance(doc, dict) else None
        for ch in chans if isinstance(chans, list) else []:
            node = ch.get("node") if isinstance(ch, dict) else None
            if isinstance(node, str):
                nodes.add(node)
    return nodes


def board_file(campaign_dir: Path, index: int, nodes: tuple[str, ...]) -> Path:
    """An emulated board whose channels meter `nodes`, in order (docs/board.md's format)."""
    lines = ['format = "epi-board"', "format_version = 1",
             f'name = "campaign-meter-{index + 1}"']
    for i, node in enumerate(nodes):
        lines += ["[[channel]]", f'name = "ch{i}"', f'node = "{node}"',
                  f'chip_select = "{"CE" + str(i) if i < 2 else "GPIO" + str(20 + i)}"']
    path = campaign_dir / f"meter-{index + 1}.board.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def follow_env(campaign_dir: Path, activity: str) -> dict[str, str]:
    """The daemon's extra environment for `activity`; writes the follow file it names."""
    if activity not in ACTIVITIES:
        raise UserError(f"meter activity must be one of {', '.join(ACTIVITIES)}, "
                        f"got {activity!r}")
    if activity == Activity.MACHINE:
        return {ACTIVITY_ENV: "machine"}
    path = campaign_dir / FOLLOW_PIDS
    path.write_text(f"{os.getpid()}\n")
    return {FOLLOW_ENV: str(path.resolve())}


@contextmanager
def emulated_daemon(campaign_dir: Path, trace_dir: Path, rate_hz: float | None,
                    activity: str = "process_tree", *, index: int = 0,
                    nodes: tuple[str, ...] = ()) -> Iterator[str]:
    """Start `epi meter run --emulate`; yield its URL; stop it (SIGTERM, clean stop) after.

    `activity`: what channel 0's modelled power follows (see the module docstring); `index`:
    which of the study's meters (its files' names); `nodes`: its channels' node names (none:
    the emulator's default board, channel 0 metering this host).
    """
    stop_stale_daemon(campaign_dir, index)
    env = follow_env(campaign_dir, activity)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    argv = [sys.executable, "-m", "epi", "meter", "run", "--emulate", "--out", str(trace_dir),
            "--listen", f"127.0.0.1:{port}"]
    if rate_hz is not None:
        argv += ["--rate", f"{rate_hz:g}"]
    if nodes:
        argv += ["--board", str(board_file(campaign_dir, index, nodes))]
    marker = f"daemon{_suffix(index)}:{campaign_dir.resolve()}"
    log = campaign_dir / f"meter{_suffix(index)}.log"
    proc = procs.start(argv, log, marker, death_signal=signal.SIGTERM, extra_env=env)
    record = daemon_json(campaign_dir, index)
    write_json_atomic(record, {"pgid": proc.pid, "marker": marker, "url": url, "argv": argv})
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
                # why it did not stop goes to its log: every thread's stack (faulthandler on
                # SIGUSR1, epi/commands/meter_run.py), then the usual SIGINT, SIGKILL
                with suppress(ProcessLookupError):
                    proc.send_signal(signal.SIGUSR1)
                    time.sleep(0.5)
                procs.stop(proc)
        record.unlink(missing_ok=True)
