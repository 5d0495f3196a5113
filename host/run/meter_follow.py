"""Register a run with an emulated meter daemon on the same machine, so its modelled power
follows this run's processes (docs/runner.md, "A run by hand on the emulated meter").

A daemon started by hand (`epi meter run --emulate`) models channel 0 from the whole
machine's CPU time until a run registers (meter.emulation.power_models.
RegisteredTreeActivityModel); its /status names the follow file. `epi run --meter URL`
writes its own PID there at start and takes it out at the end, so a hand run is metered
like a campaign's run, with nothing exported by the user.

The path comes from a network peer, so it is written only when everything says it is the
daemon's own follow file on this machine: the same boot id, an absolute path named
`follow.pids` in a directory `epi-meter-follow-*`, a regular file that exists (never created,
never through a symbolic link) and is owned by this user.
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

from epi.core.errors import UserError
from epi.core.files import read_boot_id
from epi.core.net import split_daemon_url
from epi.formats.json_types import JSONObject

FOLLOW_NAME = "follow.pids"
FOLLOW_DIR_PREFIX = "epi-meter-follow-"


def _status(url: str) -> JSONObject | None:
    """The daemon's /status document, or None when it cannot be read."""
    try:
        host, port, base = split_daemon_url(url)
        with urllib.request.urlopen(f"http://{host}:{port}{base}/status", timeout=3) as resp:
            doc = json.loads(resp.read().decode("utf-8", "replace"))
    except (OSError, ValueError, UserError, urllib.error.URLError):
        return None  # a daemon that does not answer is the clock sync's business
    return doc if isinstance(doc, dict) else None


def _trusted_follow_file(status: JSONObject, this_boot: str | None) -> Path | None:
    """The follow file /status names, when it is the daemon's own on this machine."""
    follow = status.get("follow_file")
    if not isinstance(follow, str) or not follow or this_boot is None:
        return None
    if status.get("boot_id") != this_boot:
        return None  # another machine: its follow file is not ours to write
    path = Path(follow)
    if (not path.is_absolute() or path.name != FOLLOW_NAME
            or not path.parent.name.startswith(FOLLOW_DIR_PREFIX)):
        return None
    try:
        st = path.lstat()
    except OSError:
        return None
    import stat

    if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid():
        return None
    return path


def _write(path: Path, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_TRUNC | os.O_NOFOLLOW)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


class MeterFollow:
    """The registrations of one run: `start` writes this PID, `stop` takes it out again."""

    def __init__(self, urls: list[str], echo: Callable[[str], None], *,
                 pid: int | None = None,
                 read_status: Callable[[str], JSONObject | None] = _status) -> None:
        self._urls = urls
        self._echo = echo
        self._pid = os.getpid() if pid is None else pid
        self._read_status = read_status
        self.registered: list[Path] = []

    def start(self) -> None:
        this_boot = read_boot_id()
        for url in self._urls:
            status = self._read_status(url)
            if not status or not status.get("follow_file"):
                continue  # a real meter, or a daemon that follows a campaign's processes
            path = _trusted_follow_file(status, this_boot)
            if path is None:
                self._echo(f"epi run: the emulated meter at {url} runs on another machine (or "
                           "names no usable follow file): its modelled power follows that "
                           "machine's CPU, not this run")
                continue
            try:
                _write(path, f"{self._pid}\n")
            except OSError as exc:
                self._echo(f"epi run: warning: cannot register with the emulated meter at {url} "
                           f"({path}: {exc.strerror}); its modelled power follows the whole "
                           "machine: start the daemon as this user")
                continue
            self.registered.append(path)
            self._echo(f"epi run: the emulated meter at {url} follows this run's processes "
                       "(modelled power)")

    def stop(self) -> None:
        """Take this PID out of every follow file that still names it (the daemon then
        follows the whole machine again)."""
        for path in self.registered:
            try:
                if path.read_text().split() == [str(self._pid)]:
                    _write(path, "")
            except OSError:
                pass  # the daemon stopped and removed its file: nothing left to undo
        self.registered = []
