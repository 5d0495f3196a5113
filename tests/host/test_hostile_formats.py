"""Generated hostile inputs for every file reader epi owns.

Each test starts from a valid file, replaces one field (or one CSV cell) with a generated
value, and reads it back with the one reader of that format. The reader may refuse it (one-line
`UserError`) or accept it; when it accepts, every field it returns must lie inside the range
docs/formats.md states, checked here against an independent table, never the reader's own
constants. Anything else (another exception, an out-of-range value) fails the test.
"""

from __future__ import annotations

import copy
import json
import math
import re
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from epi.core.errors import UserError
from epi.formats.tokenlog import read_token_log
from epi.formats.trace import read_trace

FUZZ = settings(max_examples=40, deadline=None,
                suppress_health_check=[HealthCheck.too_slow])
CELL_FUZZ = settings(max_examples=15, deadline=None,
                     suppress_health_check=[HealthCheck.too_slow])
INT64_MAX = 2**63 - 1
# docs/formats.md: an id that becomes a file name.
SAFE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")

# A JSON value of any type, including the awkward ones.
HOSTILE_JSON = st.one_of(
    st.none(), st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from([0, -1, 0.0, -0.0, 1e308, -1e308, 1e-320, 2**63, 2**64, "", " ", "1",
                     "0.1", "-x", ".x", "../x", "a/b", "--help"]),
    st.text(max_size=12),
    st.lists(st.integers(min_value=-5, max_value=5), max_size=3),
    st.dictionaries(st.text(max_size=4), st.integers(), max_size=2),
)
# A CSV cell: numbers in every spelling, specials, and text (commas and quotes included).
HOSTILE_CELL = st.one_of(
    st.sampled_from(["", "nan", "NaN", "inf", "-inf", "1e308", "-1e308", "1e400", "-1", "0",
                     "9223372036854775808", "-9223372036854775809", "1.5", "0x10", "1e3",
                     " 7", "+3", "2", "70000", "1,2", '"', "x", "1.0000001", "-1.5", "-0.001",
                     "1000.5", "10001", "65536", "256", "1000001", "-1000001", "1e16"]),
    st.integers(min_value=-(2**66), max_value=2**66).map(str),
    st.floats().map(repr),
    st.text(alphabet=st.characters(blacklist_characters="\n\r", blacklist_categories=("Cs",)),
            max_size=10),
)


def _one_line(exc: UserError) -> None:
    text = str(exc)
    assert text and "\n" not in text, text


# ------------------------------------------------------------------------------- trace
def _meta() -> dict[str, Any]:
    return {"format": "epi-trace", "format_version": 1, "segment": 1, "boot_id": "b0",
            "started_mono_ns": 1_000, "started_real_ns": 2_000, "emulated": True,
            "sample_period_s": 0.1, "stats": {"clean_stop": True},
            "channels": [{"channel": 0, "name": "ch0", "node": "n0",
                          "meter_constant_imp_per_kwh": 3200.0, "ct": None},
                         {"channel": 1, "name": "ch1", "node": None,
                          "meter_constant_imp_per_kwh": 3200.0, "ct": None}]}


SAMPLE_HEADER = ("seq,channel,t_mono_ns,t_real_ns,power_w,voltage_v,current_a,power_factor,"
                 "frequency_hz,energy_j,status")
EVENT_HEADER = "t_mono_ns,t_real_ns,channel,kind,detail"


def _sample_rows() -> list[list[str]]:
    rows = []
    for seq in range(5):
        for ch in (0, 1):
            t = 1_000_000_000 + seq * 100_000_000 + ch * 1000
            rows.append([str(seq), str(ch), str(t), str(t + 10**18), "5.5", "230.1", "0.03",
                         "0.9", "50.0", repr(0.55 * seq), "0"])
    return rows


def _event_rows() -> list[list[str]]:
    return [["1000000000", "1000000000000000000", "", "start", "daemon start"],
            ["1200000000", "1000000000200000000", "1", "bus_error", "frame, with a comma"],
            ["1300000000", "", "0", "gap", "end_mono_ns=1400000000 end_real_ns=; restart"]]


