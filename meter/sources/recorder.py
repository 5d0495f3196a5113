"""Record software power sources into a trace: one polling thread per source.

``SourceRecorder`` owns the threads. Each thread reads its source on the source's own schedule
(never faster than the counter updates: it starts at the source's ``min_interval_s`` and slows
down to the update interval it measures when most reads find nothing new, or to twice the cost
of a read when reads are slow), feeds every channel's ``ChannelTracker`` and writes the rows of
one read in one ``TraceWriter.write_samples`` call. ``TraceWriter`` serialises writes with its
lock and every row is one whole-line append, so the board's sampler thread and these threads
share a segment safely; a slow source delays only its own thread.

``record_sources(...)`` is the whole job without a board (``epi meter run --source`` alone, or
``epi run --power``): a new trace segment with only software channels.
"""

from __future__ import annotations

import socket
import statistics
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from epi.core.errors import UserError
from epi.formats.json_types import JSON
from meter.clock import Clock
from meter.daemon.trace import TraceWriter
from meter.recording.session import RecordingSession
from meter.sources.common import COMPONENT_LABEL, NullSource, PowerSource
from meter.sources.counters import ChannelTracker

ADAPT_EVERY_READS = 32
META_INTERVAL_S = 5.0
MAX_INTERVAL_S = 5.0


class RowWriter(Protocol):
    """Where a poller writes: a TraceWriter, or a test double with the same two methods."""

    def write_samples(self, rows: Iterable[Sequence[object]]) -> int: ...

    def write_event(self, t_mono_ns: int | None, t_real_ns: int | None, channel: int | None,
                    kind: str, detail: str = "") -> None: ...


@dataclass
class SourceStats:
    """What the software sources did (the recording session's ``stats`` in meta.json)."""

    polls: int = 0
    samples_written: int = 0

    @property
    def sweeps(self) -> int:
        return self.polls

    def as_dict(self) -> dict[str, JSON]:
        return {"polls": self.polls, "samples_written": self.samples_written}


