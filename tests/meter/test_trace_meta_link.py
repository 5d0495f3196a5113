"""A segment whose meta.json is a symbolic link that resolves to nothing: a link
to itself, or a dangling one, is refused in one line naming the file — never skipped like a
segment whose daemon was killed before writing its meta."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from epi.core.errors import UserError
from epi.formats.trace import EVENT_COLUMNS, SAMPLE_COLUMNS, read_trace, segment_paths
from meter.daemon.trace import TraceWriter


def _trace_with_empty_second_segment(tmp_path: Path) -> Path:
    w = TraceWriter(tmp_path, {})
    w.write_samples([(0, 0, 1_000, 1_700_000_000_000_001_000, 10.5, 230.01, 0.05, 0.91, 50.0,
                      1.5, 0)])
    w.close()
    meta_p, samples_p, events_p = segment_paths(tmp_path, 2)
    samples_p.write_text(",".join(SAMPLE_COLUMNS) + "\n")
    events_p.write_text(",".join(EVENT_COLUMNS) + "\n")
    return meta_p


@pytest.mark.parametrize("target", ["self", "nowhere"])
def test_meta_link_that_resolves_to_nothing_is_refused(tmp_path: Path, target: str) -> None:
    meta_p = _trace_with_empty_second_segment(tmp_path)
    os.symlink(meta_p.name if target == "self" else "missing.json", meta_p)
    with pytest.raises(UserError) as err:
        read_trace(tmp_path)
    text = str(err.value)
    assert "\n" not in text and meta_p.name in text and "symbolic link" in text


def test_without_the_link_the_empty_segment_is_skipped(tmp_path: Path) -> None:
    """The contrast: no meta at all is a daemon killed early, skipped (and recorded)."""
    _trace_with_empty_second_segment(tmp_path)
    assert read_trace(tmp_path).skipped_segments == [2]
