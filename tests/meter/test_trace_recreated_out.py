"""`--out` deleted and re-created under a running daemon: the stopping writer used
to rewrite its meta.json by path, leaving a stray `seg-000001.meta.json` (no CSV files beside
it) in the new directory, and the trace reader then refused the whole trace after a restart.
A writer whose files are gone writes nothing by path any more."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from epi.formats.trace import read_trace
from meter.daemon.trace import TraceLostError, TraceWriter


def _row(seq: int) -> tuple[object, ...]:
    t = 1_000_000_000 + seq * 50_000_000
    return (seq, 0, t, 1_700_000_000_000_000_000 + t, 4.0, 230.0, 0.02, 0.8, 50.0, seq * 0.2,
            0)


def test_a_stopping_writer_leaves_nothing_in_a_recreated_out(tmp_path: Path) -> None:
    out = tmp_path / "trace"
    old = TraceWriter(out, {"channels": [{"channel": 0}]})
    old.write_samples([_row(0), _row(1)])
    shutil.rmtree(out)
    out.mkdir()  # the operator re-creates it while the daemon still runs
    with pytest.raises(TraceLostError):
        old.check_present()
    old.update_meta(stats={"samples_written": 2})  # the daemon's periodic statistics
    old.close(stats={"clean_stop": True})  # and its stop
    assert sorted(os.listdir(out)) == []


def test_a_restart_in_the_recreated_out_gives_a_readable_trace(tmp_path: Path) -> None:
    out = tmp_path / "trace"
    old = TraceWriter(out, {"channels": [{"channel": 0}]})
    old.write_samples([_row(0)])
    shutil.rmtree(out)
    out.mkdir()
    new = TraceWriter(out, {"channels": [{"channel": 0}]})  # restarted beside the old one
    new.write_samples([_row(5), _row(6)])
    old.update_meta(stats={"samples_written": 1})  # the old daemon stops after the new began
    old.close(stats={"clean_stop": True})
    assert any(p.name.endswith(".reserve") for p in out.iterdir())  # the new one's, kept
    new.close(stats={"clean_stop": True})
    trace = read_trace(out)
    assert [s.number for s in trace.segments] == [1]
    assert not any(p.name.endswith(".reserve") for p in out.iterdir())
