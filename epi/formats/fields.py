"""Field checks shared by every reader: JSON loading, format/version, typed and ranged values.

Each check raises `UserError` with one line: ``<where>: field <key>: expected ..., got ...``.
Standard library only.
"""

from __future__ import annotations

import importlib
import json
import math
import re
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal, overload

from epi.core.errors import UserError
from epi.formats.json_types import JSONObject

#: the longest name a file may give (run ids, node, host and channel names, prompt ids):
#: docs/formats.md, "Valid ranges"
NAME_MAX_CHARS = 256

# Deeper JSON than this is not a file any epi writer produces (and would exhaust the stack).
MAX_JSON_DEPTH = 64
# A safe file-name id: starts with a letter or digit (never '-' or '.'), then . _ - allowed.
ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}\Z")  # \Z: "$" would pass "x\n"
INT64_MAX = 2**63 - 1


def _refuse_constant(name: str) -> float:
    raise ValueError(f"{name} is not a JSON number")


def _depth(value: object) -> int:
    """Nesting depth of a decoded JSON value (iterative: never recurses)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        v, d = stack.pop()
        if isinstance(v, dict | list):
            deepest = max(deepest, d)
            if d > MAX_JSON_DEPTH:
                return d
            stack.extend((c, d + 1) for c in (v.values() if isinstance(v, dict) else v))
    return deepest


def decode_utf8(raw: bytes, where: str) -> str:
    """Strict UTF-8 text of a whole file; anything else is a one-line `UserError`."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UserError(f"{where}: not UTF-8 text (byte {exc.start})") from None


def decode_complete_lines(data: bytes, where: str, *, garbage_tail: bool = False
                          ) -> tuple[str, int]:
    """The UTF-8 text of the newline-terminated part of an append-only file, and how many
    lines were dropped. A final record without its newline (cut by a crash) is dropped; with
    `garbage_tail`, so is a last line that is not UTF-8 (a power-cut tail). Non-UTF-8 anywhere
    else is damage: a one-line `UserError` naming the line."""
    dropped = 0
    if data and not data.endswith(b"\n"):
        data = data[: data.rfind(b"\n") + 1]
        dropped = 1
    try:
        return data.decode("utf-8"), dropped
    except UnicodeDecodeError as exc:
        if not garbage_tail or data.find(b"\n", exc.start) != len(data) - 1:
            line = data.count(b"\n", 0, exc.start) + 1
            raise UserError(f"{where}: line {line}: not UTF-8 text") from None
        return data[: data.rfind(b"\n", 0, exc.start) + 1].decode("utf-8"), dropped + 1


def parse_json_bytes(raw: bytes, where: str) -> object:
    """Decode strict UTF-8 JSON; NaN/Infinity and nesting deeper than 64 are refused."""
    text = decode_utf8(raw, where)
    try:
        data = json.loads(text, parse_constant=_refuse_constant)
    except json.JSONDecodeError as exc:
        raise UserError(f"{where}: not valid JSON (line {exc.lineno}: {exc.msg})") from None
    except ValueError as exc:
        raise UserError(f"{where}: not valid JSON ({exc})") from None
    except RecursionError:
        raise UserError(f"{where}: JSON nested deeper than {MAX_JSON_DEPTH} levels") from None
    if _depth(data) > MAX_JSON_DEPTH:
        raise UserError(f"{where}: JSON nested deeper than {MAX_JSON_DEPTH} levels")
    return data


def read_bytes(path: Path, missing: str) -> bytes:
    """A file's bytes; a missing or unreadable file is a one-line `UserError` (`missing` says
    what a missing file means)."""
    try:
        return Path(path).read_bytes()
    except FileNotFoundError:
        raise UserError(f"{path}: {missing}") from None
    except OSError as exc:
        raise UserError(f"{path}: cannot read ({exc.strerror})") from None


def read_toml_file(path: Path, what: str = "file") -> dict[str, Any]:
    """A TOML file's tables (tomllib, or tomli on Python 3.10). A missing, unreadable,
    non-UTF-8, malformed or absurdly nested file is a one-line `UserError` (`what` names the
    file's role in the missing-file message)."""
    if sys.version_info >= (3, 11):
        import tomllib
    else:
        try:
            # tomli is the 3.10 back-port; imported by name because it is not installed where
            # mypy checks (a 3.11 venv), so mypy sees a module it has no stubs for
            tomllib = importlib.import_module("tomli")
        except ModuleNotFoundError:
            raise UserError(f"{path}: reading TOML needs Python 3.11+ or tomli") from None
    text = decode_utf8(read_bytes(path, f"{what} not found"), str(path))
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise UserError(f"{path}: not valid TOML: {exc}") from None
    except RecursionError:
        raise UserError(f"{path}: not valid TOML: nested too deeply") from None


def read_json_object(path: Path, what: str = "file") -> dict[str, object]:
    """Read a file holding one JSON object (one-line `UserError` for anything else).

    Its values are `object`: a reader narrows each field it uses (check_str, check_int, ...)
    instead of trusting the file."""
    data = parse_json_bytes(read_bytes(path, f"{what} not found"), str(path))
    if not isinstance(data, dict):
        raise UserError(f"{path}: expected a JSON object, got {type(data).__name__}")
    return data