class SourcePoller:
    """One source on its own thread and schedule."""

    def __init__(self, source: PowerSource, first_channel: int, clock: Clock,
                 *, freeze_after_s: float | None = None,
                 interval_s: float | None = None) -> None:
        self.source = source
        self.clock = clock
        self.specs = source.channels()
        self.indices = list(range(first_channel, first_channel + len(self.specs)))
        self.interval_s = max(interval_s or source.min_interval_s, source.min_interval_s)
        self.initial_interval_s = self.interval_s
        self.freeze_after_s = freeze_after_s
        self.read_cost_ns: list[int] = []
        self.skipped_polls = 0
        self.polls = 0
        self.trackers: list[ChannelTracker] = []
        self._seq = [0] * len(self.specs)
        self._writer: RowWriter | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.error: BaseException | None = None

    # -- thread ---------------------------------------------------------------------------
    def start_without_thread(self, writer: RowWriter) -> None:
        """Attach the writer and trackers; ``poll_once`` is then called by hand (tests, bench)."""
        self._writer = writer
        self.trackers = [
            ChannelTracker(spec, self._emitter(idx), freeze_after_s=self.freeze_after_s)
            for spec, idx in zip(self.specs, self.indices, strict=True)
        ]

    def start(self, writer: RowWriter) -> None:
        self.start_without_thread(writer)
        self._thread = threading.Thread(target=self._loop, name=f"source-{self.source.kind}",
                                        daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        now = (self.clock.monotonic_ns(), self.clock.realtime_ns())
        for tr in self.trackers:
            tr.close(*now)
        self.source.close()

    def _out(self) -> RowWriter:
        if self._writer is None:
            raise RuntimeError("source poller: start() first")
        return self._writer

    def _emitter(self, channel: int) -> Callable[[int, int, str, str], None]:
        def emit(t: int, t_real: int, kind: str, detail: str) -> None:
            self._out().write_event(t, t_real, channel, kind, detail)
        return emit

    def _loop(self) -> None:
        try:
            due = self.clock.monotonic_ns()
            while not self._stop.is_set():
                self.poll_once()
                self._adapt()
                due += int(self.interval_s * 1e9)
                now = self.clock.monotonic_ns()
                if now > due:  # a read took longer than the interval: skip, never burst
                    missed = (now - due) // int(self.interval_s * 1e9) + 1
                    self.skipped_polls += int(missed)
                    due += int(missed * self.interval_s * 1e9)
                if self._stop.wait(max(0.0, (due - now) / 1e9)):
                    break
        except BaseException as exc:
            self.error = exc
            t = (self.clock.monotonic_ns(), self.clock.realtime_ns())
            for idx in self.indices:
                self._out().write_event(t[0], t[1], idx, "read_error",
                                         f"source {self.source.kind} stopped: {exc!r}")

    def poll_once(self) -> int:
        """Read the source once and write what changed; returns the rows written."""
        t0 = self.clock.monotonic_ns()
        r0 = self.clock.realtime_ns()
        values = self.source.read()
        self.polls += 1
        t1 = self.clock.monotonic_ns()
        r1 = self.clock.realtime_ns()
        self.read_cost_ns.append(t1 - t0)
        if len(self.read_cost_ns) > 4096:
            del self.read_cost_ns[:2048]
        t, t_real = (t0 + t1) // 2, (r0 + r1) // 2
        rows = []
        for i, (tracker, value) in enumerate(zip(self.trackers, values, strict=True)):
            row = tracker.feed(t, t_real, value)
            if row is not None:
                rows.append((self._seq[i], self.indices[i], row[0], row[1], row[2],
                             None, None, None, None, row[3], None))
                self._seq[i] += 1
        if rows:
            self._out().write_samples(rows)
        return len(rows)

    def _adapt(self) -> None:
        """Never poll faster than the counter updates, nor faster than reads allow."""
        reads = self.trackers[0].stats.reads if self.trackers else 0
        if not reads or reads % ADAPT_EVERY_READS:
            return
        unchanged = sum(t.stats.unchanged_reads for t in self.trackers)
        total = sum(t.stats.reads for t in self.trackers)
        updates = [u for t in self.trackers if (u := t.stats.update_interval_s())]
        if updates and unchanged > 0.5 * total:
            measured = min(updates)
            if measured > self.interval_s:
                self.interval_s = min(measured, MAX_INTERVAL_S)
        cost = statistics.mean(self.read_cost_ns[-ADAPT_EVERY_READS:]) / 1e9
        if cost > 0.5 * self.interval_s:
            self.interval_s = min(2 * cost, MAX_INTERVAL_S)

    # -- description ----------------------------------------------------------------------
    def channel_meta(self, node: str | None) -> list[dict[str, JSON]]:
        """The trace ``channels`` entries of this source's channels."""
        out: list[dict[str, JSON]] = []
        for idx, spec in zip(self.indices, self.specs, strict=True):
            out.append({
                "channel": idx, "name": spec.name, "node": node,
                "meter_constant_imp_per_kwh": None, "ct": None,
                "sample_period_s": self.interval_s,
                **spec.describe(),
            })
        return out

    def measured(self) -> dict[str, JSON]:
        """Per channel: what it did, with the update interval and read cost as measured."""
        costs = sorted(self.read_cost_ns)
        cost: dict[str, JSON] = {
            "read_cost_s_median": statistics.median(costs) / 1e9 if costs else None,
            "read_cost_s_max": costs[-1] / 1e9 if costs else None,
            "poll_interval_s": self.interval_s,
            "poll_interval_s_initial": self.initial_interval_s,
            "skipped_polls": self.skipped_polls,
        }
        return {str(idx): {"name": spec.name, **tr.stats.as_dict(), **cost}
                for idx, spec, tr in zip(self.indices, self.specs, self.trackers, strict=True)}

    def row_period_s(self) -> float:
        """Longest expected spacing of this source's rows: poll interval or update interval."""
        ups = [u for t in self.trackers if (u := t.stats.update_interval_s())]
        return max([self.interval_s, *ups])


class SourceRecorder:
    """Several sources, channel numbers after ``first_channel``, one thread each."""

    def __init__(self, sources: Sequence[PowerSource], first_channel: int, clock: Clock,
                 node: str | None, *, freeze_after_s: float | None = None) -> None:
        self.node = node
        self.pollers: list[SourcePoller] = []
        nxt = first_channel
        for src in sources:
            if isinstance(src, NullSource) or not src.channels():
                continue
            p = SourcePoller(src, nxt, clock, freeze_after_s=freeze_after_s)
            self.pollers.append(p)
            nxt += len(p.specs)

    @property
    def stats(self) -> SourceStats:
        """Polls and rows so far, over every source (a Feeder of the recording session)."""
        trackers = [t for p in self.pollers for t in p.trackers]
        return SourceStats(sum(p.polls for p in self.pollers), sum(t.stats.rows for t in trackers))

    def request_checkpoint(self) -> None:
        """Nothing to wake: the session's loop writes the statistics every few seconds."""

    @property
    def n_channels(self) -> int:
        return sum(len(p.specs) for p in self.pollers)

    def channel_meta(self) -> list[JSON]:
        return [c for p in self.pollers for c in p.channel_meta(self.node)]

    def describe(self) -> dict[str, JSON]:
        """The trace's ``sources`` key: measured figures per channel and the sources used."""
        return {
            "label": COMPONENT_LABEL,
            "kinds": [p.source.kind for p in self.pollers],
            "channels": {k: v for p in self.pollers for k, v in p.measured().items()},
        }

    def final_channels(self, channels: list[dict[str, JSON]]) -> list[JSON]:
        """``channels`` with each software channel's measured row period filled in."""
        period = {i: p.row_period_s() for p in self.pollers for i in p.indices}
        out: list[JSON] = []
        for c in channels:
            index = c.get("channel")
            out.append(dict(c, sample_period_s=period[index])
                       if isinstance(index, int) and index in period else c)
        return out

    def start(self, writer: RowWriter) -> None:
        for p in self.pollers:
            p.start(writer)

    def stop(self) -> None:
        for p in self.pollers:
            p.stop()

    def meta_updates(self, writer: TraceWriter) -> dict[str, JSON]:
        """Keys to rewrite in the segment metadata: the channels with their measured row
        period, and ``sources`` (call from the one thread that updates the metadata)."""
        listed = writer.meta.get("channels")
        channels = [c for c in listed if isinstance(c, dict)] if isinstance(listed, list) else []
        return {"channels": self.final_channels(channels),
                "sources": self.describe()}

    def finish(self, writer: TraceWriter) -> None:
        """Stop the threads, then write the measured figures into the segment metadata."""
        self.stop()
        writer.update_meta(**self.meta_updates(writer))

    def summary(self) -> str:
        return ", ".join(f"{s.name} ({s.scope}, {s.counter})" for p in self.pollers
                         for s in p.specs)


def record_sources(out_dir: str | Path, sources: Sequence[PowerSource], *, clock: Clock,
                   stop: threading.Event, duration_s: float | None = None,
                   node: str | None = None, log: Callable[[str], None] = lambda _l: None,
                   freeze_after_s: float | None = None,
                   started: threading.Event | None = None,
                   extra_meta: dict[str, JSON] | None = None) -> dict[str, JSON]:
    """Write a trace segment with only software channels until ``stop`` or ``duration_s``.

    Returns the final ``sources`` metadata. No HTTP server: the runner on this machine shares
    its monotonic clock (same boot id), so no clock sync is needed. The lock, meta.json,
    restart gap and statistics are the recording session's (meter/recording/session.py).
    """
    node = node or socket.gethostname()
    rec = SourceRecorder(sources, 0, clock, node, freeze_after_s=freeze_after_s)
    if rec.n_channels == 0:
        raise UserError("--source: no readable software power counter on this machine "
                        "(run `epi doctor` to see what is missing and the fix)")
    meta: dict[str, JSON] = {
        "emulated": False, "power_model": None,
        "sample_period_s": min(p.interval_s for p in rec.pollers),
        "channels": rec.channel_meta(), "board": None, "fault_injection": None,
        **(extra_meta or {}),
    }
    with RecordingSession(out_dir, clock, log=log, ready=started) as session:
        writer = session.begin(meta, f"software sources only: {rec.summary()}")
        try:
            rec.start(writer)
            session.attach(rec)
            log(f"epi meter: recording {rec.n_channels} software channel(s) into {out_dir} "
                f"segment {writer.segment}: {rec.summary()} — {COMPONENT_LABEL}")
            deadline = None if duration_s is None else clock.monotonic_ns() + duration_s * 1e9
            while True:  # the measured figures reach meta.json every few seconds (crash-safe)
                left = None if deadline is None else (deadline - clock.monotonic_ns()) / 1e9
                wait_s = META_INTERVAL_S if left is None else max(0.0, min(left, META_INTERVAL_S))
                if stop.wait(wait_s) or (left is not None and left <= META_INTERVAL_S):
                    break
                session.save_stats(rec.stats, **rec.meta_updates(writer))
        finally:
            rec.stop()
        session.finish(rec.stats, f"{rec.stats.samples_written} software-channel rows",
                       **rec.meta_updates(writer))
    log(f"epi meter: stopped: {rec.stats.samples_written} software-channel rows written")
    for p in rec.pollers:
        if p.error is not None:
            log(f"epi meter: source {p.source.kind} stopped early: {p.error!r}")
    return rec.describe()
