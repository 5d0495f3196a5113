"""A columnar cache of a trace's samples: one Parquet file per segment, beside the CSV.

A study's trace is tens of millions of rows; checking them in pure Python (the one reader,
`epi.formats.trace`) takes minutes, and holding them as Python objects takes many GB. The
cache keeps exactly what that reader returned for one samples.csv — the checked columns (as
numpy: an empty float field is NaN, an empty status 0, which is how the analysis reads them),
the crash-cut records it dropped, the readings it set to missing and each channel's ends —
so a later analysis reads only the columns it needs, at C speed.

The CSV segments stay the crash-safe source of truth. A cache file is keyed by the segment's
samples.csv size, mtime and BLAKE2b hash and by the channel set its meta declares; any change
rebuilds it (from the CSV, through the checked reader). A cache that cannot be written (a
read-only trace directory) is skipped, one that cannot be read is rebuilt; neither is an error.
Layout: ``TRACE_DIR/.epi-cache/seg-NNNNNN.samples.parquet`` (docs/formats.md §1).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from epi.formats import trace as fmt

CACHE_DIRNAME = ".epi-cache"
CACHE_VERSION = 1
KEY_FIELD = b"epi_trace_cache"
INT_COLUMNS = ("seq", "channel", "t_mono_ns", "t_real_ns", "status")


def file_key(path: Path, channels: set[int] | None) -> dict[str, object] | None:
    """size, mtime_ns and BLAKE2b of a file, with the channel set it was checked against;
    None when the file changed while it was hashed (a live segment: not cacheable now)."""
    before = path.stat()
    digest = hashlib.blake2b(digest_size=20)
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            digest.update(chunk)
    after = path.stat()
    if (before.st_size, before.st_mtime_ns) != (after.st_size, after.st_mtime_ns):
        return None
    return {"version": CACHE_VERSION, "size": after.st_size, "mtime_ns": after.st_mtime_ns,
            "blake2b": digest.hexdigest(),
            "channels": sorted(channels) if channels is not None else None}


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

    def cache_path(self, samples_path: Path) -> Path:
        return self.cache_dir / (samples_path.name.removesuffix(".csv") + ".parquet")

    def __call__(self, samples_path: Path, channels: set[int] | None) -> fmt.SegmentSamples:
        if not samples_path.is_file():  # the reader names the missing file
            return fmt.read_samples(samples_path, channels)
        key = file_key(samples_path, channels)
        target = self.cache_path(samples_path)
        if key is not None:
            hit = self._load(target, key)
            if hit is not None:
                self.hits += 1
                return hit
        read = fmt.read_samples(samples_path, channels)
        cols = host_columns(read.columns)
        if key is None or not self._write(target, key, read, cols):
            self.skipped += 1
            return fmt.SegmentSamples(cols, read.dropped, read.out_of_range, read.ends)
        self.builds += 1
        return fmt.SegmentSamples(ParquetColumns(target, len(cols["seq"])), read.dropped,
                                  read.out_of_range, read.ends)

    def _load(self, target: Path, key: dict[str, object]) -> fmt.SegmentSamples | None:
        try:
            schema = pq.read_schema(target)
            doc = json.loads((schema.metadata or {})[KEY_FIELD])
            if doc.get("key") != key:
                return None
            n_rows = pq.ParquetFile(target).metadata.num_rows
            odd = [(int(line), str(col), float(x)) for line, col, x in doc["out_of_range"]]
            ends = {int(ch): (int(a), int(b), int(c), int(d))
                    for ch, (a, b, c, d) in doc["ends"].items()}
            return fmt.SegmentSamples(ParquetColumns(target, n_rows), int(doc["dropped"]),
                                      odd, ends)
        except (OSError, KeyError, TypeError, ValueError, pa.ArrowException):
            return None  # absent, damaged or of another version: rebuilt from the CSV

    def _write(self, target: Path, key: dict[str, object], read: fmt.SegmentSamples,
               cols: dict[str, np.ndarray]) -> bool:
        doc = {"key": key, "dropped": read.dropped,
               "out_of_range": [list(o) for o in read.out_of_range],
               "ends": {str(ch): [int(v) for v in e] for ch, e in read.ends.items()}}
        table = pa.table({n: cols[n] for n in fmt.SAMPLE_COLUMNS})
        table = table.replace_schema_metadata({KEY_FIELD: json.dumps(doc).encode()})
        tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
        try:
            self.cache_dir.mkdir(exist_ok=True)
            pq.write_table(table, tmp, compression="snappy")
            os.replace(tmp, target)  # atomic: a reader sees the old file or the whole new one
        except OSError:
            with contextlib.suppress(OSError):
                tmp.unlink()
            return False
        return True
