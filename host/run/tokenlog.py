"""Token log (`format: "epi-tokenlog"`, version 2): the writer, exactly docs/formats.md §2.

The one reader is `epi.formats.tokenlog` (its pandas view: host.analysis.tokenlog_reader).

A token log is a directory: `run.json` (header, rewritten atomically when the status, placement
or clock sync changes), `events.csv` and `requests.csv` (append-only; rows are written whole and
flushed once per request, so a run that dies leaves files that are valid up to the last complete
line). The header is owned by one process (the `epi run` parent); the CSV files may be appended
by another (the inference child) — they never write the same file.
"""

from __future__ import annotations

import csv
import io
import socket
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from epi.core.errors import UserError
from epi.core.files import read_boot_id, write_json_atomic
from epi.formats.tokenlog import (
    CLOCK_SYNC_WHEN,
    EVENT_COLUMNS,
    EVENTS_CSV,
    FORMAT,
    FORMAT_VERSION,
    REQUEST_COLUMNS,
    REQUESTS_CSV,
    RUN_JSON,
    RunStatus,
    TokenEvent,
)


def boot_id() -> str | None:
    """This machine's boot id: a log and a trace with the same one share one CLOCK_MONOTONIC."""
    return read_boot_id()


def new_run_id() -> str:
    """A unique run id (sortable prefix is not needed: run.json carries real times)."""
    return uuid.uuid4().hex


def host_name() -> str:
    """Name of the machine that runs inference (the `host` of run.json)."""
    return socket.gethostname()


@dataclass
class RequestRecord:
    """Everything timed about one request; written as events + one requests.csv row.

    `token_mono_ns[i]`/`token_real_ns[i]` were stamped when token i was yielded; token 0 marks
    the end of prefill. `t_end_*` is stamped right after the last token.
    """

    request_id: int
    repeat: int
    warmup: bool
    prompt_id: str
    n_prompt_tokens: int
    t_start_mono_ns: int
    t_start_real_ns: int
    token_ids: list[int]
    token_mono_ns: list[int]
    token_real_ns: list[int]
    t_end_mono_ns: int
    t_end_real_ns: int
    node: str
    # a split configuration's handover (start mono, start real, end mono, end real), stamped
    # between token 0 and token 1; None for an unsplit request
    handover_ns: tuple[int, int, int, int] | None = None

    def event_rows(self) -> list[tuple[int | str, ...]]:
        """The request's rows of events.csv, in time order."""
        w = int(self.warmup)
        head = (self.request_id, self.repeat, w, self.prompt_id)
        rows: list[tuple[int | str, ...]] = [
            (*head, TokenEvent.REQUEST_START, "", "", self.t_start_mono_ns, self.t_start_real_ns)
        ]
        rows.extend(
            (*head, TokenEvent.TOKEN, i, tok, m, r)
            for i, (tok, m, r) in enumerate(
                zip(self.token_ids, self.token_mono_ns, self.token_real_ns, strict=True)
            )
        )
        if self.handover_ns is not None and rows[1:]:
            sm, sr, em, er = self.handover_ns
            rows[2:2] = [(*head, TokenEvent.HANDOVER_START, "", "", sm, sr),
                         (*head, TokenEvent.HANDOVER_END, "", "", em, er)]
        rows.append((*head, TokenEvent.REQUEST_END, "", "", self.t_end_mono_ns,
                     self.t_end_real_ns))
        return rows

    def request_row(self) -> tuple[int | str, ...]:
        """The request's row of requests.csv.

        `t_end_mono_ns` there is the last token's time (decode = first → last token, as
        docs/formats.md defines it); the `request_end` event, stamped right after generation
        stopped, stays in events.csv. Without tokens both token times are empty.
        """
        first = self.token_mono_ns[0] if self.token_mono_ns else ""
        last = self.token_mono_ns[-1] if self.token_mono_ns else ""
        return (
            self.request_id,
            self.repeat,
            int(self.warmup),
            self.prompt_id,
            self.n_prompt_tokens,
            len(self.token_ids),
            self.t_start_mono_ns,
            first,
            last,
            self.node,
        )




