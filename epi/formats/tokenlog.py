"""The token-log reader (docs/formats.md §2): one parser, used by the analysis (through the
pandas view in `host.analysis.tokenlog_reader`) and the tests.

A token log is a directory: `run.json` (header), `events.csv` and `requests.csv`
(append-only). This reader checks:

* run.json: format and version (1 or 2: version 2 adds `meters`, the daemons the run synced
  with in `epi run --meter` order, and keys every clock_sync entry by its `meter_url`; a
  version-1 log has one meter at most and reads as before), `run_id`, `status` (and
  `error`), `model` (its `map_id` is an id that becomes a file name: letters, digits, '.',
  '_', '-', never starting with '-' or '.'),
  `placement`, `clock_sync` (integer times, uncertainty ≥ 0), `clock_drift_ppm`;
* every CSV field's type and range (token counts at most 10^7, times in [0, 2^63));
* a final record cut by a crash (no newline) is dropped and noted;
* events are in time order; token times strictly increase within a request;
* every requests.csv row agrees with events.csv (start, first token, last token, token count),
  and every request of events.csv has its requests.csv row: a completed run missing one is
  refused; a failed or unfinished run (killed between the two writes) gets a note;
* idle windows come from paired `idle_start` / `idle_end` events.

Standard library only.
"""

from __future__ import annotations

import csv
import itertools
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypedDict

from epi.core.errors import UserError
from epi.core.vocabulary import Word
from epi.formats.fields import (
    INT64_MAX,
    NAME_MAX_CHARS,
    check_float,
    check_format,
    check_id,
    check_int,
    check_object_list,
    check_str,
    decode_complete_lines,
    read_bytes,
    read_json_object,
)
from epi.formats.json_types import JSONObject

FORMAT = "epi-tokenlog"
FORMAT_VERSION = 2  # 2: run.json `meters`, clock_sync entries keyed by meter_url
RUN_JSON = "run.json"
EVENTS_CSV = "events.csv"
REQUESTS_CSV = "requests.csv"
EVENT_COLUMNS: tuple[str, ...] = (
    "request_id", "repeat", "warmup", "prompt_id", "event", "token_index", "token_id",
    "t_mono_ns", "t_real_ns",
)
REQUEST_COLUMNS: tuple[str, ...] = (
    "request_id", "repeat", "warmup", "prompt_id", "n_prompt_tokens", "n_generated_tokens",
    "t_start_mono_ns", "t_first_token_mono_ns", "t_end_mono_ns", "node",
)


class TokenEvent(Word):
    """A token log event row's kind: an idle window's edges, a request's start, tokens and end,
    and a split configuration's sequence handover from the prefill model to the decode model,
    between token 0 and token 1 (host/run/split.py)."""

    IDLE_START = "idle_start"
    IDLE_END = "idle_end"
    REQUEST_START = "request_start"
    TOKEN = "token"
    REQUEST_END = "request_end"
    HANDOVER_START = "handover_start"
    HANDOVER_END = "handover_end"


class RunStatus(Word):
    """A run's status in its header: written "running" first, then how it ended."""

    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"


class ClockSyncWhen(Word):
    """When a run's clock sync with a meter daemon was taken."""

    START = "start"
    END = "end"
    DURING = "during"


EVENT_KINDS: frozenset[str] = frozenset(TokenEvent.values())
REQUEST_EVENTS = frozenset({TokenEvent.REQUEST_START, TokenEvent.TOKEN, TokenEvent.REQUEST_END,
                            TokenEvent.HANDOVER_START, TokenEvent.HANDOVER_END})
STATUSES = RunStatus.values()
CLOCK_SYNC_WHEN = ClockSyncWhen.values()

# Valid ranges (docs/formats.md §2 states the same).
MAX_TOKENS = 10_000_000  # prompt or generated tokens of one request
MIN_REPEAT = -1000  # warm-ups are logged as repeats −W … −1
MAX_REPEAT = 1_000_000
MAX_TOKEN_ID = 2**31 - 1
MAX_LAYER = 100_000
MAX_ABS_DRIFT_PPM = 1e6
_PROMPT_ID_RE = re.compile(r"^[^,\n\r\"]{0," + str(NAME_MAX_CHARS) + r"}\Z")


@dataclass
class TokenLog:
    """A checked token log: header, events and requests by column, idle windows, notes.

    `requests` holds every requests.csv row, including requests that generated no token
    (their `t_first_token_mono_ns` / `t_end_mono_ns` are None). Empty integer fields are None.
    """

    path: Path
    header: JSONObject
    events: EventColumns
    requests: RequestColumns
    idle: list[tuple[int, int]]  # (t_start_mono_ns, t_end_mono_ns), local clock
    notes: list[str] = field(default_factory=list)


