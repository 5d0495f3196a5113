"""Estimate the offset between this machine's CLOCK_MONOTONIC and a meter daemon's.

NTP-style, over the daemon's ``/clock`` endpoint: each exchange records local times t1 (sent)
and t4 (reply received) and the meter's t2 (request arrived) and t3 (reply left). Because
t1 ≤ t2 − offset and t3 − offset ≤ t4 hold for any network delays, every exchange bounds

    t3 − t4  ≤  offset  ≤  t2 − t1          (offset = meter monotonic − local monotonic)

and the intersection of the bounds of all exchanges is the round-trip filter: the estimate is
its middle and the uncertainty its half-width — a guaranteed bound, not a standard deviation,
as long as neither clock jumps during the few milliseconds of the exchanges. If clock-rate
differences make the bounds disagree, the exchange with the smallest round trip is used and
the disagreement is added to its uncertainty. Bounds that disagree by more than clock rates
can explain (MAX_RATE_PPM over the exchanges, at least MIN_DISAGREEMENT_NS) mean a clock
jumped, or the meter's answers are not times: the measurement is refused (`ClockJumpError`),
never reported with an uncertainty as wide as the jump.
"""

from __future__ import annotations

import http.client
import json
import time
from dataclasses import dataclass
from typing import TypedDict

from epi.core.errors import UserError
from epi.core.net import split_daemon_url

MAX_RATE_PPM = 200.0  # two monotonic clocks' rates differ by far less
MIN_DISAGREEMENT_NS = 1_000_000  # below this, disjoint bounds widen the uncertainty


class ClockJumpError(ValueError):
    """The exchanges' bounds disagree by more than clock rates allow: a clock jumped."""


class ClockSyncEntry(TypedDict):
    """A token log's ``clock_sync`` entry as the estimate gives it (the runner adds ``when``)."""

    t_local_mono_ns: int
    offset_ns: int
    uncertainty_ns: int
    rtt_ns: int
    meter_url: str


@dataclass(frozen=True)
class ClockOffset:
    """One offset estimate; ``offset_ns`` = meter monotonic − local monotonic."""

    t_local_mono_ns: int  # local monotonic time the estimate refers to (middle of the exchanges)
    offset_ns: int
    uncertainty_ns: int  # half-width of the guaranteed interval around offset_ns
    rtt_ns: int  # smallest round trip seen (network + server time)
    meter_url: str

    def as_dict(self) -> ClockSyncEntry:
        """The keys of a token log's ``clock_sync`` entry (the runner adds ``when``)."""
        return ClockSyncEntry(t_local_mono_ns=self.t_local_mono_ns, offset_ns=self.offset_ns,
                              uncertainty_ns=self.uncertainty_ns, rtt_ns=self.rtt_ns,
                              meter_url=self.meter_url)

    def to_meter_ns(self, t_local_mono_ns: int) -> int:
        """Map a local monotonic time into the meter's clock."""
        return t_local_mono_ns + self.offset_ns


@dataclass(frozen=True)
class Exchange:
    """One request/response: local send/receive, meter receive/send (ns)."""

    t1: int
    t2: int
    t3: int
    t4: int

    @property
    def low(self) -> int:
        return self.t3 - self.t4

    @property
    def high(self) -> int:
        return self.t2 - self.t1

    @property
    def rtt(self) -> int:
        return (self.t4 - self.t1) - (self.t3 - self.t2)


def combine(exchanges: list[Exchange], meter_url: str) -> ClockOffset:
    """The round-trip-filtered estimate from several exchanges (see the module docstring)."""
    if not exchanges:
        raise ValueError("no clock exchanges to combine")
    low = max(e.low for e in exchanges)
    high = min(e.high for e in exchanges)
    best = min(exchanges, key=lambda e: e.rtt)
    if low <= high:
        offset = (low + high) // 2
        uncertainty = (high - low + 1) // 2
    else:
        span_ns = max(exchanges[-1].t4 - exchanges[0].t1, 0)
        allowed = max(MIN_DISAGREEMENT_NS, round(span_ns * MAX_RATE_PPM * 1e-6))
        if low - high > allowed:
            raise ClockJumpError(
                f"the meter's clock answers disagree by {(low - high) / 1e6:.3f} ms over "
                f"{span_ns / 1e6:.1f} ms of exchanges (clock rates explain at most "
                f"{allowed / 1e6:.3f} ms): a clock jumped; measurement refused, run it again")
        offset = (best.low + best.high) // 2
        uncertainty = (best.high - best.low + 1) // 2 + (low - high)
    t_mid = (exchanges[0].t1 + exchanges[-1].t4) // 2
    return ClockOffset(
        t_local_mono_ns=t_mid,
        offset_ns=offset,
        uncertainty_ns=max(uncertainty, 1),
        rtt_ns=best.rtt,
        meter_url=meter_url,
    )


def _split_url(url: str) -> tuple[str, int, str]:
    """(host, port, path of /clock) for a daemon URL, with or without /clock at its end."""
    host, port, base = split_daemon_url(url)
    if base.endswith("/clock"):
        base = base[: -len("/clock")]
    return host, port, base + "/clock"


def _exchange(conn: http.client.HTTPConnection, path: str) -> Exchange:
    t1 = time.monotonic_ns()
    conn.request("GET", path, headers={"Accept": "application/json"})
    resp = conn.getresponse()
    body = resp.read()
    t4 = time.monotonic_ns()
    if resp.status != 200:
        raise ValueError(f"HTTP {resp.status} from {path}")
    reply = json.loads(body)
    return Exchange(t1, int(reply["t_recv_mono_ns"]), int(reply["t_send_mono_ns"]), t4)


def estimate_offset(url: str, *, samples: int = 16, timeout_s: float = 2.0) -> ClockOffset:
    """Estimate the meter-minus-local monotonic offset with ``samples`` exchanges.

    Raises UserError (one line) when the meter cannot be reached or does not answer like an
    epi meter daemon.
    """
    if samples < 1:
        raise UserError(f"clock sync: samples must be at least 1, got {samples}")
    host, port, path = _split_url(url)
    conn = http.client.HTTPConnection(host, port, timeout=timeout_s)
    try:
        _exchange(conn, path)  # warm-up: connection set-up and first-request costs
        exchanges = [_exchange(conn, path) for _ in range(samples)]
    except http.client.HTTPException as exc:
        # something answered, but not in HTTP (another service on that port): say so, and
        # never echo its raw bytes (NULs, carriage returns) to the terminal
        raw = ascii(str(exc))[:60]
        raise UserError(f"meter {url}: something answered, but not in HTTP "
                        f"({type(exc).__name__}: {raw}); is this the epi meter daemon's "
                        "address and port?") from None
    except OSError as exc:
        raise UserError(f"meter {url}: cannot reach the clock-sync endpoint ({exc})") from None
    except (ValueError, KeyError, TypeError) as exc:
        raise UserError(f"meter {url}: {path} did not answer like an epi meter ({exc})") from None
    finally:
        conn.close()
    try:
        return combine(exchanges, url)
    except ClockJumpError as exc:
        raise UserError(f"meter {url}: {exc}") from None
