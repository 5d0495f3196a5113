"""Read and validate a token-log run directory (docs/formats.md §2) for analysis.

Written independently of the writer (host/tokenlog.py) as a check on the documented contract.
Guarantees to the caller:
* `format == "epi-tokenlog"`, a known `format_version`, the keys analysis needs;
* `status` is handled explicitly: "completed" is analysable; "running" (still going, or killed
  before its end was written) and "failed" (with `error`) are read and measured but carry a
  `status_problem` the verdicts turn into "invalid";
* a truncated final line of events.csv / requests.csv is dropped (append-only files);
* events are in time order, token times strictly increase within a request, and every
  requests.csv row agrees with events.csv (start, first token, last token, token count);
* idle windows come from paired `idle_start` / `idle_end` events.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from epi.core.errors import UserError
from host.analysis.traces import (
    INT64_MIN,
    check_format,
    int_column,
    read_csv_records,
    read_json,
)

TOKENLOG_FORMAT = "epi-tokenlog"
TOKENLOG_VERSION = 1
EVENT_COLUMNS = ["request_id", "repeat", "warmup", "prompt_id", "event", "token_index",
                 "token_id", "t_mono_ns", "t_real_ns"]
REQUEST_COLUMNS = ["request_id", "repeat", "warmup", "prompt_id", "n_prompt_tokens",
                   "n_generated_tokens", "t_start_mono_ns", "t_first_token_mono_ns",
                   "t_end_mono_ns", "node"]
EVENT_KINDS = {"idle_start", "idle_end", "request_start", "token", "request_end"}
STATUSES = {"running", "completed", "failed"}


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
        if self.status == "completed":
            return None
        if self.status == "failed":
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


def _need(d: dict, key: str, kind: type | tuple[type, ...], path: Path, where: str = "") -> object:
    val = d.get(key)
    if not isinstance(val, kind) or (isinstance(val, bool) and kind is not bool):
        name = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
        raise UserError(f"{path}: field {where}{key} must be {name}, got {val!r}")
    return val


def _check_header(h: dict, path: Path) -> None:
    check_format(h, path, TOKENLOG_FORMAT, TOKENLOG_VERSION)
    _need(h, "run_id", (str, int), path)
    status = h.get("status")
    if status not in STATUSES:
        raise UserError(f"{path}: field status is {status!r}, expected one of "
                        f"{', '.join(sorted(STATUSES))}")
    _need(h, "model", dict, path)
    placement = _need(h, "placement", list, path)
    if not placement and status == "completed":
        raise UserError(f"{path}: field placement is empty (no node holds the layers)")
    seen: set[str] = set()
    for i, p in enumerate(placement):  # type: ignore[arg-type]
        if not isinstance(p, dict):
            raise UserError(f"{path}: placement[{i}] must be an object")
        node = _need(p, "node", str, path, f"placement[{i}].")
        layers = _need(p, "layers", list, path, f"placement[{i}].")
        if not all(isinstance(x, int) for x in layers):  # type: ignore[union-attr]
            raise UserError(f"{path}: placement[{i}].layers must be a list of integers")
        if node in seen:
            raise UserError(f"{path}: placement node {node!r} appears twice")
        seen.add(node)  # type: ignore[arg-type]
    sync = h.get("clock_sync", [])
    if not isinstance(sync, list):
        raise UserError(f"{path}: field clock_sync must be a list")
    for i, e in enumerate(sync):
        if not isinstance(e, dict):
            raise UserError(f"{path}: clock_sync[{i}] must be an object")
        for key in ("t_local_mono_ns", "offset_ns"):
            v = e.get(key)
            if v is not None and (not isinstance(v, int) or isinstance(v, bool)):
                raise UserError(f"{path}: clock_sync[{i}].{key} must be an integer or null")


def _read_events(path: Path) -> tuple[pd.DataFrame, bool]:
    frame, truncated = read_csv_records(path, EVENT_COLUMNS)
    rid = int_column(frame, "request_id", path, nullable=True)
    tok = int_column(frame, "token_index", path, nullable=True)
    ev = pd.DataFrame({
        "request_id": rid,
        "repeat": int_column(frame, "repeat", path, nullable=True),
        "warmup": int_column(frame, "warmup", path, nullable=True),
        "prompt_id": frame["prompt_id"].astype(str).to_numpy(dtype=object),
        "event": frame["event"].astype(str).to_numpy(dtype=object),
        "token_index": tok,
        "t_mono_ns": int_column(frame, "t_mono_ns", path),
        "t_real_ns": int_column(frame, "t_real_ns", path),
    })
    unknown = ~ev["event"].isin(EVENT_KINDS).to_numpy()
    if unknown.any():
        row = int(np.flatnonzero(unknown)[0])
        raise UserError(f"{path}: line {row + 2}: column event is {ev['event'].iloc[row]!r}, "
                        f"expected one of {', '.join(sorted(EVENT_KINDS))}")
    t = ev["t_mono_ns"].to_numpy()
    back = np.flatnonzero(np.diff(t) < 0)
    if len(back):
        raise UserError(f"{path}: line {back[0] + 3}: t_mono_ns goes backwards "
                        f"({t[back[0] + 1]} after {t[back[0]]}): events are not in time order")
    req_ev = ev["event"].isin(["request_start", "token", "request_end"]).to_numpy()
    if (req_ev & (rid == INT64_MIN)).any():
        row = int(np.flatnonzero(req_ev & (rid == INT64_MIN))[0])
        raise UserError(f"{path}: line {row + 2}: column request_id is empty on a "
                        f"{ev['event'].iloc[row]} event")
    tokens = ev[ev["event"] == "token"]
    if (tokens["token_index"] == INT64_MIN).any():
        row = int(tokens.index[tokens["token_index"] == INT64_MIN][0])
        raise UserError(f"{path}: line {row + 2}: column token_index is empty on a token event")
    # Token times strictly increase within a request (duplicates are an error).
    tk = tokens.sort_values(["request_id", "token_index"], kind="stable")
    same = tk["request_id"].to_numpy()[1:] == tk["request_id"].to_numpy()[:-1]
    dup = np.flatnonzero(same & (np.diff(tk["t_mono_ns"].to_numpy()) <= 0))
    if len(dup):
        row = int(tk.index[dup[0] + 1])
        raise UserError(f"{path}: line {row + 2}: token t_mono_ns of request "
                        f"{tk['request_id'].iloc[dup[0] + 1]} is duplicated or unsorted")
    return ev, truncated


def _derive(ev: pd.DataFrame) -> pd.DataFrame:
    """Per-request times and counts from events.csv (to check requests.csv against)."""
    req = ev[ev["request_id"] != INT64_MIN]
    start = req[req["event"] == "request_start"].groupby("request_id")["t_mono_ns"].min()
    tok = req[req["event"] == "token"].groupby("request_id")
    first = req[(req["event"] == "token") & (req["token_index"] == 0)].groupby(
        "request_id")["t_mono_ns"].min()
    return pd.DataFrame({"start": start, "first": first, "last": tok["t_mono_ns"].max(),
                         "n_tokens": tok.size()})


def _read_requests(path: Path, ev: pd.DataFrame, events_path: Path,
                   notes: list[str]) -> tuple[pd.DataFrame, bool]:
    frame, truncated = read_csv_records(path, REQUEST_COLUMNS)
    req = pd.DataFrame({
        "request_id": int_column(frame, "request_id", path),
        "repeat": int_column(frame, "repeat", path),
        "warmup": int_column(frame, "warmup", path),
        "prompt_id": frame["prompt_id"].astype(str).to_numpy(dtype=object),
        "n_prompt_tokens": int_column(frame, "n_prompt_tokens", path),
        "n_generated_tokens": int_column(frame, "n_generated_tokens", path),
        "t_start_mono_ns": int_column(frame, "t_start_mono_ns", path),
        "t_first_token_mono_ns": int_column(frame, "t_first_token_mono_ns", path,
                                            nullable=True),
        "t_end_mono_ns": int_column(frame, "t_end_mono_ns", path, nullable=True),
        "node": frame["node"].astype(str).to_numpy(dtype=object),
    })
    # A request that generated nothing has no first token: it has no phases to measure.
    silent = (req["t_first_token_mono_ns"] == INT64_MIN).to_numpy()
    no_end = (req["t_end_mono_ns"] == INT64_MIN).to_numpy()
    wrong = (silent & (req["n_generated_tokens"] != 0).to_numpy()) | (no_end & ~silent)
    if wrong.any():
        row = int(np.flatnonzero(wrong)[0])
        raise UserError(f"{path}: line {row + 2}: token times are empty but "
                        "n_generated_tokens is not 0")
    if silent.any():
        notes.append(f"{path.name}: {int(silent.sum())} request(s) generated no tokens "
                     "(not analysed)")
        req = req[~silent].reset_index(drop=True)
    dup = req["request_id"].duplicated().to_numpy()
    if dup.any():
        row = int(np.flatnonzero(dup)[0])
        raise UserError(f"{path}: line {row + 2}: request_id {req['request_id'].iloc[row]} "
                        "appears twice")
    order_bad = ~((req["t_start_mono_ns"] <= req["t_first_token_mono_ns"])
                  & (req["t_first_token_mono_ns"] <= req["t_end_mono_ns"])).to_numpy()
    if order_bad.any():
        row = int(np.flatnonzero(order_bad)[0])
        raise UserError(f"{path}: line {row + 2}: times are unsorted (need t_start_mono_ns ≤ "
                        "t_first_token_mono_ns ≤ t_end_mono_ns)")
    d = _derive(ev).reindex(req["request_id"].to_numpy())
    checks = [
        ("t_start_mono_ns", d["start"], "its request_start event"),
        ("t_first_token_mono_ns", d["first"], "its token 0 event"),
        ("t_end_mono_ns", d["last"], "its last token event"),
        ("n_generated_tokens", d["n_tokens"], "its number of token events"),
    ]
    for col, ref, what in checks:
        mine = req[col].to_numpy(dtype=np.float64)
        theirs = ref.to_numpy(dtype=np.float64)
        bad = np.isnan(theirs) | (mine != theirs)
        if bad.any():
            row = int(np.flatnonzero(bad)[0])
            got = "missing" if np.isnan(theirs[row]) else int(theirs[row])
            raise UserError(f"{path}: line {row + 2}: {col} {int(mine[row])} disagrees with "
                            f"{what} in {events_path.name} ({got})")
    if (req["n_prompt_tokens"] <= 0).any() or (req["n_generated_tokens"] <= 0).any():
        row = int(np.flatnonzero(((req["n_prompt_tokens"] <= 0)
                                  | (req["n_generated_tokens"] <= 0)).to_numpy())[0])
        raise UserError(f"{path}: line {row + 2}: token counts must be positive")
    return req, truncated


def _idle_windows(ev: pd.DataFrame, path: Path, notes: list[str]) -> pd.DataFrame:
    idle = ev[ev["event"].isin(["idle_start", "idle_end"])]
    kinds = idle["event"].to_numpy()
    times = idle["t_mono_ns"].to_numpy()
    starts, ends = [], []
    open_t: int | None = None
    for kind, t in zip(kinds, times, strict=True):  # a few idle events per run
        if kind == "idle_start":
            if open_t is not None:
                raise UserError(f"{path}: idle_start at {t} while the idle window opened at "
                                f"{open_t} is not closed")
            open_t = int(t)
        else:
            if open_t is None:
                raise UserError(f"{path}: idle_end at {t} without an idle_start")
            starts.append(open_t)
            ends.append(int(t))
            open_t = None
    if open_t is not None:
        notes.append(f"{path.name}: idle window opened at {open_t} never closed (ignored)")
    return pd.DataFrame({"t_start_mono_ns": np.array(starts, dtype=np.int64),
                         "t_end_mono_ns": np.array(ends, dtype=np.int64)})


def read_run(path: str | Path) -> RunLog:
    """Read and validate RUN_DIR; one-line `UserError` on anything malformed."""
    root = Path(path)
    if not root.is_dir():
        raise UserError(f"{root}: run directory not found")
    header_path = root / "run.json"
    if not header_path.exists():
        raise UserError(f"{root}: no run.json (not an epi token-log directory)")
    header = read_json(header_path)
    _check_header(header, header_path)
    notes: list[str] = []
    ep, rp = root / "events.csv", root / "requests.csv"
    for p in (ep, rp):
        if not p.exists():
            raise UserError(f"{p}: file missing")
    events, trunc_e = _read_events(ep)
    if events.empty:
        raise UserError(f"{ep}: no events (nothing to analyse)")
    requests, trunc_r = _read_requests(rp, events, ep, notes)
    for flag, p in ((trunc_e, ep), (trunc_r, rp)):
        if flag:
            notes.append(f"{p.name}: dropped a truncated final line")
    idle = _idle_windows(events, ep, notes)
    return RunLog(root, header, events, requests, idle, notes)
