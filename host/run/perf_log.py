"""The run directory's perf-counter files, written by the inference child beside the token log.

- `perf_counters.json`: which events this node counted, in which unit, which it could not and
  why (the kernel's reason), and the counting scope (host/run/perf_counters.py);
- `perf_counters.csv`: one row per request, phase and event: `request_id,phase,event,value`
  (request ids as in requests.csv; phase `prefill` = request start to the first token's stamp,
  `decode` = that stamp to the request's end).

docs/formats.md §2 documents both. Absent files: a run made without counters.

Counting is opt-in (`EPI_PERF_COUNTERS=1` in the environment of `epi run` or `epi campaign`):
per-thread software counters hook every context switch, and on a contended machine that is
not free. Measured on the 2-core VM with one core kept busy: the hardware walk's RPC run took
343 s without counters and did not finish in 600 s with them (47 s idle either way).
"""

from __future__ import annotations

import csv
import os
from pathlib import Path

from epi.core.files import write_json_atomic
from host.run.perf_counters import Availability, RequestCounters, probe

COLUMNS = ("request_id", "phase", "event", "value")
CSV_NAME = "perf_counters.csv"
JSON_NAME = "perf_counters.json"


ENABLE_ENV = "EPI_PERF_COUNTERS"


def enabled() -> bool:
    """Whether this run counts kernel events (opt-in: see the module's docstring)."""
    return os.environ.get(ENABLE_ENV, "") == "1"


class PerfLog:
    """Probe once, then one RequestCounters per request and its rows appended to the CSV;
    without EPI_PERF_COUNTERS=1 it counts nothing and writes no files."""

    def __init__(self, run_dir: Path) -> None:
        self.on = enabled()
        self.availability: Availability = probe() if self.on else Availability()
        if not self.on:
            return
        write_json_atomic(run_dir / JSON_NAME, self.availability.to_json())
        self.path = run_dir / CSV_NAME
        with self.path.open("w", newline="", encoding="utf-8") as fh:
            csv.writer(fh).writerow(COLUMNS)

    def counters(self) -> RequestCounters | None:
        if not self.on or not self.availability.events:
            return None
        return RequestCounters(self.availability.events)

    def write(self, request_id: int, counters: RequestCounters | None) -> None:
        if counters is None:
            return
        rows = [(request_id, phase, event, value)
                for phase, counts in counters.phases().items()
                for event, value in counts.items()]
        with self.path.open("a", newline="", encoding="utf-8") as fh:
            csv.writer(fh).writerows(rows)


def read_perf_counters(run_dir: Path) -> dict[tuple[int, str], dict[str, int]]:
    """{(request_id, phase): {event: value}} from a run directory (empty without the file)."""
    path = Path(run_dir) / CSV_NAME
    if not path.is_file():
        return {}
    out: dict[tuple[int, str], dict[str, int]] = {}
    with path.open(newline="", encoding="utf-8") as fh:
        for row in csv.DictReader(fh):
            out.setdefault((int(row["request_id"]), row["phase"]), {})[row["event"]] = \
                int(row["value"])
    return out
