"""One recording session: everything a trace segment needs, whatever feeds it.

The daemon on direct SPI, the MCU bridge recorder and the software-sources recorder all write
the same kind of trace directory. What they share lives here, once:

* the directory's **lock**, taken when the session is created (before any chip is touched: a
  second daemon on the same directory is refused without disturbing the first one's board);
* the segment's **meta.json** common keys (version, host, boot id, pid, start times, clock,
  listen URL, a zero ``stats`` block) around the keys the feeder adds;
* the **trace writer**, a ``gap`` event when the segment continues an earlier one (a restart,
  or a reboot: the monotonic clocks then differ), and the ``start`` event;
* the **HTTP state** (`MeterState`, the live hub and the server: clock sync, /stream,
  /metrics, /status), its ``info`` filled from meta.json;
* **checkpoints** (SIGHUP: a ``signal`` event and the statistics into meta.json, sampling goes
  on) and the periodic **statistics**;
* the **stop**: a ``stop`` event and the final statistics (``clean_stop = true``), or, after a
  failure, the statistics so far flagged as not a clean stop.

What feeds it (a `Sampler` over chips, a `BridgeRecorder` over a serial link, software
counters) is chosen above it and attached as a `Feeder`; the session never imports them.
"""

from __future__ import annotations

import contextlib
import os
import socket
import sys
import threading
import uuid
import weakref
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Protocol

from epi import __version__
from epi.core.files import read_boot_id
from epi.formats.json_types import JSON, as_json
from meter.clock import Clock, describe_clock, is_simulated
from meter.daemon.http_server import MeterServer, parse_listen
from meter.daemon.live_stream import LiveHub
from meter.daemon.metrics import ChannelInfo, MeterState
from meter.daemon.trace import TraceLock, TraceWriter, gap_detail

_simulated_ids: weakref.WeakKeyDictionary[Clock, str] = weakref.WeakKeyDictionary()


def clock_boot_id(clock: Clock) -> str | None:
    """The ``boot_id`` of a trace written with this clock.

    The machine's boot id says "this CLOCK_MONOTONIC"; a simulated clock is not that clock,
    so it gets an id of its own (the same for every run that shares the clock object).
    """
    if not is_simulated(clock):
        return read_boot_id()
    try:
        if clock not in _simulated_ids:
            _simulated_ids[clock] = f"simulated:{uuid.uuid4()}"
        return _simulated_ids[clock]
    except TypeError:  # not weak-referenceable: one id per call
        return f"simulated:{uuid.uuid4()}"


class FeederStats(Protocol):
    """The counters a feeder keeps (written into meta.json under ``stats``)."""

    @property
    def sweeps(self) -> int: ...

    @property
    def samples_written(self) -> int: ...

    def as_dict(self) -> Mapping[str, object]: ...


class Feeder(Protocol):
    """What fills the session's trace: stopped and woken for a checkpoint from any thread
    (a signal handler included: neither may write anything itself)."""

    @property
    def stats(self) -> FeederStats: ...

    def stop(self) -> None: ...

    def request_checkpoint(self) -> None: ...


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def write_restart_gap(writer: TraceWriter, started: tuple[int, int]) -> None:
    """A ``gap`` event from the previous segment's last sample to this segment's start, in
    the monotonic clock when both segments share a boot, else at this start (the clocks of two
    boots cannot be compared) with the previous last sample's wall-clock time in the text."""
    prev = writer.previous
    if prev is None:
        return
    how = "cleanly" if prev.clean_stop else "without a clean stop (crash, kill or power loss)"
    if prev.boot_id is not None and prev.boot_id == writer.meta.get("boot_id"):
        writer.write_event(
            prev.t_mono_ns, prev.t_real_ns, None, "gap",
            gap_detail(started[0], started[1],
                       f"daemon restart: segment {prev.segment} ended {how}"),
        )
    else:
        writer.write_event(
            started[0], started[1], None, "gap",
            gap_detail(
                started[0], started[1],
                f"daemon restart after a reboot: segment {prev.segment} ended {how}, its "
                f"last sample at t_real_ns={prev.t_real_ns} (monotonic clocks differ)",
            ),
        )


