"""Regression tests for classes of silently wrong results and for inputs the analysis used to
accept, each through the readers the analysis uses (epi.formats + the pandas views)."""

from __future__ import annotations

import json
import math
import re
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from epi.core.errors import UserError
from host.analysis.align import INVALID_DATA, window_energy
from host.analysis.layer_groups import _manifest
from host.analysis.statistics import Accuracy, epi
from host.analysis.tokenlog_reader import read_run
from host.analysis.traces import read_trace

NS = 1_000_000_000
BOOT = "meter-boot-0000"


@pytest.fixture
def flat(tmp_path, synth_tools):
    """Factory: a 2-channel trace (5 W and 7 W constant), 10 Hz, 10–20 s."""

    def make(**kw) -> Path:
        prof = {0: synth_tools.Steps(np.array([0], np.int64), np.array([5.0])),
                1: synth_tools.Steps(np.array([0], np.int64), np.array([7.0]))}
        return synth_tools.write_trace(tmp_path / "trace", prof, 10 * NS, 20 * NS, **kw)

    return make


def _edit_meta(root: Path, **changes) -> Path:
    p = root / "seg-000001.meta.json"
    meta = json.loads(p.read_text())
    meta.update(changes)
    p.write_text(json.dumps(meta))
    return p


def _edit_samples(root: Path, edit) -> None:
    """Apply edit(fields) to every channel-0 row (fields as strings; return None to keep)."""
    p = root / "seg-000001.samples.csv"
    lines = p.read_text().splitlines()
    for i in range(1, len(lines)):
        f = lines[i].split(",")
        if f[1] == "0":
            new = edit(i, f)
            if new is not None:
                lines[i] = ",".join(new)
    p.write_text("\n".join(lines) + "\n")


# --------------------------------------------------------------- silent wrong results
def test_counter_that_steps_back_is_not_taken_at_face_value(flat):
    """A counter glitching 100 J backwards once: a window starting at the glitch would read
    105 J instead of 5 J. The counter is invalid from the step to the segment's end."""
    root = flat()
    hit = {}

    def glitch(i, f):
        if i == 61:  # one channel-0 row around 13 s
            hit["t"] = int(f[2])
            f[9] = repr(float(f[9]) - 100.0)
            return f
        return None

    _edit_samples(root, glitch)
    s = read_trace(root).series(0, BOOT)
    t = hit["t"]
    r = window_energy(s, np.array([t, t + 2 * NS]), np.array([t + NS, t + 3 * NS]))
    assert r.energy_j[0] == pytest.approx(5.0, rel=0.05)  # power is fine
    for k in (0, 1):  # neither window gets 105 J (or any counter figure) from the counter
        assert np.isnan(r.energy_counter_j[k])
        assert "energy_j decreased or reset" in r.counter_reason[k]


def test_counter_reset_to_zero_inside_a_segment(flat):
    root = flat()
    _edit_samples(root, lambda i, f: [*f[:9], repr(max(0.0, float(f[9]) - 15.0)), f[10]]
                  if float(f[2]) > 15.5 * NS else None)
    s = read_trace(root).series(0, BOOT)
    r = window_energy(s, np.array([14 * NS]), np.array([17 * NS]))
    assert np.isnan(r.energy_counter_j[0]) and "reset" in r.counter_reason[0]


@pytest.mark.parametrize("value", ["0.1", None, 0, -0.1, float("inf")])
def test_bad_sample_period_is_refused(flat, value):
    root = flat()
    p = _edit_meta(root, sample_period_s=value)
    if isinstance(value, float) and math.isinf(value):
        p.write_text(p.read_text().replace("Infinity", "1e999"))
    with pytest.raises(UserError, match=r"meta\.json: field sample_period_s: expected a finite"):
        read_trace(root)


@pytest.mark.parametrize("value", ["3200", None, 0, -5])
def test_bad_meter_constant_is_refused(flat, value):
    root = flat()
    meta = json.loads((root / "seg-000001.meta.json").read_text())
    meta["channels"][0]["meter_constant_imp_per_kwh"] = value
    (root / "seg-000001.meta.json").write_text(json.dumps(meta))
    with pytest.raises(UserError, match=r"channels\[0\]\.meter_constant_imp_per_kwh"):
        read_trace(root)


def test_missing_meter_constant_is_refused_by_the_analysis(flat):
    root = flat()
    meta = json.loads((root / "seg-000001.meta.json").read_text())
    del meta["channels"][0]["meter_constant_imp_per_kwh"]
    (root / "seg-000001.meta.json").write_text(json.dumps(meta))
    with pytest.raises(UserError, match="meter_constant_imp_per_kwh is missing"):
        read_trace(root)


