"""The campaign journal: an append-only JSON-lines file, one fsynced line per event.

A step is *finished* only when its `done` line is on disk; `started` lines let a resumed
campaign say what was interrupted (and clean up what the interrupted step left running).
A line cut short by a power cut (no final newline, or not JSON) is ignored; nothing after it
can exist, because lines are only ever appended.

Events are typed (`Session`, `Started`, `Done`, `Failed`); every line read back is checked
(an object, a known event, a step id, whole attempt numbers), and anything else is one
`UserError` line naming the journal's line. Paths of what the campaign made (run
directories, logs, step outputs) are stored *relative to the campaign directory*, so a moved
or copied campaign points at its own files. A path that is absolute and outside the campaign
directory (a journal from an older epi) is mapped into it only where the journal itself
proves the old location (the campaign directory a session or a step marker recorded);
otherwise it is treated as missing, and the campaign never touches it.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypedDict, Union, cast

from epi.core.errors import UserError
from epi.core.files import fsync_dir
from epi.core.vocabulary import Word
from epi.formats.json_types import JSONObject

JOURNAL = "journal.jsonl"
# step-result fields that name something the campaign made inside its directory
OWN_PATH_KEYS = ("run_dir", "out", "output")


class Settle(TypedDict, total=False):
    """The thermal settle before a run, as host.campaign.thermal.settle returns it."""

    rule: str
    wait_s: float
    tolerance: float
    window_s: float
    waited_s: float
    settled: bool
    mean_power_w: float
    max_deviation: float | None
    n_readings: int
    reason: str


class StepResult(TypedDict, total=False):
    """A finished step's result (host.campaign.step writes it; paths are relative to the
    campaign directory once journaled, except a prepared model's and the evaluation data's,
    which live outside any campaign)."""

    path: str | None  # prepare (None: the manifest has none)
    sha256: str | None
    output: str  # quantize
    skipped: bool
    size_bytes: int | None
    bits_per_weight: float | None
    prepared: list[str]  # data
    root: str
    out: str  # accuracy, analysis, report
    composite: float | None
    perplexity: float | None
    cached: bool
    run_dir: str  # run
    failed: bool
    n_requests: int
    n_measured: int
    prefill_ms_median: float | None
    decode_tok_s_median: float | None


@dataclass(frozen=True)
class Session:
    study: str
    study_sha256: str | None
    root: str | None  # the campaign directory this session ran in (absolute)
    pid: int | None = None


@dataclass(frozen=True)
class Started:
    step: str
    attempt: int
    pgid: int | None = None  # None: the step runs inside the campaign's own process
    marker: str | None = None
    run_dir: str | None = None  # relative to the campaign directory
    log: str | None = None
    settle: Settle | None = None


@dataclass(frozen=True)
class Done:
    step: str
    attempt: int
    result: StepResult
    settle: Settle | None = None


@dataclass(frozen=True)
class Failed:
    step: str
    attempt: int
    rc: int | None
    reason: str


Event = Union[Session, Started, Done, Failed]


class JournalEvent(Word):
    """The `event` word of a journal line: which of the four records the line holds."""

    SESSION = "session"
    STARTED = "started"
    DONE = "done"
    FAILED = "failed"


KINDS: dict[type, JournalEvent] = {Session: JournalEvent.SESSION, Started: JournalEvent.STARTED,
                                   Done: JournalEvent.DONE, Failed: JournalEvent.FAILED}


@dataclass
class JournalState:
    """What the journal says: finished steps, and started-but-unfinished ones."""

    done: dict[str, Done] = field(default_factory=dict)
    interrupted: dict[str, Started] = field(default_factory=dict)
    attempts: dict[str, int] = field(default_factory=dict)
    sessions: int = 0
    torn_line: bool = False
    study_sha256: str | None = None  # of the study file the last session ran


def marker_root(marker: str | None, step: str, attempt: int) -> str | None:
    """The campaign directory inside a step marker (`ROOT:STEP:ATTEMPT`)."""
    tail = f":{step}:{attempt}"
    return marker[: -len(tail)] if marker and marker.endswith(tail) else None


def relative_to_campaign(text: str | None, root: Path, old_roots: list[str]) -> str | None:
    """A journaled path, read back: relative to the campaign directory `root`. A relative
    one stays (unless it climbs out with '..'); an absolute one inside `root` or inside one
    of the campaign's recorded earlier locations becomes relative; one elsewhere gives
    None: not this campaign's."""
    if not text:
        return None
    p = Path(os.path.normpath(text))
    if not p.is_absolute():
        return None if p.parts[:1] == ("..",) else str(p)
    return _inside(p, [*_forms(root), *old_roots])


def stored_path(text: str, root: Path) -> str:
    """A path the campaign made (absolute, or relative to the working directory) as the
    journal stores it: relative to `root` when inside it, else as given."""
    return _inside(Path(os.path.abspath(text)), _forms(root)) or text


def _forms(root: Path) -> list[str]:
    return list(dict.fromkeys([os.path.abspath(root), str(root.resolve())]))


def _inside(p: Path, roots: list[str]) -> str | None:
    for r in roots:
        try:
            return str(p.relative_to(r))
        except ValueError:
            continue
    return None