# ------------------------------------------------------------------------------- run.json
def check_header(h: JSONObject, path: Path) -> None:
    """Check run.json's fields in place (one-line `UserError` naming the field)."""
    check_format(h, path, FORMAT, FORMAT_VERSION)
    w = f"{path}: field"
    run_id = h.get("run_id")
    if isinstance(run_id, int) and not isinstance(run_id, bool):
        check_int(run_id, f"{w} run_id", lo=0)
    else:
        check_str(run_id, f"{w} run_id", max_len=NAME_MAX_CHARS)
    status = h.get("status")
    if status not in STATUSES:
        raise UserError(f"{w} status: expected one of {', '.join(STATUSES)}, got {status!r}")
    if "error" in h:
        check_str(h["error"], f"{w} error", null_ok=True, max_len=100_000)
    for key in ("boot_id", "host", "node"):
        if key in h:
            check_str(h[key], f"{w} {key}", null_ok=True, max_len=NAME_MAX_CHARS)
    for key in ("started_mono_ns", "started_real_ns"):
        if key in h:
            check_int(h[key], f"{w} {key}", lo=0, null_ok=True)
    model = h.get("model")
    if not isinstance(model, dict):
        raise UserError(f"{w} model: expected an object, got {model!r}")
    check_id(model.get("map_id"), f"{w} model.map_id", null_ok=True)
    check_str(model.get("path"), f"{w} model.path", null_ok=True)
    sha = model.get("sha256")
    if sha is not None and not (isinstance(sha, str) and re.fullmatch(r"[0-9a-f]{64}", sha)):
        raise UserError(f"{w} model.sha256: expected 64 lower-case hex digits or null, "
                        f"got {sha!r}")
    for key in ("n_layers", "n_params"):
        if key in model:
            check_int(model[key], f"{w} model.{key}", lo=0, null_ok=True)
    settings = h.get("settings")
    if settings is not None and not isinstance(settings, dict):
        raise UserError(f"{w} settings: expected an object, got {settings!r}")
    _check_placement(h, path, str(status))
    _check_clock_sync(h, path)


def _check_placement(h: JSONObject, path: Path, status: str) -> None:
    placement = h.get("placement")
    if not isinstance(placement, list):
        raise UserError(f"{path}: field placement: expected a list, got {placement!r}")
    if not placement and status == RunStatus.COMPLETED:
        raise UserError(f"{path}: field placement is empty (no node holds the layers)")
    seen: set[str] = set()
    for i, p in enumerate(placement):
        w = f"{path}: field placement[{i}]"
        if not isinstance(p, dict):
            raise UserError(f"{w}: expected an object")
        node = check_str(p.get("node"), f"{w}.node", max_len=NAME_MAX_CHARS)
        check_str(p.get("endpoint"), f"{w}.endpoint", null_ok=True, max_len=NAME_MAX_CHARS)
        layers = p.get("layers")
        if not isinstance(layers, list) or len(layers) > MAX_LAYER:
            raise UserError(f"{w}.layers: expected a list of layer numbers")
        for x in layers:
            check_int(x, f"{w}.layers", lo=0, hi=MAX_LAYER)
        if node in seen:
            raise UserError(f"{w}.node: {node!r} appears twice")
        seen.add(node)


def _check_meters(h: JSONObject, path: Path) -> list[str] | None:
    """Version 2's `meters` list (distinct daemon URLs), or None for a version-1 log."""
    if h.get("format_version") == 1:
        return None
    meters = h.get("meters")
    if not isinstance(meters, list) or len(meters) > 64:
        raise UserError(f"{path}: field meters: expected a list of at most 64 meter URLs, "
                        f"got {str(meters)[:60]!r}")
    for i, m in enumerate(meters):
        check_str(m, f"{path}: field meters[{i}]", max_len=NAME_MAX_CHARS)
    if len(set(meters)) != len(meters):
        raise UserError(f"{path}: field meters: a meter URL appears twice")
    return [str(m) for m in meters]


def meter_of(entry: JSONObject, meters: list[str] | None) -> int:
    """Which meter (index into run.json `meters`) a checked clock_sync entry belongs to.

    A version-1 log (`meters` None) has one meter: every entry is meter 0."""
    if meters is None:
        return 0
    return meters.index(str(entry.get("meter_url")))


