"""The columnar cache of trace samples (host/analysis/trace_cache.py): built beside the CSV,
rebuilt when a segment changes, and the analysis's view identical with and without it."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from epi.core.errors import UserError
from host.analysis import trace_cache
from host.analysis.trace_cache import CACHE_DIRNAME, CachedSamplesReader
from host.analysis.traces import Trace, read_trace

NS = 1_000_000_000


@pytest.fixture
def trace_dir(tmp_path: Path, synth_tools) -> Path:
    """Two channels, two segments, a fault event, a missing reading and a CalErr status."""
    prof = {0: synth_tools.Steps(np.array([0, 14 * NS], np.int64), np.array([5.0, 9.0])),
            1: synth_tools.Steps(np.array([0], np.int64), np.array([7.0]))}
    return synth_tools.write_trace(
        tmp_path / "trace", prof, 10 * NS, 20 * NS,
        segments=[(10 * NS, 15 * NS), (16 * NS, 20 * NS)],
        events=[(12 * NS, 1, "bus_error", "no answer")],
        status=lambda ch, t: 0xC000 if ch == 0 and 17 * NS < t < 17 * NS + 200_000_000 else 0)


def _blank_power(root: Path, line: int) -> None:
    p = root / "seg-000001.samples.csv"
    lines = p.read_text().splitlines()
    f = lines[line].split(",")
    f[4] = ""
    lines[line] = ",".join(f)
    p.write_text("\n".join(lines) + "\n")


def _view(tr: Trace) -> dict[str, object]:
    """Everything the analysis reads from a trace."""
    boot = tr.boot_ids[0]
    out: dict[str, object] = {"coverage": tr.coverage_ns(boot),
                              "real": tr.real_coverage_ns(boot),
                              "saturated": tr.saturated(0, boot, 0, 10**18),
                              "notes": list(tr.notes)}
    for ch in tr.channels:
        s = tr.series(ch, boot)
        out[f"series{ch}"] = (s.t_mono_ns.tolist(), s.power_w.tolist(), s.energy_j.tolist(),
                              s.seg_start_idx.tolist(), s.invalid.start_ns.tolist(),
                              s.invalid.end_ns.tolist(), s.invalid.reason.tolist(),
                              s.counter_invalid.start_ns.tolist(), s.dead_reason)
    return out


def test_cache_is_built_then_used_and_changes_nothing(trace_dir: Path) -> None:
    _blank_power(trace_dir, 7)
    plain = read_trace(trace_dir, cache=False)
    assert not (trace_dir / CACHE_DIRNAME).exists()
    first = read_trace(trace_dir)  # builds the cache
    files = sorted(p.name for p in (trace_dir / CACHE_DIRNAME).iterdir())
    assert files == ["seg-000001.samples.parquet", "seg-000002.samples.parquet"]
    second = read_trace(trace_dir)  # reads it
    for tr in (first, second):
        assert _view(tr) == _view(plain)
        pd.testing.assert_frame_equal(tr.samples, plain.samples)
        pd.testing.assert_frame_equal(tr.invalid, plain.invalid)
    # The fixture's features reached the view (so the comparison above compares something).
    s0 = plain.series(0, plain.boot_ids[0])
    reasons = " ".join(s0.invalid.reason.tolist())
    assert "power_w missing" in reasons and "gap between trace segments 1 and 2" in reasons
    assert len(s0.counter_invalid) and "bus_error" in " ".join(
        plain.series(1, plain.boot_ids[0]).invalid.reason.tolist())


def _reader_counts(root: Path) -> tuple[int, int]:
    from epi.formats.trace import read_trace as read_raw
    reader = CachedSamplesReader(root)
    read_raw(root, samples_reader=reader)
    return reader.hits, reader.builds


def test_a_changed_segment_rebuilds_its_cache_file(trace_dir: Path) -> None:
    assert _reader_counts(trace_dir) == (0, 2)
    assert _reader_counts(trace_dir) == (2, 0)
    p = trace_dir / "seg-000002.samples.csv"
    p.write_text("\n".join(p.read_text().splitlines()[:-1]) + "\n")  # one row fewer
    assert _reader_counts(trace_dir) == (1, 1)
    # Same size and mtime, other bytes (a restored copy): caught by the hash.
    st = p.stat()
    lines = p.read_text().splitlines()
    f = lines[3].split(",")
    f[4] = f[4][:-1] + ("1" if f[4][-1] != "1" else "2")  # one digit of a power reading
    lines[3] = ",".join(f)
    p.write_text("\n".join(lines) + "\n")
    os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert p.stat().st_size == st.st_size
    assert _reader_counts(trace_dir) == (1, 1)
    tr = read_trace(trace_dir)
    assert _view(tr) == _view(read_trace(trace_dir, cache=False))


def _no_read(path: Path, channels: object) -> object:
    raise AssertionError(f"{path} was read")


def test_an_untouched_segment_is_not_read_again(trace_dir: Path, monkeypatch) -> None:
    """Stat fields equal to the key's (taken well after the file last changed): the cache is
    used without reading the CSV; the view is the one read from the CSV."""
    assert _reader_counts(trace_dir) == (0, 2)
    monkeypatch.setattr(trace_cache, "RACY_NS", -10 * NS)  # as if keyed 10 s after writing
    monkeypatch.setattr(trace_cache, "read_keyed", _no_read)
    assert _reader_counts(trace_dir) == (2, 0)
    monkeypatch.undo()
    assert _view(read_trace(trace_dir)) == _view(read_trace(trace_dir, cache=False))


def test_a_rewritten_segment_is_rebuilt_even_with_its_old_size_and_mtime(
        trace_dir: Path, monkeypatch) -> None:
    """A write sets the ctime, which the key holds: caught by the stat fields alone."""
    monkeypatch.setattr(trace_cache, "RACY_NS", -10 * NS)
    assert _reader_counts(trace_dir) == (0, 2)
    p = trace_dir / "seg-000001.samples.csv"
    st = p.stat()
    lines = p.read_text().splitlines()
    f = lines[3].split(",")
    f[4] = f[4][:-1] + ("1" if f[4][-1] != "1" else "2")
    lines[3] = ",".join(f)
    p.write_text("\n".join(lines) + "\n")
    os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert (p.stat().st_size, p.stat().st_mtime_ns) == (st.st_size, st.st_mtime_ns)
    assert _reader_counts(trace_dir) == (1, 1)
    assert _view(read_trace(trace_dir)) == _view(read_trace(trace_dir, cache=False))


def test_a_freshly_written_segment_is_hashed_not_trusted(trace_dir: Path, monkeypatch) -> None:
    """A key taken within RACY_NS of the file's last change is checked by reading the file:
    a same-size rewrite inside one timestamp tick would leave every stat field equal."""
    assert _reader_counts(trace_dir) == (0, 2)  # just written: racy
    read = []
    real = trace_cache.read_keyed

    def spy(path: Path, channels: set[int] | None) -> object:
        read.append(path.name)
        return real(path, channels)

    monkeypatch.setattr(trace_cache, "read_keyed", spy)
    assert _reader_counts(trace_dir) == (2, 0)
    assert sorted(read) == ["seg-000001.samples.csv", "seg-000002.samples.csv"]


def test_a_copied_trace_keeps_using_its_cache(trace_dir: Path, tmp_path: Path) -> None:
    """Another inode and ctime, the same bytes: the hash says so, nothing is rebuilt."""
    assert _reader_counts(trace_dir) == (0, 2)
    copy = shutil.copytree(trace_dir, tmp_path / "copy")
    assert _reader_counts(copy) == (2, 0)
    assert _view(read_trace(copy)) == _view(read_trace(trace_dir, cache=False))


def test_a_hit_by_content_stores_the_new_key_so_the_next_read_is_by_stat(
        trace_dir: Path, tmp_path: Path, monkeypatch) -> None:
    """A copied trace is hashed once (other inode and ctime, same bytes); the cache then holds
    the copy's key, so a later analysis trusts its stat fields and does not read the CSV."""
    monkeypatch.setattr(trace_cache, "RACY_NS", -10 * NS)  # as if keyed 10 s after writing
    assert _reader_counts(trace_dir) == (0, 2)
    copy = shutil.copytree(trace_dir, tmp_path / "copy")
    assert _reader_counts(copy) == (2, 0)  # read and hashed: a hit by content
    monkeypatch.setattr(trace_cache, "read_keyed", _no_read)
    assert _reader_counts(copy) == (2, 0)  # by stat alone: the CSV is not read
    monkeypatch.undo()
    assert _view(read_trace(copy)) == _view(read_trace(trace_dir, cache=False))


