"""The bundle file: a gzip'd tar of regular files plus `bundle.json`, the sha256 of each.

Writing is deterministic (members sorted, times and owners zeroed), so the same analysis
bundles to the same bytes. Reading trusts nothing: a bundle may come from another lab. Every
member is checked before any of it is used — a plain relative path (no `..`, no absolute
path, no backslash, no duplicate), a regular file (no link, device or directory trick), under
the size limits, listed in `bundle.json` with the sha256 it has — and the whole bundle is read
into memory, so nothing is ever written until all of it has passed. `unpack` then writes only
below its output directory. Every problem is one `UserError` line naming the bundle, the
member and the problem.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import re
import tarfile
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from epi.core.errors import UserError
from epi.formats.fields import check_format, parse_json_bytes
from epi.formats.json_types import JSONObject

FORMAT = "epi-bundle"
FORMAT_VERSION = 1
MANIFEST = "bundle.json"
#: limits on what a bundle may hold (a day's 20 Hz, 4-channel trace excerpt is ~40 MB)
MAX_MEMBER_BYTES = 1 << 30
MAX_TOTAL_BYTES = 4 << 30
MAX_MEMBERS = 100_000
_NAME = re.compile(r"[A-Za-z0-9._\-]+")


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def check_member_name(name: str, where: str) -> str:
    """A relative POSIX path of plain parts (letters, digits, `.`, `_`, `-`; no `..`)."""
    parts = name.split("/")
    if (not name or name.startswith("/") or "\\" in name or len(name) > 400
            or any(p in ("", ".", "..") or not _NAME.fullmatch(p) for p in parts)):
        raise UserError(f"{where}: member {name[:120]!r}: not a plain relative path")
    return name


@dataclass(frozen=True)
class Bundle:
    """A bundle read and verified: its manifest and every member's bytes."""

    path: Path
    manifest: JSONObject  # bundle.json as read (its fields are narrowed where used)
    members: dict[str, bytes]

    def json(self, name: str) -> object:
        """A member parsed as JSON (one line naming the bundle and member when it is not)."""
        if name not in self.members:
            raise UserError(f"{self.path}: member {name!r} missing")
        return parse_json_bytes(self.members[name], f"{self.path}: member {name}")


def write(out: Path, files: Mapping[str, bytes], manifest: Mapping[str, object]) -> Path:
    """Write `files` and a `bundle.json` (the manifest plus every member's sha256 and size)
    to `out` atomically."""
    for name in files:
        check_member_name(name, str(out))
    doc = {"format": FORMAT, "format_version": FORMAT_VERSION, **manifest,
           "members": [{"path": n, "sha256": sha256_bytes(files[n]), "bytes": len(files[n])}
                       for n in sorted(files)]}
    everything = {MANIFEST: (json.dumps(doc, indent=1) + "\n").encode(), **files}
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name in [MANIFEST, *sorted(files)]:
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(everything[name]), 0o644, 0
            tar.addfile(info, io.BytesIO(everything[name]))
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    with open(tmp, "wb") as f, gzip.GzipFile(fileobj=f, mode="wb", mtime=0) as gz:
        gz.write(raw.getvalue())
    os.replace(tmp, out)
    return out


def _read_members(path: Path) -> dict[str, bytes]:
    where = str(path)
    members: dict[str, bytes] = {}
    total = 0
    try:
        with tarfile.open(path, mode="r:gz") as tar:
            for info in tar:
                name = check_member_name(info.name, where)
                if not info.isreg():
                    raise UserError(f"{where}: member {name!r}: not a regular file (links, "
                                    "devices and directories are refused)")
                if name in members:
                    raise UserError(f"{where}: member {name!r} appears twice")
                if len(members) >= MAX_MEMBERS:
                    raise UserError(f"{where}: more than {MAX_MEMBERS} members")
                if info.size > MAX_MEMBER_BYTES:
                    raise UserError(f"{where}: member {name!r}: {info.size} bytes, more than "
                                    f"the limit of {MAX_MEMBER_BYTES}")
                total += info.size
                if total > MAX_TOTAL_BYTES:
                    raise UserError(f"{where}: members exceed {MAX_TOTAL_BYTES} bytes in all")
                f = tar.extractfile(info)
                data = f.read(info.size + 1) if f is not None else b""
                if len(data) != info.size:
                    raise UserError(f"{where}: member {name!r}: truncated")
                members[name] = data
    except FileNotFoundError:
        raise UserError(f"{where}: bundle not found") from None
    except IsADirectoryError:
        raise UserError(f"{where}: a directory, not a bundle file") from None
    except (tarfile.TarError, EOFError, OSError, zlib.error) as exc:
        raise UserError(f"{where}: not a readable bundle (gzip'd tar): "
                        f"{str(exc).splitlines()[0] if str(exc) else type(exc).__name__}"
                        ) from None
    return members


def read(path: Path) -> Bundle:
    """Read and verify a bundle: every member listed with its sha256, nothing extra."""
    path = Path(path)
    where = str(path)
    members = _read_members(path)
    if MANIFEST not in members:
        raise UserError(f"{where}: member {MANIFEST!r} missing: not an epi bundle")
    doc = parse_json_bytes(members.pop(MANIFEST), f"{where}: member {MANIFEST}")
    if not isinstance(doc, dict):
        raise UserError(f"{where}: member {MANIFEST}: expected a JSON object")
    check_format(doc, f"{where}: member {MANIFEST}", FORMAT, FORMAT_VERSION)
    listed = doc.get("members")
    if not isinstance(listed, list):
        raise UserError(f"{where}: member {MANIFEST}: field 'members' is not a list")
    seen: set[str] = set()
    for i, entry in enumerate(listed):
        if not isinstance(entry, dict) or not isinstance(entry.get("path"), str):
            raise UserError(f"{where}: member {MANIFEST}: members[{i}] lacks a path")
        name = entry["path"]
        if name in seen:
            raise UserError(f"{where}: member {MANIFEST}: {name!r} listed twice")
        seen.add(name)
        if name not in members:
            raise UserError(f"{where}: member {name!r} is listed in {MANIFEST} but missing")
        if entry.get("sha256") != sha256_bytes(members[name]):
            raise UserError(f"{where}: member {name!r}: sha256 does not match {MANIFEST} "
                            "(altered or corrupt)")
    extra = sorted(set(members) - seen)
    if extra:
        raise UserError(f"{where}: member {extra[0]!r} is not listed in {MANIFEST}")
    return Bundle(path, doc, members)


def unpack(bundle: Bundle, out_dir: Path) -> list[Path]:
    """Write a verified bundle's members (and its manifest) below `out_dir`, which must be
    new or empty; every path is checked to stay inside it."""
    out_dir = Path(out_dir)
    if out_dir.exists() and (not out_dir.is_dir() or any(out_dir.iterdir())):
        raise UserError(f"{out_dir}: exists and is not an empty directory")
    out_dir.mkdir(parents=True, exist_ok=True)
    root = out_dir.resolve()
    files = {MANIFEST: (json.dumps(bundle.manifest, indent=1) + "\n").encode(),
             **bundle.members}
    written = []
    for name, data in sorted(files.items()):
        target = (root / PurePosixPath(check_member_name(name, str(bundle.path)))).resolve()
        if root not in target.parents:
            raise UserError(f"{bundle.path}: member {name!r} would land outside {out_dir}")
        target.parent.mkdir(parents=True, exist_ok=True)
        with open(target, "xb") as f:  # never through an existing file or link
            f.write(data)
        written.append(target)
    return written
