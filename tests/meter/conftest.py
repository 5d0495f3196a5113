"""Shared fixtures for the meter daemon tests: clocks with a known offset, a running server."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from meter.daemon.http_server import MeterServer
from meter.daemon.live_stream import LiveHub
from meter.daemon.metrics import ChannelInfo, MeterState


class OffsetClock:
    """The system clocks shifted by a fixed offset: a 'meter' whose clock differs from ours."""

    def __init__(self, offset_ns: int) -> None:
        self.offset_ns = offset_ns

    def monotonic_ns(self) -> int:
        return time.monotonic_ns() + self.offset_ns

    def realtime_ns(self) -> int:
        return time.time_ns()

    def sleep_until(self, t_mono_ns: int) -> None:
        time.sleep(max(0.0, (t_mono_ns - self.monotonic_ns()) / 1e9))


def make_state(n_channels: int = 2) -> MeterState:
    chans = [ChannelInfo(i, f"node{i}", f"pi{i}" if i else None) for i in range(n_channels)]
    info = {
        "daemon_version": "test",
        "host": "testhost",
        "boot_id": "boot-1",
        "emulated": True,
        "power_model_kind": "scripted",
        "clock_kind": "system",
        "segment": 1,
        "sample_period_s": 0.05,
        "started_real_ns": time.time_ns(),
    }
    return MeterState(chans, info)


@pytest.fixture
def offset_clock() -> type[OffsetClock]:
    """The OffsetClock class (test modules cannot import conftest under importlib mode)."""
    return OffsetClock


@pytest.fixture
def meter_state() -> MeterState:
    """A two-channel daemon state with no samples yet."""
    return make_state()


@pytest.fixture
def offset_server(request: pytest.FixtureRequest) -> Iterator[MeterServer]:
    """A MeterServer on a free loopback port whose monotonic clock is offset by `param` ns."""
    offset = getattr(request, "param", 0)
    server = MeterServer(
        "127.0.0.1", 0, state=make_state(), hub=LiveHub(), clock=OffsetClock(offset)
    )
    server.start()
    try:
        yield server
    finally:
        server.stop()
