"""The daemon (not just its trace writer) on a full disk, and what it says about its bus rate.

The full disk is the injected ENOSPC of tests/meter/test_trace_storage_faults.py (``FullDisk``:
``os.write`` fails while ``room`` is 0). Every wait is on a condition, with a deadline.
"""

from __future__ import annotations

import threading
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from epi.formats.trace import read_trace
from meter.clock import SimulatedClock
from meter.daemon import trace as trace_mod
from meter.daemon.service import DaemonOptions, MeterDaemon
from meter.emulation.power_models import ConstantPower
from tests.meter.test_trace_storage_faults import FullDisk


def _wait_for(what: str, cond: Callable[[], bool], timeout_s: float = 30.0) -> None:
    gate = threading.Event()
    for _ in range(int(timeout_s / 0.02)):
        if cond():
            return
        gate.wait(0.02)
    raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}")


def _metrics(url: str) -> dict[str, list]:
    with urllib.request.urlopen(url + "/metrics", timeout=10) as resp:
        text = resp.read().decode()
    return {f.name: f.samples for f in text_string_to_metric_families(text)}


def _disk_full_counts(fams: dict[str, list]) -> dict[str, float]:
    return {s.labels["channel"]: s.value for s in fams.get("epi_meter_faults", [])
            if s.labels.get("kind") == "disk_full"}


@pytest.mark.long
def test_daemon_on_a_full_disk_keeps_sampling_counts_drops_and_resumes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    disk = FullDisk(monkeypatch, trace_mod)
    opts = DaemonOptions(out_dir=tmp_path, emulate=True, listen="127.0.0.1:0",
                         power_model=ConstantPower(9.0), rate_hz=20, stats_interval_s=0.5)
    daemon = MeterDaemon(opts, log=lambda _line: None)
    thread = threading.Thread(target=daemon.run)
    thread.start()
    try:
        assert daemon.ready.wait(30)
        sampler, url = daemon.sampler, daemon.server.url  # type: ignore[union-attr]
        assert sampler is not None
        _wait_for("rows on disk", lambda: sampler.stats.samples_written >= 20)
        # no disk_full before the disk fills (each channel's counter there, at 0)
        assert _disk_full_counts(_metrics(url)) == {"0": 0.0, "1": 0.0, "2": 0.0, "3": 0.0}
        disk.room = 0  # the trace's file system is full from now on
        _wait_for("dropped rows", lambda: sampler.stats.samples_dropped >= 40)
        full = _metrics(url)
        # sampling goes on: sweeps and live samples keep coming while nothing can be written
        written_while_full = sampler.stats.samples_written
        sweeps = full["epi_meter_sweeps"][0].value
        _wait_for("sweeps while full", lambda: sampler.stats.sweeps >= sweeps + 10)
        assert sampler.stats.samples_written == written_while_full
        # one disk_full episode, counted on every channel (the board-wide fault)
        assert _disk_full_counts(full) == {"0": 1.0, "1": 1.0, "2": 1.0, "3": 1.0}
        dropped = sampler.stats.samples_dropped
        disk.room = None  # space is back
        _wait_for("writing again", lambda: sampler.stats.samples_written
                  >= written_while_full + 20)
        assert sampler.stats.samples_dropped >= dropped
        assert _disk_full_counts(_metrics(url)) == {"0": 1.0, "1": 1.0, "2": 1.0, "3": 1.0}
    finally:
        disk.room = None
        daemon.stop()
        thread.join(30)
    assert not thread.is_alive()
    trace = read_trace(tmp_path)
    stats = trace.segments[0].meta["stats"]
    assert stats["clean_stop"] is True
    assert stats["samples_dropped"] == sampler.stats.samples_dropped > 0
    assert stats["faults"]["disk_full"] == 1
    rows = list(trace.samples())
    assert len(rows) == stats["samples_written"] == sampler.stats.samples_written
    (event,) = [e for e in trace.events() if e["kind"] == "disk_full"]
    (gap,) = [g for g in trace.gaps if g.source == "event" and "disk full" in g.reason]
    assert f"{stats['samples_dropped']} sample row(s)" in gap.reason
    # rows before the gap, none inside it, rows after it
    times = [r["t_mono_ns"] for r in rows]
    assert min(times) < gap.start_mono_ns and max(times) > gap.end_mono_ns
    assert not [t for t in times if gap.start_mono_ns <= t < gap.end_mono_ns]
    assert event["t_mono_ns"] == gap.start_mono_ns