def test_a_damaged_cache_file_is_rebuilt(trace_dir: Path) -> None:
    read_trace(trace_dir)
    c = trace_dir / CACHE_DIRNAME / "seg-000001.samples.parquet"
    c.write_bytes(c.read_bytes()[:100])
    assert _reader_counts(trace_dir) == (1, 1)
    assert _view(read_trace(trace_dir)) == _view(read_trace(trace_dir, cache=False))


def test_an_unwritable_cache_is_skipped(trace_dir: Path) -> None:
    (trace_dir / CACHE_DIRNAME).write_text("not a directory")  # mkdir fails, as read-only
    reader = CachedSamplesReader(trace_dir)
    from epi.formats.trace import read_trace as read_raw
    read_raw(trace_dir, samples_reader=reader)
    assert (reader.hits, reader.builds, reader.skipped) == (0, 0, 2)
    assert _view(read_trace(trace_dir)) == _view(read_trace(trace_dir, cache=False))


def test_a_bad_segment_is_refused_with_or_without_the_cache(trace_dir: Path) -> None:
    read_trace(trace_dir)  # cached while good
    p = trace_dir / "seg-000001.samples.csv"
    lines = p.read_text().splitlines()
    f = lines[5].split(",")
    f[5] = "volts"
    lines[5] = ",".join(f)
    p.write_text("\n".join(lines) + "\n")
    for cache in (True, False):
        with pytest.raises(UserError, match=r"line 6: .*voltage_v is 'volts'"):
            read_trace(trace_dir, cache=cache)


