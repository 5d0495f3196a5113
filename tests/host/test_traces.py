"""Reading meter trace directories (docs/formats.md §1) for analysis."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from epi.core.errors import UserError
from host.analysis.align import window_energy
from host.analysis.traces import read_trace

NS = 1_000_000_000


@pytest.fixture
def flat(tmp_path, synth_tools):
    """Factory: a 2-channel trace (5 W and 7 W constant), 10 Hz, 10–20 s."""

    def make(**kw) -> Path:
        prof = {0: synth_tools.Steps(np.array([0], np.int64), np.array([5.0])),
                1: synth_tools.Steps(np.array([0], np.int64), np.array([7.0]))}
        return synth_tools.write_trace(tmp_path / "trace", prof, 10 * NS, 20 * NS, **kw)

    return make


def test_reads_joined_segments_and_marks_the_gap(flat):
    tr = read_trace(flat(segments=[(10 * NS, 15 * NS), (16 * NS, 20 * NS)]))
    assert [s.number for s in tr.segments] == [1, 2]
    assert tr.emulated and tr.channels[1].node == "n1"
    assert tr.channels[0].counter_resolution_j == pytest.approx(0.036)
    s = tr.series(0, "meter-boot-0000")
    assert len(s.t_mono_ns) == 90 and list(s.seg_start_idx) == [0, 50]
    r = window_energy(s, np.array([11 * NS, 14 * NS, 17 * NS]),
                      np.array([12 * NS, 17 * NS, 18 * NS]))
    assert r.energy_j[0] == pytest.approx(5.0) and r.energy_counter_j[0] == pytest.approx(5.0)
    assert np.isnan(r.energy_j[1]) and "gap between trace segments 1 and 2" in r.reason[1]
    assert r.energy_j[2] == pytest.approx(5.0)


def test_truncated_final_line_is_dropped(flat):
    root = flat()
    p = root / "seg-000001.samples.csv"
    full = len(read_trace(root).samples)
    whole = p.read_bytes()
    p.write_bytes(whole[:-7])  # cut inside the last record
    tr = read_trace(root)
    assert len(tr.samples) == full - 1
    assert any("truncated" in n for n in tr.notes)
    p.write_bytes(whole + b"\x00" * 40 + b"\n")  # power cut: a NUL-filled block
    assert len(read_trace(root).samples) == full


@pytest.mark.parametrize("what", ["duplicated", "unsorted"])
def test_unsorted_or_duplicated_timestamps_fail(flat, what):
    root = flat()
    p = root / "seg-000001.samples.csv"
    lines = p.read_text().splitlines()
    f5, f7 = lines[5].split(","), lines[7].split(",")  # both channel 0 (rows alternate)
    assert f5[1] == f7[1] == "0"
    f7[2] = f5[2] if what == "duplicated" else str(int(f5[2]) - 1)
    lines[7] = ",".join(f7)
    p.write_text("\n".join(lines) + "\n")
    with pytest.raises(UserError, match=f"line 8: .*channel 0 t_mono_ns is {what}"):
        read_trace(root)


def test_overlapping_segments_fail(flat):
    root = flat(segments=[(10 * NS, 15 * NS), (14 * NS, 20 * NS)])
    with pytest.raises(UserError, match="not after segment 1"):
        read_trace(root)


def test_unknown_version_and_format_fail(flat):
    root = flat()
    meta = root / "seg-000001.meta.json"
    m = json.loads(meta.read_text())
    meta.write_text(json.dumps({**m, "format_version": 2}))
    with pytest.raises(UserError, match=r"seg-000001.meta.json: field format_version 2 is newer"):
        read_trace(root)
    meta.write_text(json.dumps({**m, "format": "something-else"}))
    with pytest.raises(UserError, match="field format is 'something-else'"):
        read_trace(root)


def test_channel_map_mismatch_between_segments_fails(flat):
    root = flat(segments=[(10 * NS, 15 * NS), (16 * NS, 20 * NS)])
    meta = root / "seg-000002.meta.json"
    m = json.loads(meta.read_text())
    m["channels"][1]["node"] = "other"
    meta.write_text(json.dumps(m))
    with pytest.raises(UserError, match=r"channels differ from seg-000001\.meta\.json"):
        read_trace(root)


def test_bad_values_fail_with_line_and_column(flat):
    root = flat()
    p = root / "seg-000001.samples.csv"
    lines = p.read_text().splitlines()
    f = lines[3].split(",")
    f[4] = "lots"
    lines[3] = ",".join(f)
    p.write_text("\n".join(lines) + "\n")
    with pytest.raises(UserError, match=r"line 4: .*column power_w is .lots., expected a number"):
        read_trace(root)


def test_fault_events_and_status_make_invalid_intervals(flat):
    events = [
        (12 * NS + 50_000_000, 0, "bus_error", "no answer"),
        (13 * NS + 10_000_000, None, "chip_reset", "FuncEn back at default"),
        # the sampler writes a gap at its start with its end in the detail
        (14 * NS + 5_000_000, 1, "gap", "end_mono_ns=14505000000 end_real_ns=; recovered"),
        (15 * NS, None, "late", "1 sweep late"),  # informational: no interval
    ]
    root = flat(events=events,
                 status=lambda ch, t: 0xC000 if ch == 1 and 17 * NS < t < 17 * NS + 90_000_000
                 else 0)
    tr = read_trace(root)
    s0 = tr.series(0, "meter-boot-0000")
    s1 = tr.series(1, "meter-boot-0000")
    win0 = np.array([12 * NS, 13 * NS, 14 * NS, 15 * NS - 100, 17 * NS])
    win1 = win0 + NS // 2
    r0, r1 = window_energy(s0, win0, win1), window_energy(s1, win0, win1)
    assert "bus_error event (no answer)" in r0.reason[0] and np.isnan(r0.energy_j[0])
    assert r1.energy_j[0] == pytest.approx(3.5)  # channel 1 unaffected
    assert "chip_reset" in r0.reason[1] and "chip_reset" in r1.reason[1]  # whole board
    assert "gap event" in r1.reason[2] and r0.energy_j[2] == pytest.approx(2.5)
    assert r0.energy_j[3] == pytest.approx(2.5) and r1.energy_j[3] == pytest.approx(3.5)
    # CalErr freezes the energy registers: the counter is refused, power is fine
    assert r1.energy_j[4] == pytest.approx(3.5) and np.isnan(r1.energy_counter_j[4])
    assert "CalErr" in r1.counter_reason[4]


def test_missing_power_reading_invalidates_its_span(flat):
    root = flat()
    p = root / "seg-000001.samples.csv"
    lines = p.read_text().splitlines()
    f = lines[41].split(",")
    f[4] = ""
    lines[41] = ",".join(f)
    p.write_text("\n".join(lines) + "\n")
    tr = read_trace(root)
    t_missing = int(f[2])
    s = tr.series(int(f[1]), "meter-boot-0000")
    r = window_energy(s, np.array([t_missing - NS // 2]), np.array([t_missing + NS // 2]))
    assert np.isnan(r.energy_j[0]) and "power_w missing" in r.reason[0]


def test_long_sample_gap_is_invalid(flat):
    root = flat(drop=lambda ch, t: 13 * NS < t < 14 * NS)
    s = read_trace(root).series(0, "meter-boot-0000")
    r = window_energy(s, np.array([13 * NS + NS // 2, 11 * NS]), np.array([14 * NS, 12 * NS]))
    assert "sample gap longer than 3 scheduled periods" in r.reason[0]
    assert r.energy_j[1] == pytest.approx(5.0)


def test_not_a_trace_directory(tmp_path):
    with pytest.raises(UserError, match="not a trace directory"):
        read_trace(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError, match=r"no trace segments \(seg-NNNNNN\.meta\.json\)"):
        read_trace(tmp_path / "empty")


def test_truncated_metadata_or_missing_header_fail(flat):
    root = flat()
    meta = root / "seg-000001.meta.json"
    whole = meta.read_text()
    meta.write_text(whole[: len(whole) // 2])
    with pytest.raises(UserError, match="not valid JSON"):
        read_trace(root)
    meta.write_text(whole)
    p = root / "seg-000001.samples.csv"
    p.write_text("\n".join(p.read_text().splitlines()[1:]) + "\n")  # header line lost
    with pytest.raises(UserError, match="is not the epi-trace v1 header"):
        read_trace(root)
    p.write_text("")
    with pytest.raises(UserError, match="empty file"):
        read_trace(root)


def test_faults_found_without_a_boot_id(flat):
    root = flat(boot_id=None, events=[(12 * NS + 50_000_000, 0, "bus_error", "x")])
    tr = read_trace(root)
    assert tr.boot_ids == [None]
    r = window_energy(tr.series(0, None), np.array([12 * NS]), np.array([13 * NS]))
    assert np.isnan(r.energy_j[0]) and "bus_error" in r.reason[0]
