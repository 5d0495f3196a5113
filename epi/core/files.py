"""Small file utilities both halves share: atomic JSON writes and the kernel boot id.

Standard library only, so the meter side (a Pi, or the board's MCU tools) and the analysis host
import the same code.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path


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
