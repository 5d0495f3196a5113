"""HTTP endpoints: /metrics (checked with prometheus_client's parser), /stream, /clock."""

from __future__ import annotations

import http.client
import json
import threading
import time
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from epi.core.errors import UserError
from meter.daemon.http_server import MeterServer, parse_listen


def _sample(ch: int, seq: int, power_w: float = 12.5) -> dict:
    t = time.monotonic_ns()
    return {
        "type": "sample", "seq": seq, "channel": ch, "t_mono_ns": t, "t_real_ns": time.time_ns(),
        "power_w": power_w, "voltage_v": 230.1, "current_a": 0.06, "power_factor": 0.93,
        "frequency_hz": 50.01, "energy_j": 3.25 * (seq + 1), "status": 0,
    }


def _get(server: MeterServer, path: str) -> tuple[int, str, str]:
    try:
        with urllib.request.urlopen(server.url + path, timeout=5) as resp:
            return resp.status, resp.headers["Content-Type"], resp.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.headers["Content-Type"], err.read().decode()


def _families(text: str) -> dict:
    return {f.name: f for f in text_string_to_metric_families(text)}


def test_metrics_parse_and_carry_readings_and_counters(offset_server: MeterServer) -> None:
    state = offset_server.state
    state.record_sample(_sample(0, 0))
    state.record_sample(_sample(0, 1, power_w=13.0))
    state.record_fault(1, "absent")
    state.record_sweep(late=True, skipped=2, jitter={"count": 2, "sum_ns": 3000,
                                                     "p50_ns": 1000, "p90_ns": 2000,
                                                     "p99_ns": 2000})
    status, ctype, text = _get(offset_server, "/metrics")
    assert status == 200 and ctype.startswith("text/plain; version=0.0.4")
    fams = _families(text)

    (power,) = fams["epi_meter_power_watts"].samples
    assert power.labels == {"channel": "0", "name": "node0", "node": ""}
    assert power.value == 13.0
    (energy,) = fams["epi_meter_energy_joules"].samples
    assert fams["epi_meter_energy_joules"].type == "counter"
    assert energy.name == "epi_meter_energy_joules_total" and energy.value == 6.5
    up = {s.labels["channel"]: s.value for s in fams["epi_meter_channel_up"].samples}
    assert up == {"0": 1.0, "1": 0.0}
    # every counted kind is exported from the start, at 0 until it occurs
    faults = {(s.labels["channel"], s.labels["kind"]): s.value
              for s in fams["epi_meter_faults"].samples}
    assert {k: v for k, v in faults.items() if v} == {("1", "absent"): 1.0}
    assert faults[("0", "absent")] == 0 and faults[("1", "reverse_energy")] == 0
    samples = {s.labels["channel"]: s.value for s in fams["epi_meter_samples"].samples}
    assert samples == {"0": 2.0, "1": 0.0}
    assert fams["epi_meter_late_sweeps"].samples[0].value == 1
    assert fams["epi_meter_skipped_sweeps"].samples[0].value == 2
    lateness = {s.name: s for s in fams["epi_meter_schedule_lateness_seconds"].samples}
    assert lateness["epi_meter_schedule_lateness_seconds_count"].value == 2
    info = fams["epi_meter_info"].samples[0].labels
    assert info["emulated"] == "true" and info["power_model"] == "scripted"
    mono = fams["epi_meter_clock_monotonic_seconds"].samples[0].value
    assert abs(mono - time.monotonic()) < 5


def test_failing_channel_has_no_gauge_not_a_zero(offset_server: MeterServer) -> None:
    state = offset_server.state
    state.record_sample(_sample(1, 0, power_w=20.0))
    state.record_fault(1, "bus_error")
    fams = _families(_get(offset_server, "/metrics")[2])
    assert fams["epi_meter_power_watts"].samples == []
    # the counter keeps its last value: energy measured so far is not lost
    assert fams["epi_meter_energy_joules"].samples[0].value == 3.25


def test_label_values_are_escaped(offset_server: MeterServer) -> None:
    offset_server.state.info["host"] = 'we"ird\\host\nx'
    fams = _families(_get(offset_server, "/metrics")[2])
    assert fams["epi_meter_info"].samples[0].labels["host"] == 'we"ird\\host\nx'