def test_a_changed_channel_map_rechecks_the_samples(trace_dir: Path) -> None:
    read_trace(trace_dir)
    for n in (1, 2):
        meta = trace_dir / f"seg-00000{n}.meta.json"
        meta.write_text(meta.read_text().replace('"channel": 1,', '"channel": 3,'))
    with pytest.raises(UserError, match="channel 1 is not in the meta's channels"):
        read_trace(trace_dir)


def test_clean_segments_take_the_fast_path(trace_dir: Path) -> None:
    _blank_power(trace_dir, 7)  # an empty float field is still clean
    reader = CachedSamplesReader(trace_dir)
    from epi.formats.trace import read_trace as read_raw
    read_raw(trace_dir, samples_reader=reader)
    assert (reader.fast, reader.builds) == (2, 2)


ODD_FIELDS = ["", "+5", "-0", "5.", ".5", "1e3", "1E-3", "0x10", " 5", "5 ", "1_000", "nan",
              "inf", "-inf", "1e400", "-1", "70000", "256", "9223372036854775808", '"5"',
              "5\r", "\x00", "٣", "1e-400", "00.5", "1.5e", "--1", "+.5", "1.0"]


@pytest.mark.parametrize("column", range(11))
def test_odd_fields_read_the_same_with_and_without_the_cache(tmp_path: Path, synth_tools,
                                                             column: int) -> None:
    """Whatever a field holds, the fast path and the checked reader agree: the same view or
    the same one-line error (the cache never accepts what the reader refuses)."""
    prof = {0: synth_tools.Steps(np.array([0], np.int64), np.array([5.0])),
            1: synth_tools.Steps(np.array([0], np.int64), np.array([7.0]))}
    for k, odd in enumerate(ODD_FIELDS):
        root = synth_tools.write_trace(tmp_path / f"t{k}", prof, 10 * NS, 12 * NS)
        p = root / "seg-000001.samples.csv"
        lines = p.read_text().splitlines()
        f = lines[6].split(",")
        f[column] = odd
        lines[6] = ",".join(f)
        p.write_text("\n".join(lines) + "\n")
        outcomes = []
        for cache in (False, True):
            try:
                tr = read_trace(root, cache=cache)
                outcomes.append(repr(_view(tr)))  # repr: NaN equals NaN
                outcomes.append(tr.samples.to_csv())
            except UserError as exc:
                outcomes.append(str(exc))
        half = len(outcomes) // 2
        assert outcomes[:half] == outcomes[half:], (column, odd, outcomes[0][:200])