def _write_trace(root: Path, meta: dict | bytes, samples: list[list[str]] | None = None,
                 events: list[list[str]] | None = None) -> Path:
    raw = meta if isinstance(meta, bytes) else json.dumps(meta).encode()
    (root / "seg-000001.meta.json").write_bytes(raw)
    s = [SAMPLE_HEADER, *(",".join(r) for r in (samples or _sample_rows()))]
    (root / "seg-000001.samples.csv").write_text("\n".join(s) + "\n")
    evs = events if events is not None else _event_rows()
    lines = [EVENT_HEADER]
    for r in evs:
        lines.append(",".join(f'"{c}"' if "," in c else c for c in r))
    (root / "seg-000001.events.csv").write_text("\n".join(lines) + "\n")
    return root


def _assert_trace_in_range(tr: Any) -> None:
    """Independent statement of docs/formats.md §1 ranges for what the reader returned."""
    for seg in tr.segments:
        p = seg.sample_period_s
        assert p is None or (math.isfinite(p) and 0 < p <= 3600)
        for ch, info in seg.channels.items():
            assert isinstance(ch, int) and 0 <= ch <= 255
            mc = info.meter_constant_imp_per_kwh
            assert mc is None or (math.isfinite(mc) and 0 < mc <= 1e9)
            assert info.node is None or isinstance(info.node, str)
        assert seg.boot_id is None or isinstance(seg.boot_id, str)
        c = seg.columns
        limits = {"power_w": (-1e6, 1e6), "voltage_v": (0, 1e4), "current_a": (0, 1e4),
                  "power_factor": (-1, 1), "frequency_hz": (0, 1e3), "energy_j": (-1e15, 1e15)}
        for name, (lo, hi) in limits.items():
            for v in c[name]:
                assert v is None or (isinstance(v, float) and math.isfinite(v) and lo <= v <= hi)
        for name in ("seq", "t_mono_ns", "t_real_ns"):
            assert all(type(v) is int and 0 <= v <= INT64_MAX for v in c[name])
        assert all(v is None or (type(v) is int and 0 <= v <= 0xFFFF) for v in c["status"])
        # A meta without channels (bare daemon tests) leaves channel numbers unchecked against
        # it; the analysis view refuses such a trace (tests/host/test_hostile_analysis.py).
        assert all(type(v) is int and 0 <= v <= 255 for v in c["channel"])
        if seg.channels:
            assert all(v in seg.channels for v in c["channel"])
        last: dict[int, int] = {}
        for ch, t in zip(c["channel"], c["t_mono_ns"], strict=True):
            assert t > last.get(ch, -1)
            last[ch] = t
        for ev in seg.events:
            for t in (ev.t_mono_ns, ev.t_real_ns):
                assert t is None or (type(t) is int and 0 <= t <= INT64_MAX)
            assert ev.channel is None or not seg.channels or ev.channel in seg.channels


def _read_trace_or_refuse(root: Path) -> Any:
    try:
        tr = read_trace(root)
    except UserError as exc:
        _one_line(exc)
        return None
    _assert_trace_in_range(tr)
    return tr


META_KEYS = ["format", "format_version", "segment", "boot_id", "started_mono_ns",
             "started_real_ns", "sample_period_s", "emulated", "stats", "stats.clean_stop",
             "channels", "channels.0", "channels.0.channel", "channels.0.node",
             "channels.0.name", "channels.0.meter_constant_imp_per_kwh", "channels.1.ct"]


def _set(doc: Any, dotted: str, value: Any) -> Any:
    doc = copy.deepcopy(doc)
    *path, last = dotted.split(".")
    target = doc
    for key in path:
        target = target[int(key)] if isinstance(target, list) else target[key]
    if isinstance(target, list):
        target[int(last)] = value
    else:
        target[last] = value
    return doc


@pytest.mark.parametrize("key", META_KEYS)
@CELL_FUZZ
@given(value=HOSTILE_JSON)
def test_trace_meta_fields(key: str, value: Any) -> None:
    with tempfile.TemporaryDirectory() as d:
        _read_trace_or_refuse(_write_trace(Path(d), _set(_meta(), key, value)))


@pytest.mark.parametrize("col", range(11))
@CELL_FUZZ
@given(row=st.integers(0, 8), cell=HOSTILE_CELL)
def test_trace_sample_cells(col: int, row: int, cell: str) -> None:
    """A damaged cell in any row but the last (which a crash may cut) is refused or in range."""
    rows = _sample_rows()
    rows[row][col] = cell
    with tempfile.TemporaryDirectory() as d:
        tr = _read_trace_or_refuse(_write_trace(Path(d), _meta(), samples=rows))
        if tr is not None:
            assert tr.dropped_lines == 0  # only the final record may be dropped
            # a reading set to missing because it was out of range is said, never silent
            if tr.segments[0].out_of_range:
                assert any("outside their valid range" in n for n in tr.notes)


