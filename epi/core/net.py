"""Network helpers both halves share (standard library only)."""

from __future__ import annotations

import socket


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free right now on `host` (for local workers and daemons)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])