def test_missing_sample_period_is_inferred_and_the_gap_rule_holds(flat):
    """Without sample_period_s the period is inferred from the samples (and a note says so),
    so the gap rule still applies. Channel 1 keeps one sweep in five (0.5 s apart): the
    period is the fastest channel's 0.1 s, not 0.5 s, so a 1 s hole in channel 0 (over 3
    periods of 0.1 s, under 3 of 0.5 s) is a gap, as is the 2 s hole in both."""
    def slow_ch1(ch: int, t: int) -> bool:
        return ch == 1 and round((t - 10 * NS) / (NS // 10)) % 5 != 0

    root = flat(drop=lambda ch, t: 13 * NS < t < 15 * NS or (16 * NS < t < 17 * NS and ch == 0)
                or slow_ch1(ch, t))
    meta_p = root / "seg-000001.meta.json"
    meta = json.loads(meta_p.read_text())
    del meta["sample_period_s"]
    meta_p.write_text(json.dumps(meta))
    tr = read_trace(root)
    assert any(re.search(r"no sample_period_s; inferred 0\.(1|09)\d* s", n) for n in tr.notes)
    r = window_energy(tr.series(0, BOOT), np.array([13 * NS, 16 * NS]),
                      np.array([15 * NS, 17 * NS]))
    assert np.isnan(r.energy_j).all()
    assert all("sample gap longer than 3" in x for x in r.reason)
    assert np.median(np.diff(tr.series(1, BOOT).t_mono_ns)) == pytest.approx(0.5 * NS, rel=0.05)


def test_segment_without_events_csv_is_refused(flat):
    root = flat()
    (root / "seg-000001.events.csv").unlink()
    with pytest.raises(UserError, match=r"events\.csv: missing"):
        read_trace(root)


def test_absurd_reading_is_flagged_missing_not_taken(flat):
    """A finite reading outside its valid range (a chip glitch, e.g. 1e308 W) is set to
    missing with a note naming the line: the time around it is invalid, never 1e308 W."""
    root = flat()
    hit = {}

    def glitch(i, f):
        if i == 21:
            hit["t"] = int(f[2])
            return [*f[:4], "1e308", *f[5:]]
        return None

    _edit_samples(root, glitch)
    tr = read_trace(root)
    assert any("1 reading(s) outside their valid range set to missing (first: line 22, "
               "power_w 1e+308)" in n for n in tr.notes)
    t = hit["t"]
    r = window_energy(tr.series(0, BOOT), np.array([t - NS // 2]), np.array([t + NS // 2]))
    assert np.isnan(r.energy_j[0]) and "outside its valid range" in r.reason[0]


@pytest.mark.parametrize("text", ["nan", "inf", "1e400", "abc"])
def test_non_numbers_in_a_trace_are_refused(flat, text):
    root = flat()
    _edit_samples(root, lambda i, f: [*f[:4], text, *f[5:]] if i == 21 else None)
    with pytest.raises(UserError, match=r"line 22: .*power_w"):
        read_trace(root)


# --------------------------------------------------------------- inputs once accepted
def test_negative_power_is_flagged_with_the_fix(flat):
    root = flat()
    _edit_samples(root, lambda i, f: [*f[:4], "-5.0", *f[5:]])  # reversed CT on channel 0
    tr = read_trace(root)
    r = window_energy(tr.series(0, BOOT), np.array([12 * NS]), np.array([13 * NS]))
    assert np.isnan(r.energy_j[0]) and "negative power_w (CT reversed?" in r.reason[0]
    r1 = window_energy(tr.series(1, BOOT), np.array([12 * NS]), np.array([13 * NS]))
    assert r1.energy_j[0] == pytest.approx(7.0, rel=0.05)


def test_channel_without_valid_readings_is_a_dead_channel(flat):
    root = flat()
    _edit_samples(root, lambda i, f: [*f[:4], "", *f[5:]])  # every power_w empty
    r = window_energy(read_trace(root).series(0, BOOT), np.array([12 * NS]),
                      np.array([13 * NS]))
    assert "dead channel" in r.reason[0] and "outside the trace" not in r.reason[0]
    assert r.code[0] == INVALID_DATA  # invalid data, not OUTSIDE


def test_corrupt_quantization_manifest_is_reported_with_its_path(tmp_path):
    (tmp_path / "q4.manifest.json").write_text("{not json")
    info = SimpleNamespace(run=SimpleNamespace(model={"map_id": "q4",
                                                      "path": str(tmp_path / "q4.gguf")}))
    corrupt: list[str] = []
    assert _manifest(info, SimpleNamespace(manifest_dir=None), corrupt) is None
    assert corrupt and "corrupt" in corrupt[0] and str(tmp_path / "q4.manifest.json") in corrupt[0]


# --------------------------------------------------------------- token logs
def test_absurd_token_counts_and_negative_uncertainty_are_refused(tmp_path, synth_tools):
    d = synth_tools.write_run(tmp_path / "r", synth_tools.make_schedule(NS))
    p = d / "requests.csv"
    lines = p.read_text().splitlines()
    f = lines[1].split(",")
    f[4] = "1000000000000000000"
    p.write_text("\n".join([lines[0], ",".join(f), *lines[2:]]) + "\n")
    with pytest.raises(UserError, match=r"line 2: column n_prompt_tokens is 10+, expected"):
        read_run(d)
    d2 = synth_tools.write_run(tmp_path / "r2", synth_tools.make_schedule(NS),
                               sync_uncertainty_ns=-5)
    with pytest.raises(UserError, match=r"clock_sync\[0\]\.uncertainty_ns: expected an integer"):
        read_run(d2)


@pytest.mark.parametrize("map_id", ["../../etc/x", "-rf", ".hidden", "a/b", ""])
def test_file_name_ids_from_run_json_are_refused(tmp_path, synth_tools, map_id):
    d = synth_tools.write_run(tmp_path / "r", synth_tools.make_schedule(NS), map_id=map_id)
    with pytest.raises(UserError, match=r"field model\.map_id: expected an id"):
        read_run(d)


def test_completed_run_missing_a_requests_row_is_refused(tmp_path, synth_tools):
    d = synth_tools.write_run(tmp_path / "r", synth_tools.make_schedule(NS))
    p = d / "requests.csv"
    lines = p.read_text().splitlines()
    p.write_text("\n".join(lines[:2] + lines[3:]) + "\n")  # drop request 1's row
    with pytest.raises(UserError, match=r"no row for request\(s\) 1 of events\.csv"):
        read_run(d)


# --------------------------------------------------------------- EPI and data
def test_epi_upper_bound_is_unbounded_when_the_accuracy_interval_reaches_0():
    e, lo, hi, why = epi(2.0, 1.8, 2.2, Accuracy(0.5, 0.0, 0.9, "2 items"))
    assert e == pytest.approx(4.0) and lo == pytest.approx(1.8 / 0.9)
    assert math.isinf(hi) and why == ""  # was 2.2 / 0.5 = 4.4: an understated interval


def test_data_show_reports_a_deleted_data_file(monkeypatch, capsys, tmp_path):
    from epi import cli as cli_mod
    root = tmp_path / "data"
    (root / "hellaswag").mkdir(parents=True)
    f = root / "hellaswag" / "a.jsonl"
    f.write_text("{}\n")
    import hashlib

    sha = hashlib.sha256(b"{}\n").hexdigest()  # the file's own: `data show` checks it
    entry = {"files": [{"path": "hellaswag/a.jsonl", "sha256": sha, "bytes": 3}],
             "n_items": 1, "split": "validation", "license": "MIT",
             "source": {"kind": "user-file", "path": "x"}}
    (root / "manifest.json").write_text(json.dumps(
        {"format": "epi-evaldata", "format_version": 1, "benchmarks": {"hellaswag": entry},
         "texts": {}}))
    monkeypatch.setattr(sys, "argv", ["epi", "data", "show", "--dir", str(root)])
    cli_mod.main()  # success returns
    assert "1 items" in capsys.readouterr().out
    f.unlink()
    with pytest.raises(SystemExit) as info:
        cli_mod.main()
    out, err = capsys.readouterr()
    assert info.value.code == 2 and "1 items" not in out and "MISSING" in out
    assert "missing or changed" in err and err.count("\n") == 1


@pytest.mark.parametrize("what", ["no requests", "no tokens"])
def test_token_log_with_nothing_to_measure_is_one_line(synth_run, what):
    """Zero requests, or requests that generated no token: a one-line error, not a KeyError."""
    from host.analysis.model import Options
    from host.analysis.pipeline import analyze

    tdir, rdir, _, _ = synth_run()
    ev = (rdir / "events.csv").read_text().splitlines()
    rq = (rdir / "requests.csv").read_text().splitlines()
    if what == "no requests":
        ev = [ln for ln in ev if ",idle_" in ln or ln.startswith("request_id")]
        rq = rq[:1]
    else:
        ev = [ln for ln in ev if ",token," not in ln]
        rq = [rq[0]] + [",".join([*f[:5], "0", f[6], "", "", f[9]])
                        for f in (ln.split(",") for ln in rq[1:])]
    (rdir / "events.csv").write_text("\n".join(ev) + "\n")
    (rdir / "requests.csv").write_text("\n".join(rq) + "\n")
    with pytest.raises(UserError, match="nothing to measure") as info:
        analyze([rdir], tdir, Options())
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(("kind", "counted"), [("misread", True), ("implausible", False)])
def test_a_recovered_misread_keeps_its_window_an_implausible_reading_does_not(flat, kind,
                                                                              counted):
    """A `misread` (a word rejected and re-read consistently: the row written is valid) is
    informational; an `implausible` reading (no row, energy possibly missing) is a fault that
    invalidates the time around it (docs/formats.md §1)."""
    root = flat()
    with (root / "seg-000001.events.csv").open("a") as f:
        f.write(f"{int(12.5 * NS)},{int(12.5 * NS) + 1},0,{kind},measurement read rejected\n")
    r = window_energy(read_trace(root).series(0, BOOT), np.array([12 * NS]),
                      np.array([13 * NS]))
    if counted:
        assert r.energy_j[0] == pytest.approx(5.0, rel=0.05)  # 5 W for 1 s
    else:
        assert np.isnan(r.energy_j[0])
