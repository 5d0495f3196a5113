"""Network helpers both halves share (standard library only)."""

from __future__ import annotations

import socket
from urllib.parse import urlsplit

from epi.core.errors import UserError


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free right now on `host` (for local workers and daemons)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def split_daemon_url(url: str) -> tuple[str, int, str]:
    """(host, port, base path) of a meter daemon URL `http://HOST:PORT[/base]`; a one-line
    `UserError` for anything else. The clock-sync client and `epi meter watch` both use it."""
    parts = urlsplit(url)
    if parts.scheme != "http" or not parts.hostname:
        raise UserError(f"meter URL {url!r}: expected http://HOST:PORT (the daemon's --listen)")
    try:
        port = parts.port or 80
    except ValueError:
        raise UserError(f"meter URL {url!r}: the port is not a number") from None
    return parts.hostname, port, parts.path.rstrip("/")
