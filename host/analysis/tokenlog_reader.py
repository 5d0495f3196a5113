"""The analysis's pandas view of a token log (docs/formats.md §2).

Parsing and every check live in the one reader, `epi.formats.tokenlog` (standard library
only). This view turns its columns into frames for the windows code. What it guarantees:
* `format == "epi-tokenlog"`, a known `format_version`, every field typed and in range;
* `status` is handled explicitly: "completed" is analysable; "running" (still going, or killed
  before its end was written) and "failed" (with `error`) are read and measured but carry a
  `status_problem` the verdicts turn into "invalid";
* a truncated final line of events.csv / requests.csv is dropped (append-only files);
* every requests.csv row agrees with events.csv, and a completed run has a row for every
  request of events.csv; requests that generated no token are left out of `requests` (noted);
* idle windows come from paired `idle_start` / `idle_end` events.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import cast

import numpy as np
import pandas as pd

from epi.formats import tokenlog as fmt
from epi.formats.tokenlog import RunStatus

EVENT_COLUMNS = list(fmt.EVENT_COLUMNS)
REQUEST_COLUMNS = list(fmt.REQUEST_COLUMNS)


@dataclass(frozen=True)
class Placement:
    """Layers held by one node of the run."""

    node: str
    endpoint: str | None
    layers: tuple[int, ...]


@dataclass
class RunLog:
    """A validated run directory."""

    path: Path
    header: dict
    events: pd.DataFrame
    requests: pd.DataFrame
    idle: pd.DataFrame  # t_start_mono_ns, t_end_mono_ns (local clock)
    notes: list[str] = field(default_factory=list)

    @property
    def run_id(self) -> str:
        return str(self.header["run_id"])

    @property
    def status(self) -> str:
        return str(self.header["status"])

    @property
    def status_problem(self) -> str | None:
        """Why the run's status makes it invalid, or None when completed."""
        if self.status == RunStatus.COMPLETED:
            return None
        if self.status == RunStatus.FAILED:
            return f"run failed: {self.header.get('error') or 'no error given'}"
        return "run status is still 'running' (in progress, or killed before it finished)"

    @property
    def boot_id(self) -> str | None:
        return self.header.get("boot_id")

    @property
    def clock_sync(self) -> list[dict]:
        return list(self.header.get("clock_sync") or [])

    @property
    def model(self) -> dict:
        return dict(self.header.get("model") or {})

    @property
    def placement(self) -> list[Placement]:
        return [Placement(str(p["node"]), p.get("endpoint"), tuple(int(x) for x in p["layers"]))
                for p in self.header.get("placement") or []]

    @property
    def config_id(self) -> str:
        """Configuration label: map id (or model file stem), plus nodes when split."""
        m = self.model
        base = m.get("map_id") or Path(str(m.get("path") or "model")).stem
        nodes = [p.node for p in self.placement]
        return f"{base}@{'+'.join(nodes)}" if len(nodes) > 1 else str(base)

    def span_local_ns(self) -> tuple[int, int]:
        t = self.events["t_mono_ns"].to_numpy()
        return int(t.min()), int(t.max())

    def span_real_ns(self) -> tuple[int, int]:
        t = self.events["t_real_ns"].to_numpy()
        return int(t.min()), int(t.max())


def _nullable(values: list[int | None]) -> pd.arrays.IntegerArray:
    """Integers with None as <NA> (pandas' nullable Int64)."""
    return pd.array(values, dtype="Int64")


def read_run(path: str | Path) -> RunLog:
    """Read and validate RUN_DIR (through `epi.formats.tokenlog`); one-line `UserError`."""
    log = fmt.read_token_log(path)
    ev, rq = log.events, log.requests
    events = pd.DataFrame({
        "request_id": _nullable(ev["request_id"]),
        "repeat": _nullable(ev["repeat"]),
        "warmup": _nullable(ev["warmup"]),
        "prompt_id": np.array(ev["prompt_id"], dtype=object),
        "event": np.array(ev["event"], dtype=object),
        "token_index": _nullable(ev["token_index"]),
        "token_id": _nullable(ev["token_id"]),
        "t_mono_ns": np.array(ev["t_mono_ns"], dtype=np.int64),
        "t_real_ns": np.array(ev["t_real_ns"], dtype=np.int64),
    })
    keep = [i for i, n in enumerate(rq["n_generated_tokens"]) if n > 0]
    cols = cast("Mapping[str, list[object]]", rq)  # RequestColumns: every value is a list
    requests = pd.DataFrame({
        c: (np.array([cols[c][i] for i in keep], dtype=object) if c in ("prompt_id", "node")
            else np.array([cols[c][i] for i in keep], dtype=np.int64))
        for c in REQUEST_COLUMNS
    })
    idle = pd.DataFrame({"t_start_mono_ns": np.array([a for a, _ in log.idle], dtype=np.int64),
                         "t_end_mono_ns": np.array([b for _, b in log.idle], dtype=np.int64)})
    return RunLog(log.path, dict(log.header), events, requests, idle, list(log.notes))