class RunHeader:
    """run.json of one token log: created with status "running", rewritten atomically on change."""

    def __init__(self, run_dir: Path, data: dict[str, object]) -> None:
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / RUN_JSON
        self.data = data

    @classmethod
    def create(cls, run_dir: Path, fields: dict[str, object]) -> RunHeader:
        """Start a new token log in `run_dir` (created; must not already hold one).

        `fields` are the header keys besides format, version, run_id and status. The CSV files
        are created with their header lines, so the directory is a valid (empty) log at once.
        """
        run_dir = Path(run_dir)
        if (run_dir / RUN_JSON).exists():
            raise UserError(f"{run_dir}: already holds a token log (run.json); choose a new --out")
        if run_dir.exists() and not run_dir.is_dir():
            raise UserError(f"{run_dir}: --out exists and is not a directory")
        try:
            run_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise UserError(f"{run_dir}: cannot create run directory ({exc.strerror})") from None
        data: dict[str, object] = {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "run_id": fields.pop("run_id", None) or new_run_id(),
            "status": RunStatus.RUNNING,
            **fields,
        }
        data.setdefault("clock_sync", [])
        data.setdefault("meters", [])
        for name, columns in ((EVENTS_CSV, EVENT_COLUMNS), (REQUESTS_CSV, REQUEST_COLUMNS)):
            with open(run_dir / name, "x", encoding="utf-8", newline="") as fh:
                fh.write(",".join(columns) + "\n")
        header = cls(run_dir, data)
        header.save()
        return header

    def save(self) -> None:
        write_json_atomic(self.path, self.data)

    def update(self, **changes: object) -> None:
        """Change top-level keys and rewrite run.json."""
        self.data.update(changes)
        self.save()

    def text(self, key: str) -> str:
        """A string field this writer set (node, host, run_id, status)."""
        value = self.data.get(key)
        if not isinstance(value, str):
            raise ValueError(f"run.json field {key!r} is not a string: {value!r}")
        return value

    def settings(self) -> dict[str, object]:
        """The `settings` object (empty until set)."""
        value = self.data.get("settings", {})
        if not isinstance(value, dict):
            raise ValueError(f"run.json field 'settings' is not an object: {value!r}")
        return value

    def add_clock_sync(self, entry: Mapping[str, object], when: str) -> None:
        """Append one clock-sync estimate (`offset_ns` = meter − local monotonic)."""
        if when not in CLOCK_SYNC_WHEN:
            raise ValueError(f"clock sync 'when' must be start/end/during, not {when!r}")
        entries = self.data.setdefault("clock_sync", [])
        if not isinstance(entries, list):
            raise ValueError(f"run.json field 'clock_sync' is not a list: {entries!r}")
        entries.append({**entry, "when": when})
        meters = self.data.setdefault("meters", [])  # format 2: offsets keyed by meter
        if isinstance(meters, list) and entry.get("meter_url") not in meters:
            meters.append(entry.get("meter_url"))
        first = entries[0].get("meter_url")  # the drift of the first meter's clock
        self.data["clock_drift_ppm"] = clock_drift_ppm(
            [e for e in entries if e.get("meter_url") == first])
        self.save()

    def finish(self, status: RunStatus, error: str | None = None) -> None:
        """Mark the run completed or failed (with its one-line error)."""
        if status not in (RunStatus.COMPLETED, RunStatus.FAILED):
            raise ValueError(f"final status must be completed or failed, not {status!r}")
        if status == RunStatus.FAILED and not error:
            raise ValueError("a failed run needs its error")
        self.data["status"] = status
        self.data["error"] = error
        self.save()


def clock_drift_ppm(entries: Sequence[Mapping[str, object]]) -> float | None:
    """Rate difference meter − local in ppm from the first and last estimate; None if < 2."""
    if len(entries) < 2:
        return None
    first, last = entries[0], entries[-1]
    dt = _ns(last, "t_local_mono_ns") - _ns(first, "t_local_mono_ns")
    if dt <= 0:
        return None
    return (_ns(last, "offset_ns") - _ns(first, "offset_ns")) / dt * 1e6


def _ns(entry: Mapping[str, object], key: str) -> int:
    value = entry.get(key)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"clock-sync estimate field {key!r} is not an integer: {value!r}")
    return value


@dataclass
class CsvAppender:
    """Append-only writers of events.csv and requests.csv (a run dir created by RunHeader)."""

    run_dir: Path
    _events: io.TextIOWrapper = field(init=False, repr=False)
    _requests: io.TextIOWrapper = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.run_dir = Path(self.run_dir)
        for name in (EVENTS_CSV, REQUESTS_CSV):
            if not (self.run_dir / name).is_file():
                raise UserError(f"{self.run_dir / name}: missing; not a token-log directory")
        # Open for the whole run (closed by close()); rows are flushed once per request.
        self._events = open(self.run_dir / EVENTS_CSV, "a", encoding="utf-8", newline="")  # noqa: SIM115
        self._requests = open(self.run_dir / REQUESTS_CSV, "a", encoding="utf-8", newline="")  # noqa: SIM115
        self._ev = csv.writer(self._events, lineterminator="\n")
        self._rq = csv.writer(self._requests, lineterminator="\n")

    def write_idle(self, repeat: int, start: tuple[int, int], end: tuple[int, int]) -> None:
        """One idle-baseline window: `start`/`end` are (t_mono_ns, t_real_ns)."""
        self._ev.writerows(
            [
                ("", repeat, 0, "", TokenEvent.IDLE_START, "", "", start[0], start[1]),
                ("", repeat, 0, "", TokenEvent.IDLE_END, "", "", end[0], end[1]),
            ]
        )
        self._events.flush()

    def write_request(self, rec: RequestRecord) -> None:
        """All events of one finished request, then its summary row; both flushed."""
        self._ev.writerows(rec.event_rows())
        self._events.flush()
        self._rq.writerow(rec.request_row())
        self._requests.flush()

    def close(self) -> None:
        for fh in (self._events, self._requests):
            if not fh.closed:
                fh.close()