@pytest.mark.parametrize("col", range(5))
@CELL_FUZZ
@given(row=st.integers(0, 1), cell=HOSTILE_CELL)
def test_trace_event_cells(col: int, row: int, cell: str) -> None:
    rows = _event_rows()
    rows[row][col] = cell
    with tempfile.TemporaryDirectory() as d:
        _read_trace_or_refuse(_write_trace(Path(d), _meta(), events=rows))


@FUZZ
@given(raw=st.one_of(st.binary(max_size=64),
                     st.sampled_from([b"[" * 100_000, b"{\"a\":" * 5000, b"\xff\xfe{}",
                                      b'{"format": NaN}', b"Infinity", b"null", b"[]"])))
def test_trace_meta_bytes(raw: bytes) -> None:
    with tempfile.TemporaryDirectory() as d:
        _read_trace_or_refuse(_write_trace(Path(d), raw))


# ------------------------------------------------------------------------------- token log
def _header() -> dict[str, Any]:
    return {"format": "epi-tokenlog", "format_version": 1, "run_id": "r1",
            "status": "completed", "error": None, "boot_id": "h0",
            "model": {"path": "/m/q4.gguf", "sha256": "a" * 64, "map_id": "q4_k_m",
                      "n_layers": 8, "n_params": 1000},
            "settings": {"threads": 2},
            "placement": [{"node": "n0", "endpoint": None, "layers": [0, 1, 2]}],
            "clock_sync": [{"t_local_mono_ns": 10, "offset_ns": -5, "uncertainty_ns": 100,
                            "rtt_ns": 400, "meter_url": "http://m", "when": "start"}],
            "clock_drift_ppm": 1.5}


EV_HEADER = "request_id,repeat,warmup,prompt_id,event,token_index,token_id,t_mono_ns,t_real_ns"
RQ_HEADER = ("request_id,repeat,warmup,prompt_id,n_prompt_tokens,n_generated_tokens,"
             "t_start_mono_ns,t_first_token_mono_ns,t_end_mono_ns,node")


def _log_rows() -> tuple[list[list[str]], list[list[str]]]:
    ev = [["", "0", "0", "", "idle_start", "", "", "100", "1100"],
          ["", "0", "0", "", "idle_end", "", "", "200", "1200"]]
    rq = []
    t = 300
    for rid in range(2):
        ev.append([str(rid), "0", "0", "p1", "request_start", "", "", str(t), str(t + 1000)])
        toks = [t + 50, t + 60, t + 70]
        for i, tt in enumerate(toks):
            ev.append([str(rid), "0", "0", "p1", "token", str(i), str(100 + i), str(tt),
                       str(tt + 1000)])
        ev.append([str(rid), "0", "0", "p1", "request_end", "", "", str(t + 71),
                   str(t + 1071)])
        rq.append([str(rid), "0", "0", "p1", "20", "3", str(t), str(toks[0]), str(toks[-1]),
                   "n0"])
        t += 100
    return ev, rq


def _write_log(root: Path, header: dict | bytes, ev: list[list[str]] | None = None,
               rq: list[list[str]] | None = None) -> Path:
    e0, r0 = _log_rows()
    raw = header if isinstance(header, bytes) else json.dumps(header).encode()
    (root / "run.json").write_bytes(raw)

    def line(r: list[str]) -> str:
        return ",".join('"' + c.replace('"', '""') + '"' if ("," in c or '"' in c) else c
                        for c in r)

    (root / "events.csv").write_text(
        "\n".join([EV_HEADER, *map(line, ev if ev is not None else e0)]) + "\n")
    (root / "requests.csv").write_text(
        "\n".join([RQ_HEADER, *map(line, rq if rq is not None else r0)]) + "\n")
    return root