def _check_clock_sync(h: JSONObject, path: Path) -> None:
    meters = _check_meters(h, path)
    for w, e in check_object_list(h.get("clock_sync", []), f"{path}: field clock_sync"):
        if meters is not None and e.get("meter_url") not in meters:
            raise UserError(f"{w}.meter_url: {str(e.get('meter_url'))[:80]!r} is not one of "
                            "the run's meters")
        check_int(e.get("t_local_mono_ns"), f"{w}.t_local_mono_ns", lo=0)
        check_int(e.get("offset_ns"), f"{w}.offset_ns", lo=-INT64_MAX)
        check_int(e.get("uncertainty_ns"), f"{w}.uncertainty_ns", lo=0)
        if "rtt_ns" in e:
            check_int(e["rtt_ns"], f"{w}.rtt_ns", lo=0, null_ok=True)
        if "when" in e and e["when"] not in CLOCK_SYNC_WHEN:
            raise UserError(f"{w}.when: expected one of {', '.join(CLOCK_SYNC_WHEN)}, "
                            f"got {e['when']!r}")
    if "clock_drift_ppm" in h:
        check_float(h["clock_drift_ppm"], f"{path}: field clock_drift_ppm",
                    lo=-MAX_ABS_DRIFT_PPM, hi=MAX_ABS_DRIFT_PPM, null_ok=True)


# ------------------------------------------------------------------------------- CSV files
def _read_records(path: Path, columns: tuple[str, ...]) -> tuple[list[list[str]], int]:
    """CSV records after the header; a final line without newline is dropped (counted)."""
    text, cut = decode_complete_lines(read_bytes(path, "file missing"), str(path))
    if not text:
        raise UserError(f"{path}: empty file (no header line)")
    try:
        records = list(csv.reader(text.splitlines()))
    except csv.Error as exc:
        raise UserError(f"{path}: not a valid CSV file ({exc})") from None
    if tuple(records[0]) != columns:
        raise UserError(f"{path}: header {','.join(records[0])[:100]!r} is not "
                        f"{','.join(columns)!r}")
    body = records[1:]
    for i, rec in enumerate(body):
        if len(rec) != len(columns):
            raise UserError(f"{path}: line {i + 2}: {len(rec)} fields, expected {len(columns)}")
    return body, cut


def _opt_ints(path: Path, rows: list[list[str]], col: int, name: str, lo: int, hi: int
              ) -> list[int | None]:
    """An integer column whose empty fields are None."""
    out: list[int | None] = []
    for i, r in enumerate(rows):
        text = r[col]
        if text == "":
            out.append(None)
            continue
        if not re.fullmatch(r"[+-]?\d{1,19}", text):
            raise UserError(f"{path}: line {i + 2}: column {name} is {text[:30]!r}, expected "
                            "an integer")
        v = int(text)
        if not lo <= v <= hi:
            raise UserError(f"{path}: line {i + 2}: column {name} is {v}, expected an integer "
                            f"in [{lo}, {hi}]")
        out.append(v)
    return out


def _ints(path: Path, rows: list[list[str]], col: int, name: str, lo: int, hi: int
          ) -> list[int]:
    """An integer column with no empty field."""
    out: list[int] = []
    for i, v in enumerate(_opt_ints(path, rows, col, name, lo, hi)):
        if v is None:
            raise UserError(f"{path}: line {i + 2}: column {name} is empty (an integer is "
                            "required)")
        out.append(v)
    return out


def _strs(path: Path, rows: list[list[str]], col: int, name: str) -> list[str]:
    out = [r[col] for r in rows]
    for i, v in enumerate(out):
        if not _PROMPT_ID_RE.match(v):
            raise UserError(f"{path}: line {i + 2}: column {name} is {v[:30]!r}, expected "
                            f"text of at most {NAME_MAX_CHARS} characters without commas, "
                            "quotes or newlines")
    return out


class EventColumns(TypedDict):
    """events.csv by column (EVENT_COLUMNS); None where a field is empty (idle events)."""

    request_id: list[int | None]
    repeat: list[int | None]
    warmup: list[int | None]
    prompt_id: list[str]
    event: list[str]
    token_index: list[int | None]
    token_id: list[int | None]
    t_mono_ns: list[int]
    t_real_ns: list[int]


class RequestColumns(TypedDict):
    """requests.csv by column (REQUEST_COLUMNS); the first-token and end times are None for a
    request that generated no token."""

    request_id: list[int]
    repeat: list[int]
    warmup: list[int]
    prompt_id: list[str]
    n_prompt_tokens: list[int]
    n_generated_tokens: list[int]
    t_start_mono_ns: list[int]
    t_first_token_mono_ns: list[int | None]
    t_end_mono_ns: list[int | None]
    node: list[str]