def test_meta_stats_carry_the_rate_the_bus_sustains_as_it_runs(tmp_path: Path) -> None:
    """Four emulated chips on a simulated clock: a sweep is 4 readings × 34 frames × 24 bits at
    160 kHz = 20.4 ms, so the bus as driven sustains 160 000 / 3264 = 49.02 sweeps/s."""
    clock = SimulatedClock()
    opts = DaemonOptions(out_dir=tmp_path, emulate=True, duration_s=3.0, listen=None,
                         clock=clock, power_model=ConstantPower(5.0))
    MeterDaemon(opts, log=lambda _line: None).run()
    stats = read_trace(tmp_path).segments[0].meta["stats"]
    assert stats["sustainable_rate_hz"] == pytest.approx(160_000 / (4 * 34 * 24), rel=1e-9)


@pytest.mark.long
def test_each_disk_full_episode_counts_its_own_drops_and_a_stop_while_full_keeps_meta_right(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Regression: the second episode's event used to say the drops of both episodes, and a stop
    while the disk was full left meta.json at its last checkpoint (clean_stop false, old
    counts). Freeing a file gives its bytes back to the fake disk, as a file system does."""
    import os

    disk = FullDisk(monkeypatch, trace_mod)
    real_unlink = os.unlink

    def unlink(path: str | os.PathLike[str], *args: object, **kwargs: object) -> None:
        size = os.stat(path).st_size if os.path.exists(path) else 0
        real_unlink(path)
        if disk.room is not None:
            disk.room += size

    monkeypatch.setattr(os, "unlink", unlink)
    opts = DaemonOptions(out_dir=tmp_path, emulate=True, listen=None,
                         power_model=ConstantPower(9.0), rate_hz=20, stats_interval_s=0.5)
    daemon = MeterDaemon(opts, log=lambda _line: None)
    thread = threading.Thread(target=daemon.run)
    thread.start()
    try:
        assert daemon.ready.wait(30)
        sampler = daemon.sampler
        assert sampler is not None
        stats = sampler.stats
        _wait_for("rows on disk", lambda: stats.samples_written >= 20)
        disk.room = 0
        _wait_for("first episode", lambda: getattr(stats, "samples_dropped", 0) >= 40)
        written = stats.samples_written
        disk.room = None
        _wait_for("writing again", lambda: stats.samples_written >= written + 20)
        first = getattr(stats, "samples_dropped", 0)
        disk.room = 0
        _wait_for("second episode", lambda: getattr(stats, "samples_dropped", 0) >= first + 24)
        daemon.stop()  # while the disk is still full
        thread.join(30)
    finally:
        disk.room = None
        daemon.stop()
        thread.join(30)
    assert not thread.is_alive()
    trace = read_trace(tmp_path)
    seg = trace.segments[0]
    final = seg.meta["stats"]
    total = getattr(stats, "samples_dropped", 0)
    assert final["clean_stop"] is True
    assert final["sweeps"] == stats.sweeps and final["samples_dropped"] == total
    assert final["samples_written"] == len(list(trace.samples())) == stats.samples_written
    details = [e.detail for e in seg.events if e.kind == "disk_full"]
    assert len(details) == 2
    assert f": {first} sample row(s)" in details[0]
    assert f": {total - first} sample row(s)" in details[1]
    assert seg.events[-1].kind == "stop"
    assert not list(tmp_path.glob(".*reserve"))
