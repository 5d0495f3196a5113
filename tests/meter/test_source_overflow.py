"""A software counter that overflows is one failed reading — a read_error event,
then a gap when it recovers — never an exception that ends the source's thread for the rest
of the recording. Generated values: any decimal text in a counter file is either a number the
poller uses or a failed reading, and the poller keeps going."""

from __future__ import annotations

import pathlib
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from meter.sources.rapl import RaplSource
from meter.sources.recorder import SourcePoller
from tests.meter.sources_fakes import ListWriter, StepClock, rapl_tree, set_uj

ZONE = "intel-rapl:0"


def _energy_file(root: pathlib.Path) -> pathlib.Path:
    return root / "sys/class/powercap" / ZONE / "energy_uj"


def test_an_overflowing_counter_is_a_failed_reading_then_a_gap(tmp_path: pathlib.Path
                                                                ) -> None:
    rapl_tree(tmp_path)
    clock, writer = StepClock(), ListWriter()
    poller = SourcePoller(RaplSource(tmp_path), 4, clock)
    poller.start_without_thread(writer)
    poller.poll_once()
    clock.advance(0.1)
    _energy_file(tmp_path).write_text("9" * 400 + "\n")  # float() of it raised OverflowError
    poller.poll_once()
    errors = [e for e in writer.events if e[3] == "read_error"]
    assert len(errors) == 1 and "overflows a 64-bit counter" in errors[0][4], writer.events
    clock.advance(0.1)
    set_uj(tmp_path, ZONE, 3_000_000)
    poller.poll_once()
    assert any(e[3] == "gap" and "resumed after read_error" in e[4] for e in writer.events)


def test_the_thread_keeps_sampling_after_an_overflow(tmp_path: pathlib.Path) -> None:
    rapl_tree(tmp_path)
    from meter.clock import SystemClock

    writer = ListWriter()
    poller = SourcePoller(RaplSource(tmp_path), 4, SystemClock())
    poller.start(writer)
    try:
        time.sleep(0.25)
        _energy_file(tmp_path).write_text("9" * 400 + "\n")
        time.sleep(0.3)
        assert poller.error is None, poller.error
        assert poller._thread is not None and poller._thread.is_alive()
        polls = poller.polls
        time.sleep(0.3)
        assert poller.polls > polls  # still polling
    finally:
        poller.stop()


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=st.one_of(st.integers(min_value=-(1 << 80), max_value=1 << 80).map(str),
                      st.integers(min_value=10**300, max_value=10**400).map(str),
                      st.text(alphabet="0123456789-+e. ", max_size=30)))
def test_any_counter_text_is_a_reading_or_a_failed_reading(
        tmp_path_factory: pytest.TempPathFactory, text: str) -> None:
    tmp_path = tmp_path_factory.mktemp("rapl")
    rapl_tree(tmp_path)
    clock, writer = StepClock(), ListWriter()
    poller = SourcePoller(RaplSource(tmp_path), 4, clock)
    poller.start_without_thread(writer)
    poller.poll_once()
    clock.advance(0.1)
    _energy_file(tmp_path).write_text(text + "\n")
    poller.poll_once()  # never raises
    clock.advance(0.1)
    set_uj(tmp_path, ZONE, 5_000_000)
    poller.poll_once()