def check_format(data: Mapping[str, object], where: object, fmt: str, version: int) -> int:
    """Refuse another format, or a `format_version` that is not 1..`version`."""
    if data.get("format") != fmt:
        raise UserError(f"{where}: field format is {data.get('format')!r}, expected {fmt!r}")
    ver = data.get("format_version")
    if not isinstance(ver, int) or isinstance(ver, bool) or ver < 1:
        raise UserError(f"{where}: field format_version is {ver!r}, expected an integer ≥ 1")
    if ver > version:
        raise UserError(f"{where}: field format_version {ver} is newer than this reader knows "
                        f"({version}); upgrade epi")
    return ver


def range_text(lo: float | None, hi: float | None, lo_open: bool) -> str:
    """' in [lo, hi]', ' > lo', ' ≤ hi' or '' (with a leading space) for messages."""
    if lo is not None and hi is not None:
        return f" in {'(' if lo_open else '['}{lo:g}, {hi:g}]"
    if lo is not None:
        return f" {'>' if lo_open else '≥'} {lo:g}"
    if hi is not None:
        return f" ≤ {hi:g}"
    return ""


@overload
def check_int(value: object, where: str, *, lo: int | None = None, hi: int | None = INT64_MAX,
              null_ok: Literal[False] = False) -> int: ...
@overload
def check_int(value: object, where: str, *, lo: int | None = None, hi: int | None = INT64_MAX,
              null_ok: bool) -> int | None: ...
def check_int(value: object, where: str, *, lo: int | None = None, hi: int | None = INT64_MAX,
              null_ok: bool = False) -> int | None:
    """An integer (not a bool, not a float) within [lo, hi]; None only when null_ok."""
    if value is None and null_ok:
        return None
    if (isinstance(value, int) and not isinstance(value, bool)
            and (lo is None or value >= lo) and (hi is None or value <= hi)):
        return value
    want = "an integer" + range_text(lo, hi, False) + (" or null" if null_ok else "")
    raise UserError(f"{where}: expected {want}, got {value!r}")


@overload
def check_float(value: object, where: str, *, lo: float | None = None, hi: float | None = None,
                lo_open: bool = False, null_ok: Literal[False] = False) -> float: ...
@overload
def check_float(value: object, where: str, *, lo: float | None = None, hi: float | None = None,
                lo_open: bool = False, null_ok: bool) -> float | None: ...
def check_float(value: object, where: str, *, lo: float | None = None, hi: float | None = None,
                lo_open: bool = False, null_ok: bool = False) -> float | None:
    """A finite number (int or float, not a bool) within the range; None only when null_ok."""
    if value is None and null_ok:
        return None
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        v = float(value)
        below = lo is not None and (v <= lo if lo_open else v < lo)
        if not below and (hi is None or v <= hi):
            return v
    want = "a finite number" + range_text(lo, hi, lo_open) + (" or null" if null_ok else "")
    raise UserError(f"{where}: expected {want}, got {value!r}")


@overload
def check_str(value: object, where: str, *, null_ok: Literal[False] = False,
              max_len: int = 4096) -> str: ...
@overload
def check_str(value: object, where: str, *, null_ok: bool, max_len: int = 4096
              ) -> str | None: ...
def check_str(value: object, where: str, *, null_ok: bool = False, max_len: int = 4096
              ) -> str | None:
    """A non-empty string (None only when null_ok)."""
    if value is None and null_ok:
        return None
    if isinstance(value, str) and value.strip() and len(value) <= max_len:
        return value
    want = "a non-empty string" + (" or null" if null_ok else "")
    raise UserError(f"{where}: expected {want}, got {_short(value)}")


@overload
def check_id(value: object, where: str, *, null_ok: Literal[False] = False) -> str: ...
@overload
def check_id(value: object, where: str, *, null_ok: bool) -> str | None: ...
def check_id(value: object, where: str, *, null_ok: bool = False) -> str | None:
    """An id that becomes part of a file name: letters, digits, '.', '_', '-', at most 128
    characters, starting with a letter or digit (so never '-x', '.', '..' or a path)."""
    if value is None and null_ok:
        return None
    if isinstance(value, str) and ID_RE.match(value):
        return value
    raise UserError(f"{where}: expected an id of letters, digits, '.', '_', '-' that starts "
                    f"with a letter or digit, got {_short(value)}")


def check_bool(value: object, where: str) -> bool:
    """true or false (not 0/1)."""
    if isinstance(value, bool):
        return value
    raise UserError(f"{where}: expected true or false, got {_short(value)}")


def check_object(value: object, where: str) -> JSONObject:
    """A JSON object (its values still to be checked); anything else is a one-line UserError."""
    if not isinstance(value, dict):
        raise UserError(f"{where}: expected an object, got {_short(value)}")
    return value


def check_str_list(value: object, where: str) -> list[str]:
    """A JSON list of non-empty strings."""
    if not isinstance(value, list):
        raise UserError(f"{where}: expected a list, got {_short(value)}")
    return [check_str(v, f"{where}[{i}]") for i, v in enumerate(value)]


def check_object_list(value: object, where: str) -> list[tuple[str, JSONObject]]:
    """A JSON list of objects, as (``where[i]``, object) pairs for checking each one's fields;
    anything else is a one-line `UserError`."""
    if not isinstance(value, list):
        raise UserError(f"{where}: expected a list, got {_short(value)}")
    for i, item in enumerate(value):
        if not isinstance(item, dict):
            raise UserError(f"{where}[{i}]: expected an object, got {_short(item)}")
    return [(f"{where}[{i}]", item) for i, item in enumerate(value)]


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
