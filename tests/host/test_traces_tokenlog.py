"""Reading token-log run directories (docs/formats.md §2), including the real writer's output."""

from __future__ import annotations

import json

import numpy as np
import pytest

from epi.core.errors import UserError
from host.analysis.tokenlog_reader import read_run
from host.run import tokenlog

NS = 1_000_000_000


@pytest.fixture
def run_dir(tmp_path, synth_tools):
    return synth_tools.write_run(tmp_path / "run", synth_tools.make_schedule(100 * NS), offset_ns=5)


def test_reads_a_valid_run(run_dir):
    r = read_run(run_dir)
    assert r.status == "completed" and r.status_problem is None
    assert r.config_id == "q4_k_m"
    assert len(r.requests) == 8 and r.requests["warmup"].sum() == 2
    assert len(r.idle) == 1 and r.placement[0].layers == tuple(range(8))
    assert [e["when"] for e in r.clock_sync] == ["start", "end"]


def test_real_writer_output_reads_back(tmp_path):
    """host/run/tokenlog.py (the runner's writer) and this reader agree on the contract.

    A plain import: a first-party module that fails to import is a failure, not a skip."""
    hdr = tokenlog.RunHeader.create(tmp_path / "real", {
        "model": {"path": "m.gguf", "sha256": "c" * 64, "map_id": "demo_q8_0", "n_layers": 8,
                  "n_params": 1},
        "llama_cpp": {"version": "x", "build_flags": "", "rpc": False},
        "settings": {}, "placement": [{"node": "local", "endpoint": None,
                                       "layers": list(range(8))}],
        "host": "h", "boot_id": "b"})
    hdr.add_clock_sync({"t_local_mono_ns": 10, "offset_ns": 3, "uncertainty_ns": 1,
                        "rtt_ns": 2, "meter_url": "u"}, "start")
    app = tokenlog.CsvAppender(tmp_path / "real")
    app.write_idle(0, (100, 1100), (200, 1200))
    for rid in range(2):
        t = 1000 + rid * 1000
        app.write_request(tokenlog.RequestRecord(
            request_id=rid, repeat=rid - 1, warmup=rid == 0, prompt_id=f"p{rid}",
            n_prompt_tokens=5, t_start_mono_ns=t, t_start_real_ns=t + 7, token_ids=[1, 2, 3],
            token_mono_ns=[t + 100, t + 200, t + 300], token_real_ns=[0, 0, 0],
            t_end_mono_ns=t + 301, t_end_real_ns=0, node="local"))
    app.close()
    hdr.finish("completed")
    r = read_run(tmp_path / "real")
    assert r.status == "completed" and r.config_id == "demo_q8_0"
    rq = r.requests.set_index("request_id")
    assert rq.loc[1, "t_first_token_mono_ns"] == 2100
    assert rq.loc[1, "n_generated_tokens"] == 3
    assert list(r.idle.iloc[0]) == [100, 200]
    assert r.clock_sync[0]["offset_ns"] == 3


def test_truncated_final_lines_are_dropped(run_dir):
    p = run_dir / "events.csv"
    p.write_bytes(p.read_bytes() + b"9,2,0,p1,tok")  # a killed run's half-written event
    r = read_run(run_dir)
    assert any("truncated" in n for n in r.notes)


@pytest.mark.parametrize("status,text", [("running", "still 'running'"),
                                         ("failed", "run failed: boom")])
def test_unfinished_status_is_explicit(tmp_path, synth_tools, status, text):
    d = synth_tools.write_run(tmp_path / "r", synth_tools.make_schedule(NS), status=status,
                        error="boom" if status == "failed" else None)
    assert text in read_run(d).status_problem


def _edit_json(path, **changes):
    data = json.loads(path.read_text())
    data.update(changes)
    path.write_text(json.dumps(data))


@pytest.mark.parametrize("changes,match", [
    ({"format": "epi-trace"}, "field format is 'epi-trace'"),
    ({"format_version": 3}, "format_version 3 is newer"),
    ({"status": "done"}, "field status: expected one of .* got 'done'"),
    ({"placement": []}, "placement is empty"),
    ({"clock_sync": [{"t_local_mono_ns": 1.5, "offset_ns": 0}]},
     r"clock_sync\[0\].t_local_mono_ns: expected an integer"),
])
def test_bad_headers_fail_with_one_line(run_dir, changes, match):
    _edit_json(run_dir / "run.json", **changes)
    with pytest.raises(UserError, match=match):
        read_run(run_dir)


def test_requests_must_agree_with_events(run_dir):
    p = run_dir / "requests.csv"
    lines = p.read_text().splitlines()
    f = lines[3].split(",")
    f[7] = str(int(f[7]) + 1)  # t_first_token_mono_ns off by 1 ns
    lines[3] = ",".join(f)
    p.write_text("\n".join(lines) + "\n")
    with pytest.raises(UserError, match=r"line 4: t_first_token_mono_ns .* disagrees with its "
                       r"token 0 event"):
        read_run(run_dir)


def test_events_out_of_order_fail(run_dir):
    p = run_dir / "events.csv"
    lines = p.read_text().splitlines()
    lines[5], lines[6] = lines[6], lines[5]
    p.write_text("\n".join(lines) + "\n")
    with pytest.raises(UserError, match="goes backwards"):
        read_run(run_dir)


def test_missing_files(tmp_path, run_dir):
    with pytest.raises(UserError, match="run directory not found"):
        read_run(tmp_path / "nope")
    (run_dir / "requests.csv").unlink()
    with pytest.raises(UserError, match=r"requests\.csv: file missing"):
        read_run(run_dir)


def test_span_helpers(run_dir):
    r = read_run(run_dir)
    lo, hi = r.span_local_ns()
    assert lo == r.events["t_mono_ns"].min() and hi > lo
    assert np.all(np.diff(r.events["t_mono_ns"].to_numpy()) >= 0)


def test_request_without_tokens_is_left_out_with_a_note(run_dir):
    p = run_dir / "requests.csv"
    lines = p.read_text().splitlines()
    f = lines[-1].split(",")
    f[5], f[7], f[8] = "0", "", ""  # nothing generated: no token times
    lines[-1] = ",".join(f)
    p.write_text("\n".join(lines) + "\n")
    e = run_dir / "events.csv"  # ... and no token events for that request
    ev = [ln for ln in e.read_text().splitlines()
          if not (ln.startswith(f"{f[0]},") and ",token," in ln)]
    e.write_text("\n".join(ev) + "\n")
    r = read_run(run_dir)
    assert len(r.requests) == 7 and any("generated no tokens" in n for n in r.notes)