def parse_events(path: Path) -> tuple[EventColumns, int]:
    """events.csv by column, checked; (columns, cut final records dropped)."""
    rows, cut = _read_records(path, EVENT_COLUMNS)
    ev: EventColumns = {
        "request_id": _opt_ints(path, rows, 0, "request_id", 0, INT64_MAX),
        "repeat": _opt_ints(path, rows, 1, "repeat", MIN_REPEAT, MAX_REPEAT),
        "warmup": _opt_ints(path, rows, 2, "warmup", 0, 1),
        "prompt_id": _strs(path, rows, 3, "prompt_id"),
        "event": [r[4] for r in rows],
        "token_index": _opt_ints(path, rows, 5, "token_index", 0, MAX_TOKENS),
        "token_id": _opt_ints(path, rows, 6, "token_id", 0, MAX_TOKEN_ID),
        "t_mono_ns": _ints(path, rows, 7, "t_mono_ns", 0, INT64_MAX),
        "t_real_ns": _ints(path, rows, 8, "t_real_ns", 0, INT64_MAX),
    }
    prev = None
    tokens: dict[int, list[tuple[int, int, int]]] = {}  # request → (index, time, row)
    for i, (kind, rid, tok, t) in enumerate(zip(ev["event"], ev["request_id"],
                                                 ev["token_index"], ev["t_mono_ns"],
                                                 strict=True)):
        line = i + 2
        if kind not in EVENT_KINDS:
            raise UserError(f"{path}: line {line}: column event is {kind[:30]!r}, expected one "
                            f"of {', '.join(sorted(EVENT_KINDS))}")
        if kind in REQUEST_EVENTS and rid is None:
            raise UserError(f"{path}: line {line}: column request_id is empty on a {kind} "
                            "event")
        if kind == TokenEvent.TOKEN and tok is None:
            raise UserError(f"{path}: line {line}: column token_index is empty on a token "
                            "event")
        if prev is not None and t < prev:
            raise UserError(f"{path}: line {line}: t_mono_ns goes backwards ({t} after "
                            f"{prev}): events are not in time order")
        prev = t
        if kind == TokenEvent.TOKEN and rid is not None and tok is not None:  # both checked above
            tokens.setdefault(rid, []).append((tok, t, i))
    # Token times strictly increase within a request, in token_index order.
    for rid, toks in tokens.items():
        toks.sort()
        for (ia, ta, _), (ib, tb, line) in itertools.pairwise(toks):
            if ia == ib or tb <= ta:
                raise UserError(f"{path}: line {line + 2}: token t_mono_ns of request {rid} "
                                "is duplicated or unsorted")
    return ev, cut


def parse_requests(path: Path) -> tuple[RequestColumns, int]:
    """requests.csv by column, checked on its own; (columns, cut final records dropped)."""
    rows, cut = _read_records(path, REQUEST_COLUMNS)
    rq: RequestColumns = {
        "request_id": _ints(path, rows, 0, "request_id", 0, INT64_MAX),
        "repeat": _ints(path, rows, 1, "repeat", MIN_REPEAT, MAX_REPEAT),
        "warmup": _ints(path, rows, 2, "warmup", 0, 1),
        "prompt_id": _strs(path, rows, 3, "prompt_id"),
        "n_prompt_tokens": _ints(path, rows, 4, "n_prompt_tokens", 1, MAX_TOKENS),
        "n_generated_tokens": _ints(path, rows, 5, "n_generated_tokens", 0, MAX_TOKENS),
        "t_start_mono_ns": _ints(path, rows, 6, "t_start_mono_ns", 0, INT64_MAX),
        "t_first_token_mono_ns": _opt_ints(path, rows, 7, "t_first_token_mono_ns", 0,
                                           INT64_MAX),
        "t_end_mono_ns": _opt_ints(path, rows, 8, "t_end_mono_ns", 0, INT64_MAX),
        "node": _strs(path, rows, 9, "node"),
    }
    seen: set[int] = set()
    for i in range(len(rows)):
        line = i + 2
        rid = rq["request_id"][i]
        if rid in seen:
            raise UserError(f"{path}: line {line}: request_id {rid} appears twice")
        seen.add(rid)
        first, end, n = (rq["t_first_token_mono_ns"][i], rq["t_end_mono_ns"][i],
                         rq["n_generated_tokens"][i])
        if (first is None) != (end is None) or (first is None) != (n == 0):
            raise UserError(f"{path}: line {line}: t_first_token_mono_ns and t_end_mono_ns "
                            "must both be empty exactly when n_generated_tokens is 0")
        if first is not None and end is not None and not rq["t_start_mono_ns"][i] <= first <= end:
            raise UserError(f"{path}: line {line}: times are unsorted (need t_start_mono_ns ≤ "
                            "t_first_token_mono_ns ≤ t_end_mono_ns)")
    return rq, cut


