"""The client side of the daemon's `/stream`: one HTTP connection, one JSON message a line.

The daemon sends a heartbeat at least every second to every client, so a read that waits
longer than `idle_timeout_s` means the daemon is gone (or hung): the stream ends with that
reason instead of blocking for ever.
"""

from __future__ import annotations

import http.client
import json
from collections.abc import Iterator

from epi.core.errors import UserError
from epi.core.net import split_daemon_url
from epi.formats.json_types import JSONObject
from meter.daemon.live_stream import StreamKind


class StreamEnded(Exception):
    """The daemon closed the stream, went silent or sent something that is not its stream."""


class StreamClient:
    """An open `/stream` connection to a meter daemon."""

    def __init__(self, url: str, *, channels: tuple[int, ...] = (),
                 idle_timeout_s: float = 5.0) -> None:
        host, port, base = split_daemon_url(url)
        self.url = url
        query = "&".join(f"channel={c}" for c in channels)
        self._path = f"{base}/stream" + (f"?{query}" if query else "")
        self._conn = http.client.HTTPConnection(host, port, timeout=idle_timeout_s)
        self._resp: http.client.HTTPResponse | None = None

    def open(self) -> JSONObject:
        """Connect and return the daemon's `hello` (its run description)."""
        try:
            self._conn.request("GET", self._path, headers={"Accept": "application/x-ndjson"})
            resp = self._conn.getresponse()
        except (OSError, http.client.HTTPException) as exc:
            raise UserError(f"meter {self.url}: cannot reach /stream ({exc})") from None
        if resp.status != 200:
            body = resp.read(300).decode(errors="replace").strip()
            raise UserError(f"meter {self.url}: /stream answered HTTP {resp.status} ({body})")
        self._resp = resp
        try:
            hello = self._next()
        except StreamEnded as exc:
            raise UserError(f"meter {self.url}: /stream {exc}") from None
        if hello.get("type") != StreamKind.HELLO:
            raise UserError(f"meter {self.url}: /stream did not start with a hello (not an "
                            "epi meter daemon?)")
        return hello

    def _next(self) -> JSONObject:
        if self._resp is None:
            raise StreamEnded("not open")
        try:
            line = self._resp.readline()
        except TimeoutError:
            raise StreamEnded("went silent (no heartbeat)") from None
        except (OSError, http.client.HTTPException) as exc:
            raise StreamEnded(f"connection lost ({exc})") from None
        if not line:
            raise StreamEnded("closed by the daemon")
        try:
            msg = json.loads(line)
        except ValueError:
            raise StreamEnded(f"sent a line that is not JSON ({line[:60]!r})") from None
        if not isinstance(msg, dict):
            raise StreamEnded(f"sent a message that is not an object ({line[:60]!r})")
        return msg

    def messages(self) -> Iterator[JSONObject]:
        """Every message after the hello, until the stream ends (StreamEnded says why)."""
        while True:
            yield self._next()

    def close(self) -> None:
        self._conn.close()
