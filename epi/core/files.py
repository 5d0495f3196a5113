"""Small file utilities both halves share: atomic JSON writes, a preparation lock and the
kernel boot id.

Standard library only, so the meter side (a Pi, or the board's MCU tools) and the analysis host
import the same code.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path

from epi.core.errors import UserError


def read_boot_id() -> str | None:
    """The kernel's boot id: two files with the same one share one CLOCK_MONOTONIC."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip() or None
    except OSError:
        return None


def write_json_atomic(path: Path, obj: object) -> None:
    """Write JSON so that a reader sees the old or the new file, never a torn one."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    data = (json.dumps(obj, indent=2, sort_keys=False) + "\n").encode()
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        view = memoryview(data)
        while view:  # a short write (full disk) is continued or raises; never renamed short
            view = view[os.write(fd, view):]
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    os.close(fd)
    os.replace(tmp, path)
    fsync_dir(path.parent)


def fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def one_at_a_time(lock_path: Path, waiting: Callable[[], None] = lambda: None
                  ) -> Iterator[None]:
    """Hold an exclusive advisory lock (`flock`, dropped by the kernel when the process ends,
    however it ends) on `lock_path` while the block runs, waiting for a process that holds
    it (`waiting` is called once, before the wait). A one-time preparation that two
    processes start at once (two terminals, two test workers, two scoring workers) then runs
    once: the second finds the first's result instead of writing the same temporary files
    beside it, which would tear both."""
    try:
        lock_path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        raise UserError(f"{lock_path}: cannot open the lock file ({exc.strerror})") from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            waiting()
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)
