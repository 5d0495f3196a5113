"""The daemon's HTTP endpoints: clock sync, live stream, Prometheus `/metrics`, status.

Standard library only (``http.server.ThreadingHTTPServer``), bound to 127.0.0.1 unless the
user says otherwise. Endpoints (GET):

* ``/clock``   — clock-sync exchange: the meter's CLOCK_MONOTONIC when the request arrived and
  just before the reply left (``t_recv_mono_ns``, ``t_send_mono_ns``), for NTP-style offset
  estimation by ``epi.core.clocksync.estimate_offset``.
* ``/stream``  — live samples and events as newline-delimited JSON (default) or server-sent
  events (``Accept: text/event-stream`` or ``?format=sse``); ``?channel=N`` (repeatable)
  filters, ``?limit=N`` ends after N samples.
* ``/metrics`` — Prometheus text exposition 0.0.4.
* ``/status``  — JSON snapshot: run information, counters, latest readings.
* ``/``        — JSON index of the endpoints.
"""

from __future__ import annotations

import ipaddress
import json
import socket
import sys
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

from epi.core.errors import UserError
from epi.formats.json_types import JSON
from meter.clock import Clock
from meter.daemon.live_stream import LiveHub, StreamKind
from meter.daemon.metrics import MeterState, render_prometheus

PROMETHEUS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8757
ENDPOINTS = {
    "/clock": "clock-sync exchange (JSON): t_recv_mono_ns, t_send_mono_ns, t_real_ns",
    "/stream": "live samples and events: NDJSON, or SSE with ?format=sse; ?channel=N, ?limit=N",
    "/metrics": "Prometheus text exposition",
    "/status": "JSON snapshot of the run",
}




def parse_listen(text: str) -> tuple[str, int]:
    """``HOST:PORT`` (IPv6 as ``[::1]:PORT``) → (host, port); UserError naming the option."""
    host, sep, port_text = text.rpartition(":")
    if not sep or not host:
        raise UserError(f"--listen {text!r}: expected HOST:PORT, e.g. 127.0.0.1:{DEFAULT_PORT}")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    try:
        port = int(port_text)
    except ValueError:
        raise UserError(f"--listen {text!r}: port {port_text!r} is not a number") from None
    if not 0 <= port <= 65535:
        raise UserError(f"--listen {text!r}: port {port} is outside 0..65535")
    return host, port


CONNECTION_TIMEOUT_S = 10.0  # a connection that sends nothing (half-open) is closed after this
LISTEN_BACKLOG = 512
STREAM_BUFFER_BYTES = 256 * 1024  # a stream client's unsent bytes at most; beyond, messages drop


