"""The submission summary (`summary.json`): a versioned record of one lab's study.

It crosses labs and file systems, so it is a dataclass record with `to_json`/`from_json`;
`submission.schema.json` beside this module is its JSON Schema (docs/formats.md). Reading
never trusts the file: a missing or mistyped field is one `UserError` line naming it.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Literal, TypeVar

from epi.core.errors import UserError
from epi.formats.json_types import JSONObject

FORMAT = "epi-community-submission"
FORMAT_VERSION = 1
SCHEMA = Path(__file__).with_name("submission.schema.json")
#: a lab or study name: it becomes a file name on the site, so plain characters only
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
Board = Literal["measured", "modelled"]
BOARDS: tuple[Board, ...] = ("measured", "modelled")
#: hardware fields a submission must state (the checker names each one missing)
HARDWARE_FIELDS = ("board", "nodes", "cpu", "memory_gb", "os", "llama_cpp_build_flags",
                   "thermal")


@dataclass(frozen=True)
class Hardware:
    """What the study ran on. `board` is the hardware board file's name (or the board
    the meter names); `thermal` says how the machines were cooled (free text)."""

    board: str
    nodes: list[str]
    cpu: str
    memory_gb: float
    os: str
    llama_cpp_build_flags: list[str]
    thermal: str


@dataclass(frozen=True)
class Protocol:
    """How the figures were made: shots ("zero-shot" when the analysis did not state them),
    accuracy items per benchmark, generated tokens per request, repeats, decide rules."""

    shots: str
    items: dict[str, int]
    tokens_per_request: list[int]
    repeats: list[int]
    decide: dict[str, float | int | str | None]


@dataclass(frozen=True)
class ConfigFigures:
    """One configuration's headline (gross J per generated token over whole requests)."""

    config: str
    model_sha256: str | None
    map_id: str
    map_sha256: str | None
    power_source: str
    n_runs: int
    n_runs_valid: int
    n_repeats: int
    j_per_token: float | None
    j_per_token_ci: list[float | None]
    j_ci_coverage: float | None
    accuracy: float | None
    accuracy_ci: list[float | None]
    epi: float | None
    epi_ci: list[float | None]
    epi_ci_coverage: float | None
    instrument_u_pct: str
    qualification: str
    reason: str | None


@dataclass(frozen=True)
class Submission:
    lab: str
    study: str
    board: Board  # the leaderboard: "measured" only when no figure is modelled
    bundle_file: str
    bundle_sha256: str
    hardware: Hardware
    protocol: Protocol
    configs: list[ConfigFigures]
    epi_version: str

    def to_json(self) -> str:
        doc = {"format": FORMAT, "format_version": FORMAT_VERSION, **asdict(self)}
        return json.dumps(doc, indent=1, sort_keys=True) + "\n"

    @classmethod
    def from_json(cls, text: str, where: str) -> Submission:
        try:
            doc = json.loads(text)
        except (json.JSONDecodeError, RecursionError) as exc:
            raise UserError(f"{where}: not JSON ({exc.__class__.__name__})") from None
        obj = _object(doc, where)
        if obj.get("format") != FORMAT or obj.get("format_version") != FORMAT_VERSION:
            raise UserError(f"{where}: not an {FORMAT} version {FORMAT_VERSION} file")
        hw = _build(Hardware, _object(obj.get("hardware"), f"{where}: hardware"),
                    f"{where}: hardware")
        proto = _build(Protocol, _object(obj.get("protocol"), f"{where}: protocol"),
                       f"{where}: protocol")
        confs = obj.get("configs")
        if not isinstance(confs, list) or not confs:
            raise UserError(f"{where}: configs: expected a non-empty list")
        figures = [_build(ConfigFigures, _object(c, f"{where}: configs[{i}]"),
                          f"{where}: configs[{i}]") for i, c in enumerate(confs)]
        top = {k: v for k, v in obj.items() if k not in ("hardware", "protocol", "configs")}
        top.update(hardware=hw, protocol=proto, configs=figures)
        top.pop("format"), top.pop("format_version")
        sub = _build(cls, top, where, nested=("hardware", "protocol", "configs"))
        for key, value in (("lab", sub.lab), ("study", sub.study)):
            if not NAME.fullmatch(value):
                raise UserError(f"{where}: {key}: {value[:80]!r}: use letters, digits, '.', "
                                "'_', '-' (at most 64)")
        if sub.board not in BOARDS:
            raise UserError(f"{where}: board: {sub.board!r} is not one of {', '.join(BOARDS)}")
        return sub


def missing_hardware(doc: object) -> list[str]:
    """The hardware fields a raw summary lacks or leaves empty (for the checker's lines)."""
    hw = doc.get("hardware") if isinstance(doc, dict) else None
    if not isinstance(hw, dict):
        return list(HARDWARE_FIELDS)
    return [f for f in HARDWARE_FIELDS if hw.get(f) in (None, "", [])]


def _object(value: object, where: str) -> JSONObject:
    if not isinstance(value, dict):
        raise UserError(f"{where}: expected a JSON object")
    return value


_TYPES: dict[str, tuple[type, ...]] = {
    "str": (str,), "int": (int,), "float": (int, float), "Board": (str,),
}


T = TypeVar("T")


def _build(cls: type[T], obj: JSONObject, where: str,
              nested: tuple[str, ...] = ()) -> T:
    """`cls(**obj)` after checking every field is present, none extra, and plain types."""
    names = [f.name for f in fields(cls)]  # type: ignore[arg-type]
    extra = sorted(set(obj) - set(names))
    if extra:
        raise UserError(f"{where}: unknown field {extra[0]!r}")
    for f in fields(cls):  # type: ignore[arg-type]
        if f.name not in obj:
            raise UserError(f"{where}: field {f.name!r} missing")
        if f.name in nested:
            continue
        v, kind = obj[f.name], str(f.type)
        optional = "None" in kind
        base = kind.replace(" | None", "")
        if v is None:
            if not optional:
                raise UserError(f"{where}: field {f.name!r} is null")
            continue
        if base.startswith("list"):
            ok = isinstance(v, list) and all(
                x is None or (isinstance(x, (int, float, str)) and not isinstance(x, bool))
                for x in v)
        elif base.startswith("dict"):
            ok = isinstance(v, dict) and all(
                x is None or (isinstance(x, (int, float, str)) and not isinstance(x, bool))
                for x in v.values())
        else:
            ok = isinstance(v, _TYPES.get(base, (object,))) and not isinstance(v, bool)
        if not ok:
            raise UserError(f"{where}: field {f.name!r} has the wrong type ({base} expected)")
    return cls(**obj)
