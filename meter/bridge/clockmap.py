"""MCU time -> Pi CLOCK_MONOTONIC, fitted from time-sync ping exchanges.

A ping is sent at Pi time `t_send`, the firmware answers with its clock `t_mcu` (64-bit µs)
and the answer arrives at `t_recv`. Both lines spend known time on the wire (bytes × 10 /
baud); what is left of the round trip is the unknown part (the MCU finishing a sweep before
it reads the command, the answer queued behind a telemetry line, USB/pty latency). So the MCU
read its clock somewhere in [t_send + wire_req, t_recv − wire_reply]: the middle of that span
is the estimate, half its width the bound.

Filter and fit: the pings of the window (the last `window_s` seconds of MCU time) are cut
into `buckets` time slices; the narrowest ping of each slice competes, and the narrower half
of those is kept; then a straight line t_pi = a + s·(t_mcu − ref) is
fitted by least squares, weighted by 1/span². Its slope gives the drift of the MCU crystal
(s = 1000 ns/µs at zero drift); with fewer than `min_for_drift` kept pings or less than
`min_span_s` of MCU time the slope is held at 1000 ns/µs. The mapping's uncertainty is the
narrowest kept half-span plus the RMS residual, plus the slope's own uncertainty times the
distance from the fitted span.

Standard library only (the meter side of epi needs no numpy).
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass


@dataclass(frozen=True)
class Ping:
    t_send_ns: int
    t_mcu_us: int
    t_recv_ns: int
    mid_ns: float
    half_ns: float

    @property
    def rtt_ns(self) -> int:
        return self.t_recv_ns - self.t_send_ns


@dataclass(frozen=True)
class Mapping:
    """t_mono_ns = offset_ns + slope_ns_per_us · (t_us − ref_us)."""

    ref_us: int
    offset_ns: float
    slope_ns_per_us: float
    uncertainty_ns: float
    n_pings: int
    n_used: int
    span_s: float
    best_half_ns: float
    drift_fitted: bool

    @property
    def drift_ppm(self) -> float:
        """How much faster the MCU clock runs than the Pi's, ppm."""
        return (1000.0 / self.slope_ns_per_us - 1.0) * 1e6

    def to_mono_ns(self, t_us: int) -> int:
        return round(self.offset_ns + self.slope_ns_per_us * (t_us - self.ref_us))

    def uncertainty_at(self, t_us: int) -> float:
        return self.uncertainty_ns

    def describe(self) -> dict:
        return {
            "ref_mcu_us": self.ref_us,
            "ref_mono_ns": round(self.offset_ns),
            "slope_ns_per_us": self.slope_ns_per_us,
            "drift_ppm": round(self.drift_ppm, 3),
            "uncertainty_ns": round(self.uncertainty_ns),
            "pings": self.n_pings,
            "pings_used": self.n_used,
            "span_s": round(self.span_s, 3),
            "best_half_rtt_ns": round(self.best_half_ns),
            "drift_fitted": self.drift_fitted,
        }


class ClockMapper:
    """Collects pings of one MCU boot and fits the mapping."""

    def __init__(self, *, window_s: float = 600.0, keep_fraction: float = 0.5,
                 buckets: int = 32, min_for_drift: int = 4, min_span_s: float = 2.0,
                 max_pings: int = 2000) -> None:
        self.buckets = buckets
        self.window_us = round(window_s * 1e6)
        self.keep_fraction = keep_fraction
        self.min_for_drift = min_for_drift
        self.min_span_us = round(min_span_s * 1e6)
        self.pings: deque[Ping] = deque(maxlen=max_pings)
        self.mapping: Mapping | None = None

    def add(self, t_send_ns: int, t_mcu_us: int, t_recv_ns: int, *, wire_req_ns: int = 0,
            wire_reply_ns: int = 0) -> Ping | None:
        """Record one exchange; None if it is impossible (answer before question)."""
        lo = t_send_ns + wire_req_ns
        hi = t_recv_ns - wire_reply_ns
        if t_recv_ns <= t_send_ns:
            return None
        if hi < lo:  # the wire-time model overshoots (a faster link): use the raw round trip
            lo, hi = t_send_ns, t_recv_ns
        ping = Ping(t_send_ns, t_mcu_us, t_recv_ns, (lo + hi) / 2.0, (hi - lo) / 2.0)
        self.pings.append(ping)
        return ping

    def fit(self) -> Mapping | None:
        """Refit from the window; returns (and keeps) the new mapping, None without pings."""
        if not self.pings:
            return None
        newest = self.pings[-1].t_mcu_us
        window = [p for p in self.pings if newest - p.t_mcu_us <= self.window_us]
        # the narrowest ping of each of `buckets` time slices, so the kept pings span the
        # window; of those, the narrower half (the rest waited behind a sweep or a line)
        lo_us, hi_us = window[0].t_mcu_us, newest
        width = max(1, (hi_us - lo_us) // self.buckets + 1)
        per_bucket: dict[int, Ping] = {}
        for p in window:
            b = (p.t_mcu_us - lo_us) // width
            if b not in per_bucket or p.half_ns < per_bucket[b].half_ns:
                per_bucket[b] = p
        ranked = sorted(per_bucket.values(), key=lambda p: p.half_ns)
        n_keep = max(1, min(len(ranked), math.ceil(len(ranked) * self.keep_fraction)))
        kept = ranked[:n_keep]
        best = kept[0].half_ns
        floor = max(best, 1000.0)  # weights: spans narrower than 1 µs are not better
        ws = [1.0 / max(p.half_ns, floor) ** 2 for p in kept]
        ref = newest
        xs = [p.t_mcu_us - ref for p in kept]
        ys = [p.mid_ns for p in kept]
        wsum = sum(ws)
        xm = sum(w * x for w, x in zip(ws, xs, strict=True)) / wsum
        ym = sum(w * y for w, y in zip(ws, ys, strict=True)) / wsum
        sxx = sum(w * (x - xm) ** 2 for w, x in zip(ws, xs, strict=True))
        span_us = max(xs) - min(xs)
        fitted = len(kept) >= self.min_for_drift and span_us >= self.min_span_us and sxx > 0
        if fitted:
            slope = sum(w * (x - xm) * (y - ym) for w, x, y in zip(ws, xs, ys, strict=True)) / sxx
        else:
            slope = 1000.0
        offset = ym + slope * (0 - xm)  # at x = 0, i.e. t_mcu = ref
        res = [y - (offset + slope * x) for x, y in zip(xs, ys, strict=True)]
        rms = math.sqrt(sum(r * r for r in res) / len(res))
        unc = best + rms
        if not fitted:
            # unknown drift: up to 100 ppm over the distance from the pings
            unc += 100e-3 * (max(abs(x) for x in xs) if xs else 0)
        self.mapping = Mapping(ref, offset, slope, unc, len(self.pings), len(kept),
                               span_us / 1e6, best, fitted)
        return self.mapping