def is_loopback(host: str) -> bool:
    """True for an address only this machine can reach."""
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    # the listen backlog: a burst of clients waits in the kernel, not in connect() retries
    # (socketserver's default of 5 held 400 connecting clients for a minute)
    request_queue_size = LISTEN_BACKLOG

    def handle_error(self, request: socket.socket | tuple[bytes, socket.socket],
                     client_address: object) -> None:
        """A client that went away is not an error worth a traceback in the daemon's log."""
        exc = sys.exc_info()[1]
        if isinstance(exc, (BrokenPipeError, ConnectionResetError, TimeoutError)):
            return
        super().handle_error(request, client_address)

    def __init__(self, address: tuple[str, int], owner: MeterServer) -> None:
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        self.owner = owner
        super().__init__(address, _Handler)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def setup(self) -> None:
        # a socket timeout on every read and write of this connection (a half-open client
        # must not keep a thread): the server's connection_timeout_s
        # typeshed declares `timeout` a ClassVar; socketserver reads it per instance, and this
        # connection's value is the server's setting
        self.timeout = self.server.owner.connection_timeout_s  # type: ignore[misc]
        super().setup()
    disable_nagle_algorithm = True  # else headers and body wait on delayed ACKs (~40 ms)
    server: _Server

    def log_message(self, format: str, *args: object) -> None:
        """Quiet: a scraper every few seconds must not flood the daemon's log."""

    # -- helpers ------------------------------------------------------------------------------
    def _send(self, code: int, body: bytes, content_type: str) -> None:
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _send_json(self, code: int, obj: object) -> None:
        body = (json.dumps(obj, allow_nan=False) + "\n").encode()
        self._send(code, body, "application/json")

    # -- routes -------------------------------------------------------------------------------
    def do_HEAD(self) -> None:
        self.do_GET()

    def do_GET(self) -> None:
        owner = self.server.owner
        t_recv = owner.clock.monotonic_ns()  # first thing: the clock-sync receive time
        parts = urlsplit(self.path)
        route = parts.path.rstrip("/") or "/"
        if route == "/clock":
            self._clock(t_recv)
        elif route == "/metrics":
            body = render_prometheus(
                owner.state, owner.clock.monotonic_ns(), owner.clock.realtime_ns()
            ).encode()
            self._send(200, body, PROMETHEUS_CONTENT_TYPE)
        elif route == "/stream":
            self._stream(parse_qs(parts.query))
        elif route == "/status":
            self._send_json(200, owner.state.snapshot())
        elif route == "/":
            self._send_json(200, {"endpoints": ENDPOINTS, **owner.state.info})
        else:
            self._send_json(404, {"error": f"no endpoint {parts.path}", "endpoints": ENDPOINTS})

    def do_POST(self) -> None:
        self._send_json(405, {"error": "only GET is supported", "endpoints": ENDPOINTS})

    def _clock(self, t_recv: int) -> None:
        owner = self.server.owner
        info = owner.state.info
        reply: dict[str, JSON] = {
            "t_recv_mono_ns": t_recv,
            "t_real_ns": owner.clock.realtime_ns(),
            "boot_id": info.get("boot_id"),
            "host": info.get("host"),
            "clock": info.get("clock_kind"),
        }
        reply["t_send_mono_ns"] = owner.clock.monotonic_ns()  # as late as possible
        self._send_json(200, reply)

    def _stream(self, query: dict[str, list[str]]) -> None:
        owner = self.server.owner
        try:
            channels = {int(c) for c in query.get("channel", [])}
            limit = int(query["limit"][0]) if "limit" in query else None
            heartbeat_s = float(query.get("heartbeat_s", ["1.0"])[0])
        except ValueError:
            self._send_json(400, {"error": "channel and limit must be integers"})
            return
        known = owner.state.channel_indices()
        unknown = sorted(channels - known)
        if unknown:
            self._send_json(400, {"error": f"no channel {unknown[0]} (channels: "
                                           f"{', '.join(str(c) for c in sorted(known))})"})
            return
        heartbeat_s = min(max(heartbeat_s, 0.05), 30.0)
        fmt = (query.get("format") or [""])[0]
        sse = fmt == "sse" or (not fmt and "text/event-stream" in self.headers.get("Accept", ""))
        sub = owner.hub.subscribe()
        self.close_connection = True
        if sub is None:
            self._send_json(503, {"error": f"{owner.hub.max_clients} stream clients follow "
                                           "already; try again later"})
            return
        try:
            self.send_response(200)
            self.send_header(
                "Content-Type", "text/event-stream" if sse else "application/x-ndjson"
            )
            self.send_header("Cache-Control", "no-store")
            self.send_header("Connection", "close")
            self.end_headers()
            out = _StreamOut(self.connection, sse, owner.connection_timeout_s)
            hello = {"type": StreamKind.HELLO, **owner.state.info,
                     "t_mono_ns": owner.clock.monotonic_ns()}
            out.add(StreamKind.HELLO, json.dumps(hello, allow_nan=False))
            delivered, dropped_told = 0, 0
            last_emit = time.monotonic()
            while (limit is None or delivered < limit) and out.flush():
                messages = sub.get(heartbeat_s)
                if sub.dropped > dropped_told:
                    gone = sub.dropped - dropped_told
                    dropped_told = sub.dropped
                    out.add(StreamKind.DROPPED,
                            json.dumps({"type": StreamKind.DROPPED, "count": gone}))
                if not messages and sub.closed:
                    break
                for msg in messages:
                    if channels and msg.channel is not None and msg.channel not in channels:
                        continue
                    if not out.add(msg.type, msg.json):
                        sub.dropped += 1  # the client does not read: its messages go
                        continue
                    last_emit = time.monotonic()
                    if msg.type == StreamKind.SAMPLE:
                        delivered += 1
                        if limit is not None and delivered >= limit:
                            break
                # every client gets heartbeats, whatever its filter lets through: a write is
                # also how a client that went away is noticed (and its thread ended)
                if time.monotonic() - last_emit >= heartbeat_s:
                    beat = {"type": StreamKind.HEARTBEAT, "t_mono_ns": owner.clock.monotonic_ns()}
                    out.add("heartbeat", json.dumps(beat))
                    last_emit = time.monotonic()
            out.drain()
        except (BrokenPipeError, ConnectionResetError, TimeoutError):
            pass  # the client went away: that ends its stream, nothing else
        finally:
            sub.close()