def _publisher(server: MeterServer, n: int, channels: int = 2) -> threading.Thread:
    def run() -> None:
        deadline = time.monotonic() + 5
        while server.hub.n_clients == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        for seq in range(n):
            for ch in range(channels):
                server.hub.publish(_sample(ch, seq))
            time.sleep(0.005)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def test_stream_ndjson_follows_samples_with_channel_filter(offset_server: MeterServer) -> None:
    pub = _publisher(offset_server, 20)
    host, port = offset_server.address
    conn = http.client.HTTPConnection(host, port, timeout=5)
    conn.request("GET", "/stream?channel=1&limit=5")
    resp = conn.getresponse()
    assert resp.headers["Content-Type"] == "application/x-ndjson"
    lines = [json.loads(line) for line in resp.read().decode().splitlines()]
    conn.close()
    pub.join()
    assert lines[0]["type"] == "hello" and lines[0]["host"] == "testhost"
    data = [m for m in lines if m["type"] == "sample"]
    assert len(data) == 5 and {m["channel"] for m in data} == {1}
    assert [m["seq"] for m in data] == sorted(m["seq"] for m in data)


def test_stream_sse(offset_server: MeterServer) -> None:
    pub = _publisher(offset_server, 5)
    req = urllib.request.Request(
        offset_server.url + "/stream?limit=3", headers={"Accept": "text/event-stream"}
    )
    with urllib.request.urlopen(req, timeout=5) as resp:
        assert resp.headers["Content-Type"] == "text/event-stream"
        text = resp.read().decode()
    pub.join()
    blocks = [b for b in text.split("\n\n") if b]
    kinds = [b.splitlines()[0] for b in blocks]
    assert kinds[0] == "event: hello" and kinds.count("event: sample") == 3
    payload = json.loads(blocks[1].splitlines()[1].removeprefix("data: "))
    assert payload["type"] == "sample" and payload["power_w"] == 12.5


def test_stream_sends_heartbeats_and_ends_when_the_daemon_stops(
    offset_server: MeterServer,
) -> None:
    host, port = offset_server.address
    conn = http.client.HTTPConnection(host, port, timeout=5)
    conn.request("GET", "/stream?heartbeat_s=0.05")
    resp = conn.getresponse()
    assert json.loads(resp.readline())["type"] == "hello"
    assert json.loads(resp.readline())["type"] == "heartbeat"
    offset_server.hub.close()
    rest = resp.read().decode().splitlines()  # returns: the server closed the stream
    assert all(json.loads(line)["type"] == "heartbeat" for line in rest)
    conn.close()


def test_slow_stream_client_loses_oldest_and_is_told(offset_server: MeterServer) -> None:
    sub = offset_server.hub.subscribe()
    for seq in range(offset_server.hub.queue_len + 10):
        offset_server.hub.publish(_sample(0, seq))
    got = sub.get(0.1)
    assert len(got) == offset_server.hub.queue_len and sub.dropped == 10
    assert json.loads(got[0].json)["seq"] == 10
    sub.close()


def test_clock_endpoint_and_status_and_errors(offset_server: MeterServer) -> None:
    status, ctype, body = _get(offset_server, "/clock")
    reply = json.loads(body)
    assert status == 200 and ctype == "application/json"
    assert reply["t_recv_mono_ns"] <= reply["t_send_mono_ns"]
    assert reply["boot_id"] == "boot-1"
    status, _, body = _get(offset_server, "/status")
    assert status == 200 and len(json.loads(body)["channels"]) == 2
    status, _, body = _get(offset_server, "/nope")
    assert status == 404 and "/metrics" in json.loads(body)["endpoints"]


@pytest.mark.parametrize(
    ("text", "message"),
    [("8757", "expected HOST:PORT"), ("h:x", "not a number"), ("h:70000", "outside")],
)
def test_parse_listen_errors(text: str, message: str) -> None:
    with pytest.raises(UserError, match=message):
        parse_listen(text)
    assert parse_listen("[::1]:0") == ("::1", 0)


def test_port_in_use_is_a_user_error(offset_server: MeterServer, meter_state) -> None:
    host, port = offset_server.address
    with pytest.raises(UserError, match=f"--listen 127.0.0.1:{port}: cannot listen"):
        MeterServer(host, port, state=meter_state, hub=offset_server.hub, clock=offset_server.clock)


def test_a_server_never_started_stops_at_once(meter_state) -> None:
    from meter.daemon.live_stream import LiveHub

    server = MeterServer("127.0.0.1", 0, state=meter_state, hub=LiveHub(),
                         clock=type("C", (), {"monotonic_ns": staticmethod(time.monotonic_ns),
                                              "realtime_ns": staticmethod(time.time_ns)})())
    t = time.monotonic()
    server.stop()  # used to wait for a serve_forever that never ran
    assert time.monotonic() - t < 1