def _from_events(ev: EventColumns) -> dict[int, dict[str, int]]:
    """Per request: start, first token, last token and token count from events.csv."""
    out: dict[int, dict[str, int]] = {}
    for kind, rid, tok, t in zip(ev["event"], ev["request_id"], ev["token_index"],
                                 ev["t_mono_ns"], strict=True):
        if rid is None:
            continue
        d = out.setdefault(rid, {"n_tokens": 0})
        if kind == TokenEvent.REQUEST_START:
            d["start"] = min(t, d.get("start", t))
        elif kind == TokenEvent.TOKEN:
            d["n_tokens"] += 1
            d["last"] = max(t, d.get("last", t))
            if tok == 0:
                d["first"] = min(t, d.get("first", t))
    return out


def _cross_check(rq: RequestColumns, ev: EventColumns, rq_path: Path,
                 ev_path: Path, status: str, notes: list[str]) -> None:
    derived = _from_events(ev)
    for i, rid in enumerate(rq["request_id"]):
        d = derived.get(rid, {"n_tokens": 0})
        for col, mine, key, what in (
            ("t_start_mono_ns", rq["t_start_mono_ns"][i], "start", "its request_start event"),
            ("t_first_token_mono_ns", rq["t_first_token_mono_ns"][i], "first",
             "its token 0 event"),
            ("t_end_mono_ns", rq["t_end_mono_ns"][i], "last", "its last token event"),
            ("n_generated_tokens", rq["n_generated_tokens"][i], "n_tokens",
             "its number of token events"),
        ):
            theirs = d.get(key)
            if mine != theirs:
                got = "missing" if theirs is None else theirs
                raise UserError(f"{rq_path}: line {i + 2}: {col} {mine} disagrees with {what} "
                                f"in {ev_path.name} ({got})")
    orphans = sorted(set(derived) - set(rq["request_id"]))
    if orphans:
        text = (f"request(s) {', '.join(map(str, orphans[:5]))}"
                + (f" and {len(orphans) - 5} more" if len(orphans) > 5 else ""))
        if status == RunStatus.COMPLETED:
            raise UserError(f"{rq_path}: no row for {text} of {ev_path.name}: the run is "
                            "marked completed, so its requests.csv is incomplete")
        notes.append(f"{rq_path.name}: no row for {text} of {ev_path.name} (the run stopped "
                     "between writing them; not analysed)")


def _idle_windows(ev: EventColumns, path: Path, notes: list[str]
                  ) -> list[tuple[int, int]]:
    windows: list[tuple[int, int]] = []
    open_t: int | None = None
    for kind, t in zip(ev["event"], ev["t_mono_ns"], strict=True):
        if kind == TokenEvent.IDLE_START:
            if open_t is not None:
                raise UserError(f"{path}: idle_start at {t} while the idle window opened at "
                                f"{open_t} is not closed")
            open_t = t
        elif kind == TokenEvent.IDLE_END:
            if open_t is None:
                raise UserError(f"{path}: idle_end at {t} without an idle_start")
            windows.append((open_t, t))
            open_t = None
    if open_t is not None:
        notes.append(f"{path.name}: idle window opened at {open_t} never closed (ignored)")
    return windows


def read_token_log(run_dir: str | os.PathLike[str]) -> TokenLog:
    """Read and check RUN_DIR; one-line `UserError` on anything malformed."""
    root = Path(run_dir)
    if not root.is_dir():
        raise UserError(f"{root}: run directory not found")
    header_path = root / RUN_JSON
    if not header_path.exists():
        raise UserError(f"{root}: no run.json (not an epi token-log directory)")
    header = read_json_object(header_path, "run.json")
    check_header(header, header_path)
    notes: list[str] = []
    ep, rp = root / EVENTS_CSV, root / REQUESTS_CSV
    events, cut_e = parse_events(ep)
    requests, cut_r = parse_requests(rp)
    _cross_check(requests, events, rp, ep, str(header["status"]), notes)  # checked
    for cut, p in ((cut_e, ep), (cut_r, rp)):
        if cut:
            notes.append(f"{p.name}: dropped a truncated final line")
    silent = sum(1 for n in requests["n_generated_tokens"] if n == 0)
    if silent:
        notes.append(f"{rp.name}: {silent} request(s) generated no tokens (not analysed)")
    idle = _idle_windows(events, ep, notes)
    return TokenLog(root, header, events, requests, idle, notes)