def _assert_log_in_range(log: Any) -> None:
    """Independent statement of docs/formats.md §2 ranges for what the reader returned."""
    h = log.header
    model = h["model"]
    assert model.get("map_id") is None or SAFE_ID.match(model["map_id"])
    assert h["status"] in ("running", "completed", "failed")
    for e in h.get("clock_sync", []):
        assert type(e["uncertainty_ns"]) is int and e["uncertainty_ns"] >= 0
        assert type(e["t_local_mono_ns"]) is int and e["t_local_mono_ns"] >= 0
        assert type(e["offset_ns"]) is int
    drift = h.get("clock_drift_ppm")
    assert drift is None or (math.isfinite(drift) and abs(drift) <= 1e6)
    for p in h["placement"]:
        assert isinstance(p["node"], str) and p["node"].strip()
        assert all(type(x) is int and 0 <= x <= 100_000 for x in p["layers"])
    rq = log.requests
    assert all(1 <= n <= 10**7 for n in rq["n_prompt_tokens"])
    assert all(0 <= n <= 10**7 for n in rq["n_generated_tokens"])
    assert all(w in (0, 1) for w in rq["warmup"])
    for col in ("t_start_mono_ns", "t_first_token_mono_ns", "t_end_mono_ns"):
        assert all(v is None or 0 <= v <= INT64_MAX for v in rq[col])
    ev = log.events
    assert all(0 <= t <= INT64_MAX for t in ev["t_mono_ns"])
    assert all(k in ("idle_start", "idle_end", "request_start", "token", "request_end")
               for k in ev["event"])
    # Every request of events.csv has its requests.csv row in a completed run.
    if h["status"] == "completed":
        assert {r for r in ev["request_id"] if r is not None} <= set(rq["request_id"])


def _read_log_or_refuse(root: Path) -> Any:
    try:
        log = read_token_log(root)
    except UserError as exc:
        _one_line(exc)
        return None
    _assert_log_in_range(log)
    return log


HEADER_KEYS = ["format_version", "run_id", "status", "error", "boot_id", "model", "model.map_id",
               "model.sha256", "model.path", "model.n_layers", "settings", "placement",
               "placement.0", "placement.0.node", "placement.0.layers", "placement.0.endpoint",
               "clock_sync", "clock_sync.0", "clock_sync.0.t_local_mono_ns",
               "clock_sync.0.offset_ns", "clock_sync.0.uncertainty_ns", "clock_sync.0.rtt_ns",
               "clock_sync.0.when", "clock_drift_ppm"]


@pytest.mark.parametrize("key", HEADER_KEYS)
@CELL_FUZZ
@given(value=HOSTILE_JSON)
def test_run_json_fields(key: str, value: Any) -> None:
    with tempfile.TemporaryDirectory() as d:
        _read_log_or_refuse(_write_log(Path(d), _set(_header(), key, value)))


@pytest.mark.parametrize("col", range(9))
@CELL_FUZZ
@given(row=st.integers(0, 11), cell=HOSTILE_CELL)
def test_events_csv_cells(col: int, row: int, cell: str) -> None:
    ev, _rq = _log_rows()
    ev[row][col] = cell
    with tempfile.TemporaryDirectory() as d:
        _read_log_or_refuse(_write_log(Path(d), _header(), ev=ev))


@pytest.mark.parametrize("col", range(10))
@CELL_FUZZ
@given(row=st.integers(0, 1), cell=HOSTILE_CELL)
def test_requests_csv_cells(col: int, row: int, cell: str) -> None:
    _ev, rq = _log_rows()
    rq[row][col] = cell
    with tempfile.TemporaryDirectory() as d:
        _read_log_or_refuse(_write_log(Path(d), _header(), rq=rq))


@FUZZ
@given(drop=st.integers(0, 1), status=st.sampled_from(["completed", "failed", "running"]))
def test_requests_csv_missing_a_row(drop: int, status: str) -> None:
    _ev, rq = _log_rows()
    del rq[drop]
    header = {**_header(), "status": status, "error": "x" if status == "failed" else None}
    with tempfile.TemporaryDirectory() as d:
        log = _read_log_or_refuse(_write_log(Path(d), header, rq=rq))
        if status == "completed":
            assert log is None
        else:
            assert log is not None and any("no row for request(s)" in n for n in log.notes)


@FUZZ
@given(raw=st.one_of(st.binary(max_size=64),
                     st.sampled_from([b"[" * 100_000, b"\xc3\x28", b'{"format": Infinity}'])))
def test_run_json_bytes(raw: bytes) -> None:
    with tempfile.TemporaryDirectory() as d:
        _read_log_or_refuse(_write_log(Path(d), raw))


def test_valid_fixtures_are_accepted() -> None:
    """The starting points are valid: a refusal in the tests above is due to the mutation."""
    with tempfile.TemporaryDirectory() as d:
        assert _read_trace_or_refuse(_write_trace(Path(d), _meta())) is not None
    with tempfile.TemporaryDirectory() as d:
        log = _read_log_or_refuse(_write_log(Path(d), _header()))
        assert log is not None and log.idle == [(100, 200)]