class Journal:
    """Append events; read back the state. One writer at a time (the campaign lock)."""

    def __init__(self, directory: Path) -> None:
        self.root = Path(directory)
        self.path = self.root / JOURNAL

    def own(self, text: str | None) -> Path | None:
        """The campaign's file a journaled (relative) path names, or None when none."""
        return None if text is None else self.root / text

    def read(self) -> JournalState:
        state = JournalState()
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return state
        except OSError as exc:
            raise UserError(f"{self.path}: cannot read the journal ({exc.strerror})") from None
        lines = data.split(b"\n")
        if lines and lines[-1] != b"":
            state.torn_line = True  # the last line never got its newline
        old_roots: list[str] = []
        for n, raw in enumerate(lines[:-1], 1):
            ev = self._parse(raw, n, old_roots)
            if isinstance(ev, Session):
                state.sessions += 1
                state.study_sha256 = ev.study_sha256
            elif isinstance(ev, Started):
                state.attempts[ev.step] = max(state.attempts.get(ev.step, 0) + 1, ev.attempt)
                state.interrupted[ev.step] = ev
            elif isinstance(ev, Done):
                state.done[ev.step] = ev
                state.interrupted.pop(ev.step, None)
            else:
                state.interrupted.pop(ev.step, None)
        return state

    def _parse(self, raw: bytes, n: int, old_roots: list[str]) -> Event:
        where = f"{self.path}: line {n}"
        try:
            ev = json.loads(raw)
        except ValueError:
            raise UserError(f"{where} is not JSON (the journal was edited?)") from None
        if not isinstance(ev, dict):
            raise UserError(f"{where}: expected an object, got {type(ev).__name__} "
                            "(the journal was edited?)")
        kind = JournalEvent.parse(ev.get("event"))
        if kind is JournalEvent.SESSION:
            root = _str(ev, "root", where)
            if root:
                old_roots.append(root)
            return Session(_str(ev, "study", where) or "",
                           _str(ev, "study_sha256", where), root,
                           _int(ev, "pid", where))
        if kind is None:
            *first, last = JournalEvent.values()
            raise UserError(f"{where}: field 'event': {ev.get('event')!r} is not "
                            f"{', '.join(first)} or {last} (the journal was edited?)")
        step = ev.get("step")
        if not isinstance(step, str) or not step:
            raise UserError(f"{where}: field 'step': expected a step id, got {step!r}")
        attempt = _int(ev, "attempt", where)
        attempt = 1 if attempt is None else attempt
        if not 1 <= attempt <= 1_000_000:
            raise UserError(f"{where}: field 'attempt': {attempt} is not a positive integer")
        settle = _obj(ev, "settle", where)
        if kind is JournalEvent.STARTED:
            marker = _str(ev, "marker", where)
            mroot = marker_root(marker, step, attempt)
            if mroot and mroot not in old_roots:
                old_roots.append(mroot)
            return Started(step, attempt, _int(ev, "pgid", where), marker,
                           relative_to_campaign(_str(ev, "run_dir", where), self.root,
                                                old_roots),
                           relative_to_campaign(_str(ev, "log", where), self.root,
                                                old_roots),
                           cast("Settle | None", settle))  # a checked JSON object
        if kind is JournalEvent.DONE:
            result = _obj(ev, "result", where) or {}
            for key in OWN_PATH_KEYS:
                if key in result:
                    value = result[key]
                    if not isinstance(value, str):
                        raise UserError(f"{where}: field 'result.{key}': expected a path")
                    rel = relative_to_campaign(value, self.root, old_roots)
                    if rel is None:
                        del result[key]  # outside this campaign: never used, never touched
                    else:
                        result[key] = rel
            return Done(step, attempt, cast(StepResult, result), cast("Settle | None", settle))
        return Failed(step, attempt, _int(ev, "rc", where),
                      _str(ev, "reason", where) or "")

    def append(self, ev: Event) -> Event:
        """Write one event line and fsync it before returning. Paths the campaign made are
        written relative to its directory."""
        doc: dict[str, object] = {"event": KINDS[type(ev)],
                                  "step": None if isinstance(ev, Session) else ev.step,
                                  "t_real_ns": time.time_ns()}
        for key, value in vars(ev).items():
            if key != "step" and value is not None:
                doc[key] = value
        if isinstance(ev, Done):
            doc["result"] = self.relative_result(ev.result)
        if isinstance(ev, Started):
            for key in ("run_dir", "log"):
                if key in doc:
                    doc[key] = stored_path(str(doc[key]), self.root)
        line = (json.dumps(doc, sort_keys=False) + "\n").encode()
        new = not self.path.exists()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._repair_torn_tail()
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line)
            os.fsync(fd)
        finally:
            os.close(fd)
        if new:
            fsync_dir(self.path.parent)
        return ev

    def relative_result(self, result: StepResult) -> StepResult:
        out = StepResult(**result)
        for key in OWN_PATH_KEYS:
            text = out.get(key)
            if isinstance(text, str):
                out[key] = stored_path(text, self.root)  # type: ignore[literal-required]  # OWN_PATH_KEYS are str fields
        return out

    def _repair_torn_tail(self) -> None:
        """Cut a torn last line (power cut mid-write) so the next line starts clean."""
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return
        if data and not data.endswith(b"\n"):
            keep = data.rfind(b"\n") + 1
            with open(self.path, "r+b") as fh:
                fh.truncate(keep)
                fh.flush()
                os.fsync(fh.fileno())


def _field(ev: JSONObject, key: str, kind: type, where: str) -> object:
    """An optional field of `kind` (None when absent or null); anything else is refused."""
    value = ev.get(key)
    if value is None:
        return None
    if (isinstance(value, bool) and kind is not bool) or not isinstance(value, kind):
        raise UserError(f"{where}: field {key!r}: expected {kind.__name__}, got {value!r}")
    return value


def _str(ev: JSONObject, key: str, where: str) -> str | None:
    value = _field(ev, key, str, where)
    return value if isinstance(value, str) else None


def _int(ev: JSONObject, key: str, where: str) -> int | None:
    value = _field(ev, key, int, where)
    return value if isinstance(value, int) else None


def _obj(ev: JSONObject, key: str, where: str) -> dict[str, object] | None:
    value = _field(ev, key, dict, where)
    return value if isinstance(value, dict) else None
