"""A columnar cache of a trace's samples: one Parquet file per segment, beside the CSV.

A study's trace is tens of millions of rows; checking them in pure Python (the one reader,
`epi.formats.trace`) takes minutes, and holding them as Python objects takes many GB. The
cache keeps exactly what that reader returned for one samples.csv — the checked columns (as
numpy: an empty float field is NaN, an empty status 0, which is how the analysis reads them),
the crash-cut records it dropped, the readings it set to missing and each channel's ends —
so a later analysis reads only the columns it needs, at C speed.

The CSV segments stay the crash-safe source of truth. A cache file is keyed by the segment's
samples.csv size, mtime, ctime, inode and SHA-256 hash and by the channel set its meta
declares. When the stat fields are those of the key (and were not racy), the CSV is not read
at all; when they differ, the CSV is read and hashed, and a file with the same bytes (copied,
touched) still uses its cache, which then stores the new key; any other change rebuilds it
(from the CSV, through the checked reader). A cache that cannot be written (a read-only trace
directory) is skipped, one that cannot be read is rebuilt; neither is an error.
Layout: ``TRACE_DIR/.epi-cache/seg-NNNNNN.samples.parquet`` (docs/formats.md §1).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from epi.formats import trace as fmt
from epi.formats.json_types import JSONObject

CACHE_DIRNAME = ".epi-cache"
CACHE_VERSION = 2
KEY_FIELD = b"epi_trace_cache"
INT_COLUMNS = ("seq", "channel", "t_mono_ns", "t_real_ns", "status")


# A file whose status changed less than this before its key was taken may still change
# within the file system's timestamp granularity without a new ctime: its key is not trusted
# on its stat alone (the "racily clean" case git handles the same way).
RACY_NS = 2_000_000_000


def stat_key(st: os.stat_result) -> dict[str, int]:
    """What identifies one version of a file without reading it: size, mtime, ctime, inode.

    A write to the file sets its mtime and ctime; setting the mtime back (os.utime) sets
    the ctime again, and nothing but the kernel sets a ctime, so equal stat fields mean the
    file was not touched since (unless it was racy, see RACY_NS)."""
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "ctime_ns": st.st_ctime_ns,
            "ino": st.st_ino, "dev": st.st_dev}


def read_keyed(path: Path, channels: set[int] | None) -> tuple[bytes, JSONObject | None]:
    """A file's bytes and its key: its stat fields (`stat_key`), when they were taken and the
    SHA-256 of the bytes (twice BLAKE2b's speed on CPUs with SHA instructions), with the
    channel set it is checked against; key None when the file changed while it was read (a
    live segment)."""
    before = path.stat()
    keyed_at_ns = time.time_ns()
    data = path.read_bytes()
    after = path.stat()
    if stat_key(before) != stat_key(after) or len(data) != after.st_size:
        return data, None
    return data, {"version": CACHE_VERSION, **stat_key(after), "keyed_at_ns": keyed_at_ns,
                  "sha256": hashlib.sha256(data).hexdigest(),
                  "channels": sorted(channels) if channels is not None else None}


def stat_matches(path: Path, key: Mapping[str, object], channels: set[int] | None) -> bool:
    """Whether the cached `key` still describes `path` by its stat fields alone (no read)."""
    try:
        now = stat_key(path.stat())
    except OSError:
        return False
    keyed_at = key.get("keyed_at_ns")
    return (key.get("version") == CACHE_VERSION and isinstance(keyed_at, int)
            and all(key.get(k) == v for k, v in now.items())
            and now["ctime_ns"] < keyed_at - RACY_NS
            and key.get("channels") == (sorted(channels) if channels is not None else None))


def same_content(key: Mapping[str, object], cached: Mapping[str, object]) -> bool:
    """Whether two keys name the same bytes checked against the same channels (the file may
    have been copied or touched: other stat fields, same content)."""
    return all(key.get(k) == cached.get(k) for k in ("version", "size", "sha256", "channels"))


def host_columns(columns: Mapping[str, fmt.Column]) -> dict[str, np.ndarray]:
    """The reader's columns as the analysis holds them: int64 (an empty status is 0) and
    float64 (an empty field is NaN)."""
    out: dict[str, np.ndarray] = {}
    for name in fmt.SAMPLE_COLUMNS:
        values = columns[name]
        if isinstance(values, np.ndarray):
            out[name] = values
        elif name in INT_COLUMNS:
            vals = [0 if v is None else v for v in values] if None in values else values
            out[name] = np.array(vals, dtype=np.int64)
        else:
            out[name] = np.array(values, dtype=np.float64)  # None → NaN
    return out


CLEAN_BYTES = b"0123456789.,-+eE\n"  # all a clean samples body contains
HEADER_LINE = (",".join(fmt.SAMPLE_COLUMNS) + "\n").encode()


def read_clean_samples(data: bytes, channels: set[int] | None) -> fmt.SegmentSamples | None:
    """A samples.csv that is plainly clean, parsed by Arrow's C++ CSV reader; None for any
    file that is not (it then goes to the checked reader, which accepts or names the fault).

    Clean means: the exact header; every byte of the body a digit, `.`, `,`, `-`, `+`, `e`,
    `E` or a newline, ending with a newline (so no crash-cut tail, quotes, spaces, NULs, hex
    or non-UTF-8 text: the characters on which Python's `int`/`float` and Arrow could
    disagree); every row of 11 fields that parse as the column's type; no empty field but a
    float or status; every value finite and inside its documented range; channels those of
    the meta; each channel's t_mono_ns strictly increasing. The values are then those the
    checked reader returns (both parse decimal text with correct rounding)."""
    if not data.startswith(HEADER_LINE) or not data.endswith(b"\n") or len(data) == len(
            HEADER_LINE):
        return None
    if data.translate(None, CLEAN_BYTES) != HEADER_LINE.translate(None, CLEAN_BYTES):
        return None  # the body holds a byte outside CLEAN_BYTES
    types = {n: pa.int64() if n in INT_COLUMNS else pa.float64() for n in fmt.SAMPLE_COLUMNS}
    try:
        table = pacsv.read_csv(
            pa.py_buffer(data),
            read_options=pacsv.ReadOptions(block_size=1 << 24),
            parse_options=pacsv.ParseOptions(quote_char=False, double_quote=False,
                                              escape_char=False, ignore_empty_lines=False),
            convert_options=pacsv.ConvertOptions(column_types=types, null_values=[""],
                                                 strings_can_be_null=False,
                                                 include_columns=list(fmt.SAMPLE_COLUMNS)))
    except pa.ArrowException:
        return None
    if table.column_names != list(fmt.SAMPLE_COLUMNS):
        return None
    cols: dict[str, np.ndarray] = {}
    for name in fmt.SAMPLE_COLUMNS:
        col = table.column(name)
        if name in INT_COLUMNS:
            if col.null_count and name != "status":
                return None
            cols[name] = col.fill_null(0).to_numpy() if col.null_count else col.to_numpy()
        else:
            cols[name] = col.to_numpy()  # null → NaN, as the checked reader's None
    del table
    for name, lo, hi in ((("seq", 0, fmt.INT64_MAX), ("channel", 0, fmt.MAX_CHANNEL),
                          ("t_mono_ns", 0, fmt.INT64_MAX), ("t_real_ns", 0, fmt.INT64_MAX),
                          ("status", 0, fmt.MAX_STATUS))):
        if cols[name].min() < lo or cols[name].max() > hi:
            return None
    for name, flo, fhi in fmt.FLOAT_RANGES:
        v = cols[name]
        present = v[~np.isnan(v)]
        if len(present) and not (np.isfinite(present).all() and flo <= present.min()
                                 and present.max() <= fhi):
            return None
    chan, t = cols["channel"], cols["t_mono_ns"]
    present_ch = np.unique(chan).tolist()
    if channels and not set(present_ch) <= channels:
        return None
    ends: dict[int, fmt.ChannelEnds] = {}
    real = cols["t_real_ns"]
    for ch in present_ch:
        idx = np.flatnonzero(chan == ch)
        if len(idx) > 1 and not (np.diff(t[idx]) > 0).all():
            return None
        i, j = int(idx[0]), int(idx[-1])
        ends[ch] = fmt.ChannelEnds(int(t[i]), int(real[i]), int(t[j]), int(real[j]))
    return fmt.SegmentSamples(cols, 0, [], ends)


class ParquetColumns(Mapping[str, np.ndarray]):
    """A cached segment's columns, read from its Parquet file on demand (none held)."""

    def __init__(self, path: Path, n_rows: int) -> None:
        self.path = path
        self.n_rows = n_rows

    def read(self, names: Sequence[str]) -> dict[str, np.ndarray]:
        """Several columns in one read of the file."""
        table = pq.read_table(self.path, columns=list(names))
        return {n: table.column(n).to_numpy() for n in names}

    def __getitem__(self, name: str) -> np.ndarray:
        if name not in fmt.SAMPLE_COLUMNS:
            raise KeyError(name)
        return self.read([name])[name]

    def __iter__(self) -> Iterator[str]:
        return iter(fmt.SAMPLE_COLUMNS)

    def __len__(self) -> int:
        return len(fmt.SAMPLE_COLUMNS)


class CachedSamplesReader:
    """A `fmt.SamplesReader` that keeps the columnar cache of one trace directory.

    `hits` and `builds` count what happened (the bench and the tests read them)."""

    def __init__(self, trace_dir: Path) -> None:
        self.cache_dir = Path(trace_dir) / CACHE_DIRNAME
        self.hits = 0
        self.builds = 0
        self.skipped = 0
        self.fast = 0  # segments read by `read_clean_samples` (the rest by the checked reader)

    def cache_path(self, samples_path: Path) -> Path:
        return self.cache_dir / (samples_path.name.removesuffix(".csv") + ".parquet")

    def __call__(self, samples_path: Path, channels: set[int] | None) -> fmt.SegmentSamples:
        if not samples_path.is_file():  # the reader names the missing file
            return fmt.read_samples(samples_path, channels)
        target = self.cache_path(samples_path)
        cached = self._load(target)
        if cached is not None and stat_matches(samples_path, cached[0], channels):
            self.hits += 1  # the CSV untouched since it was cached: not even read
            return cached[1]
        data, key = read_keyed(samples_path, channels)
        if key is not None and cached is not None and same_content(key, cached[0]):
            self.hits += 1  # the same bytes (a copied or touched file)
            self._rekey(target, key)
            return cached[1]
        read = read_clean_samples(data, channels)
        if read is None:  # anything unusual: the checked reader decides (and names it)
            read = fmt.read_samples(samples_path, channels)
        else:
            self.fast += 1
        del data
        cols = host_columns(read.columns)
        if key is None or not self._write(target, key, read, cols):
            self.skipped += 1
            return fmt.SegmentSamples(cols, read.dropped, read.out_of_range, read.ends)
        self.builds += 1
        return fmt.SegmentSamples(ParquetColumns(target, len(cols["seq"])), read.dropped,
                                  read.out_of_range, read.ends)

    def _load(self, target: Path) -> tuple[JSONObject, fmt.SegmentSamples] | None:
        """A cache file's key and what it holds (its columns left on disk); None when it is
        absent, damaged or of another version."""
        try:
            schema = pq.read_schema(target)
            doc = json.loads((schema.metadata or {})[KEY_FIELD])
            key = doc["key"]
            if not isinstance(key, dict) or key.get("version") != CACHE_VERSION:
                return None
            n_rows = pq.ParquetFile(target).metadata.num_rows
            odd = [(int(line), str(col), float(x)) for line, col, x in doc["out_of_range"]]
            ends = {int(ch): fmt.ChannelEnds.from_json(e) for ch, e in doc["ends"].items()}
            return key, fmt.SegmentSamples(ParquetColumns(target, n_rows), int(doc["dropped"]),
                                           odd, ends)
        except (OSError, KeyError, TypeError, ValueError, pa.ArrowException):
            return None  # absent, damaged or of another version: rebuilt from the CSV

    def _rekey(self, target: Path, key: JSONObject) -> None:
        """Store the file's new key after a hit by content, so that the next analysis trusts
        its stat fields instead of reading and hashing it again (a copied trace, or a key
        first taken while the segment was racy: typically a campaign's last segment,
        analysed right after the daemon stopped). Only a key that is no longer racy is worth
        storing; a cache that cannot be rewritten stays as it was (a hit by hash each time)."""
        ctime = key.get("ctime_ns")
        keyed_at = key.get("keyed_at_ns")
        if not (isinstance(ctime, int) and isinstance(keyed_at, int)
                and ctime < keyed_at - RACY_NS):
            return
        tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
        try:
            table = pq.read_table(target)
            doc = json.loads((table.schema.metadata or {})[KEY_FIELD])
            doc["key"] = key
            table = table.replace_schema_metadata({KEY_FIELD: json.dumps(doc).encode()})
            pq.write_table(table, tmp, compression="lz4", use_dictionary=["channel", "status"])
            os.replace(tmp, target)
        except (OSError, KeyError, ValueError, pa.ArrowException):
            with contextlib.suppress(OSError):
                tmp.unlink()

    def _write(self, target: Path, key: JSONObject, read: fmt.SegmentSamples,
               cols: dict[str, np.ndarray]) -> bool:
        doc = {"key": key, "dropped": read.dropped,
               "out_of_range": [list(o) for o in read.out_of_range],
               "ends": {str(ch): e.to_json() for ch, e in read.ends.items()}}
        table = pa.table({n: cols[n] for n in fmt.SAMPLE_COLUMNS})
        table = table.replace_schema_metadata({KEY_FIELD: json.dumps(doc).encode()})
        tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
        try:
            self.cache_dir.mkdir(exist_ok=True)
            # LZ4, dictionaries only for the few-valued columns: a third of the time of the
            # default (snappy, a dictionary tried on every column) to write, half to read,
            # at ~10 % more bytes (about a third of the CSV's).
            pq.write_table(table, tmp, compression="lz4", use_dictionary=["channel", "status"])
            os.replace(tmp, target)  # atomic: a reader sees the old file or the whole new one
        except OSError:
            with contextlib.suppress(OSError):
                tmp.unlink()
            return False
        return True