class _StreamOut:
    """A stream client's outgoing bytes, written without ever blocking the handler: what the
    socket does not take now waits in a bounded buffer; a full buffer refuses new messages
    (counted as dropped by the caller); a client that takes nothing for `stall_s` is closed."""

    def __init__(self, conn: socket.socket, sse: bool, stall_s: float) -> None:
        self.conn = conn
        conn.setblocking(False)  # with a timeout, send() would wait for room first
        self.sse = sse
        self.stall_s = stall_s
        self.pending = bytearray()
        self.progress = time.monotonic()

    def add(self, kind: str, text: str) -> bool:
        """Queue one message whole; False (nothing queued) when the buffer is full."""
        data = (f"event: {kind}\ndata: {text}\n\n" if self.sse else text + "\n").encode()
        if len(self.pending) + len(data) > STREAM_BUFFER_BYTES:
            return False
        self.pending += data
        return True

    def flush(self) -> bool:
        """Send what the socket takes now; False when the client is gone or stalled."""
        while self.pending:
            try:
                n = self.conn.send(self.pending)
            except (BlockingIOError, InterruptedError):
                return time.monotonic() - self.progress < self.stall_s
            except OSError:
                return False
            del self.pending[:n]
            self.progress = time.monotonic()
        self.progress = time.monotonic()
        return True

    def drain(self) -> None:
        """The last bytes (a `limit` reached), waiting for the client up to `stall_s`."""
        while self.flush() and self.pending:
            time.sleep(0.01)


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


class MeterServer:
    """The HTTP server in a background thread. ``port=0`` picks a free port (see ``url``)."""

    def __init__(
        self,
        host: str,
        port: int,
        *,
        state: MeterState,
        hub: LiveHub,
        clock: Clock,
        warn: Callable[[str], None] | None = None,
        connection_timeout_s: float = CONNECTION_TIMEOUT_S,
    ) -> None:
        self.connection_timeout_s = connection_timeout_s
        if not is_loopback(host):
            (warn or _stderr)(
                f"epi meter: warning: --listen {host}:{port} is reachable from other machines "
                f"and the endpoints have no authentication; bind 127.0.0.1 unless the network "
                f"is trusted"
            )
        self.state = state
        self.hub = hub
        self.clock = clock
        try:
            self._httpd = _Server((host, port), self)
        except OSError as exc:
            raise UserError(f"--listen {host}:{port}: cannot listen there ({exc})") from None
        self._thread: threading.Thread | None = None
        if self.state.stream_clients is None:
            self.state.stream_clients = lambda: self.hub.n_clients

    @property
    def address(self) -> tuple[str, int]:
        host, port = self._httpd.server_address[:2]
        return str(host), int(port)

    @property
    def url(self) -> str:
        host, port = self.address
        return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"

    def start(self) -> None:
        self._thread = threading.Thread(
            target=self._httpd.serve_forever,
            kwargs={"poll_interval": 0.2},
            name="meter-http",
            daemon=True,
        )
        self._thread.start()

    def stop(self) -> None:
        """End streams, stop serving and close the socket."""
        self.hub.close()
        if self._thread is not None:  # shutdown() waits for serve_forever: only if it runs
            self._httpd.shutdown()
            self._thread.join(timeout=5)
        self._httpd.server_close()

    def __enter__(self) -> MeterServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