class RecordingSession:
    """Lock, meta, writer, gaps, HTTP state, checkpoints and statistics of one segment.

    Use as a context manager: leaving it stops the server and releases the lock; leaving it by
    an exception closes the segment with the statistics so far, flagged as not a clean stop
    (or, when no segment was begun, removes the trace directory it created).
    """

    def __init__(self, out_dir: str | os.PathLike[str], clock: Clock, *,
                 log: Callable[[str], None] = _stderr,
                 ready: threading.Event | None = None) -> None:
        self.out_dir = Path(out_dir)
        self.clock = clock
        self.log = log
        self.lock = TraceLock(self.out_dir)
        self.hub = LiveHub()
        self.state = MeterState([], {})
        self.server: MeterServer | None = None
        self.url: str | None = None
        self.writer: TraceWriter | None = None
        self.feeder: Feeder | None = None
        self.started: tuple[int, int] | None = None
        # set once the feeder is attached (for tests and callers)
        self.ready = ready if ready is not None else threading.Event()
        self.checkpoint_requested = threading.Event()
        self._stopping = threading.Event()
        self._finished = False

    # -- set-up -------------------------------------------------------------------------------
    def serve(self, listen: str | None, channels: Sequence[ChannelInfo]) -> str | None:
        """The HTTP state of these channels, and the server when `listen` is given (started
        by `run_feeder`, once the segment exists); returns its URL."""
        self.state = MeterState(list(channels), {})
        if listen:
            host, port = parse_listen(listen)
            self.server = MeterServer(host, port, state=self.state, hub=self.hub,
                                      clock=self.clock)
            self.url = self.server.url
        return self.url

    def now(self) -> tuple[int, int]:
        return self.clock.monotonic_ns(), self.clock.realtime_ns()

    def warn_damaged_trace(self) -> None:
        """Say so before appending a segment to a trace whose earlier segments its own reader
        refuses: the new segment is written beside them (nothing is lost or overwritten), and
        `epi analyze` will name the damage until it is repaired."""
        from epi.core.errors import UserError
        from epi.formats.fields import read_json_object
        from epi.formats.trace import check_meta, existing_segments, segment_paths

        if not self.out_dir.is_dir():
            return
        # each segment's meta.json, checked by the reader's own rule (the samples are not
        # re-read: a long trace would delay the restart, and its gap, by minutes)
        try:
            for n in existing_segments(self.out_dir):
                meta_path = segment_paths(self.out_dir, n)[0]
                if meta_path.exists():
                    check_meta(meta_path, read_json_object(meta_path, "segment meta"), n)
        except UserError as exc:
            self.log(f"epi meter: warning: the trace in {self.out_dir} already holds a segment "
                     f"its reader refuses ({exc}); the new segment is appended beside it, "
                     "and `epi analyze` will refuse the trace until that segment is repaired "
                     "or moved out")

    def common_meta(self, started: tuple[int, int]) -> dict[str, JSON]:
        """The meta.json keys every segment has, whatever feeds it."""
        return {
            "daemon_version": __version__,
            "host": socket.gethostname(),
            "boot_id": clock_boot_id(self.clock),
            "pid": os.getpid(),
            "started_mono_ns": started[0],
            "started_real_ns": started[1],
            "clock": describe_clock(self.clock),
            "listen": self.url,
            # the full stats block from the start: a segment killed before its first stats
            # rewrite still says what it is (zero counts, not a clean stop)
            "stats": {"clean_stop": False},
        }

    def begin(self, meta: Mapping[str, object], start_detail: str, *,
              started: tuple[int, int] | None = None) -> TraceWriter:
        """A new segment: meta.json (the common keys, then `meta`), a restart gap when it
        continues an earlier segment, and the ``start`` event."""
        started = started if started is not None else self.now()
        self.started = started
        self.warn_damaged_trace()
        full = {**self.common_meta(started), **meta}
        writer = TraceWriter(self.out_dir, full, lock=self.lock)
        self.writer = writer
        write_restart_gap(writer, started)
        writer.write_event(started[0], started[1], None, "start",
                           f"epi meter {__version__}: {start_detail}; segment {writer.segment}")
        written = writer.meta
        power_model = written.get("power_model")
        clock_info = written.get("clock")
        self.state.info.update({
            "daemon_version": __version__,
            "host": as_json(written.get("host"), "meta host"),
            "boot_id": as_json(written.get("boot_id"), "meta boot_id"),
            "emulated": bool(written.get("emulated")),
            "bridged": bool(written.get("bridged")),
            "power_model_kind": power_model.get("kind") if isinstance(power_model, dict)
            else None,
            # where `epi run --meter` on this machine registers its PID for the emulated
            # power model to follow (null when no model follows a registered run)
            "follow_file": registered_follow_file(power_model),
            "clock_kind": clock_info.get("kind", "system") if isinstance(clock_info, dict)
            else "system",
            "segment": writer.segment,
            "sample_period_s": as_json(written.get("sample_period_s"), "meta sample_period_s"),
            "started_real_ns": started[1],
            "trace_dir": str(self.out_dir.resolve()),
        })
        return writer

    # -- control (any thread, signal handlers included) ---------------------------------------
    def stop(self) -> None:
        self._stopping.set()
        if self.feeder is not None:
            self.feeder.stop()

    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()

    def request_checkpoint(self) -> None:
        """SIGHUP: a ``signal`` event and the statistics at the feeder's next stats call."""
        self.checkpoint_requested.set()
        if self.feeder is not None:
            self.feeder.request_checkpoint()

    # -- running ------------------------------------------------------------------------------
    def attach(self, feeder: Feeder) -> None:
        """The feeder whose statistics the session saves; stopped at once if a stop came
        before it existed. Starts the HTTP server and sets `ready`."""
        self.feeder = feeder
        if self._stopping.is_set():
            feeder.stop()
        if self.checkpoint_requested.is_set():
            feeder.request_checkpoint()
        if self.server is not None:
            self.server.start()
        self.ready.set()

    def stats_dict(self, stats: FeederStats | None, *, clean: bool) -> dict[str, JSON]:
        """meta.json's ``stats``: the feeder's counts, checked to be JSON as they are taken."""
        counts = stats.as_dict() if stats is not None else {}
        return {
            "clean_stop": clean,
            "updated_mono_ns": self.clock.monotonic_ns(),
            **{k: as_json(v, f"stats.{k}") for k, v in counts.items()},
        }

    def save_stats(self, stats: FeederStats, **meta_updates: object) -> None:
        """The statistics (and the feeder's other meta keys) into meta.json; after a SIGHUP,
        first a ``signal`` event (the checkpoint)."""
        writer = self._writer()
        if self.checkpoint_requested.is_set():
            self.checkpoint_requested.clear()
            t = self.now()
            writer.write_event(t[0], t[1], None, "signal",
                               "SIGHUP: statistics checkpointed into meta.json; sampling goes on")
            self.log(f"epi meter: SIGHUP: statistics checkpointed ({stats.sweeps} sweeps, "
                     f"{stats.samples_written} samples)")
        writer.update_meta(stats=self.stats_dict(stats, clean=False), **meta_updates)

    def finish(self, stats: FeederStats, stop_detail: str, **meta_updates: object) -> None:
        """The ``stop`` event and the final statistics (a clean stop)."""
        writer = self._writer()
        now = self.now()
        if writer.disk_full:  # room for the episode's events, the stop and meta.json
            writer.use_reserve(now)
        writer.write_event(now[0], now[1], None, "stop", f"clean stop: {stop_detail}")
        final = self.stats_dict(stats, clean=True)
        final["ended_mono_ns"], final["ended_real_ns"] = now
        writer.close(stats=final, **meta_updates)
        self._finished = True

    def _writer(self) -> TraceWriter:
        if self.writer is None:
            raise RuntimeError("recording session: begin() first")
        return self.writer

    # -- leaving ------------------------------------------------------------------------------
    def __enter__(self) -> RecordingSession:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        try:
            if exc_type is not None and not self._finished:
                # a crash, or a trace directory removed under us: keep what the statistics
                # say, flagged as not a clean stop, where the files can still be written
                if self.writer is not None:
                    stats = self.feeder.stats if self.feeder is not None else None
                    with contextlib.suppress(OSError):
                        self.writer.close(stats=self.stats_dict(stats, clean=False))
                else:
                    self.lock.remove_if_unused()  # a failed start leaves no empty directory
            elif self.writer is not None and not self._finished:
                self.writer.close()
        finally:
            if self.server is not None:
                self.server.stop()
            self.lock.release()


def registered_follow_file(power_model: object) -> str | None:
    """The follow file of the model that follows a registered run (kind
    `activity_registered_tree`), whole or one channel's, from a meta's `power_model`."""
    if not isinstance(power_model, dict):
        return None
    per = power_model.get("channels")
    models = list(per.values()) if power_model.get("kind") == "per_channel" and isinstance(
        per, dict) else [power_model]
    for m in models:
        if isinstance(m, dict) and m.get("kind") == "activity_registered_tree":
            path = m.get("follow_file")
            return str(path) if path else None
    return None
