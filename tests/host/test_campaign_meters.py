"""Several meters in one study, fast: `[[meter]]` tables, their hostile forms, the
dry-run plan, the step arguments, the stable settle over several daemons, the traces the
analysis is given, two emulated daemons started by the campaign, and a killed session's
daemons stopped by the next. The end-to-end campaign against the emulators' truth is
test_campaign_meters_e2e.py.
"""

from __future__ import annotations

import json
import urllib.request
from contextlib import ExitStack
from pathlib import Path

import pytest

from epi.core.errors import UserError
from host.campaign.execute import Campaign
from host.campaign.journal import JournalState
from host.campaign.meter import daemon_json, emulated_daemon, stop_stale_daemon, trace_nodes
from host.campaign.plan import build_plan, plan_text
from host.campaign.study import ThermalSpec, load_study
from host.campaign.thermal import settle

MAP = Path(__file__).resolve().parents[2] / "quantmaps" / "uniform_q8.json"
TWO = """
[[meter]]
url = "http://meter-a:8757"
trace = "ta"
nodes = ["pi1", "pi2"]

[[meter]]
url = "http://meter-b:8757"
trace = "tb"
nodes = ["pi3"]
"""


def _study(d: Path, meters: str = TWO, run: str = "") -> Path:
    (d / "base.gguf").write_bytes(b"GGUF")
    p = d / "s.toml"
    p.write_text(f'{meters}\n[study]\nrepeats = 2\n[run]\ntokens = 8\n{run}\n'
                 f'[[models]]\nname = "m"\npath = "base.gguf"\nmaps = [{json.dumps(str(MAP))}]\n')
    return p


def _refused(p: Path) -> str:
    with pytest.raises(UserError) as exc:
        load_study(p)
    text = str(exc.value)
    assert "\n" not in text and str(p) in text, text
    return text


def test_meter_tables_load_in_order_with_their_nodes(tmp_path: Path) -> None:
    s = load_study(_study(tmp_path))
    assert [m.url for m in s.meters] == ["http://meter-a:8757", "http://meter-b:8757"]
    assert [m.nodes for m in s.meters] == [("pi1", "pi2"), ("pi3",)]
    assert [m.trace for m in s.meters] == [tmp_path / "ta", tmp_path / "tb"]
    assert s.meter is s.meters[0]


def test_the_single_meter_table_still_loads(tmp_path: Path) -> None:
    s = load_study(_study(tmp_path, '[meter]\nurl = "http://m:8757"\ntrace = "t"\n'))
    assert len(s.meters) == 1 and s.meter.url == "http://m:8757" and s.meter.nodes == ()
    s = load_study(_study(tmp_path, "[meter]\nemulate = true\n"))
    assert s.meter.emulate and s.meter.trace is None


@pytest.mark.parametrize(("meters", "field", "words"), [
    (TWO.replace("meter-b:8757", "METER-A:8757/"), "meter[1].url", "also meter[0]"),
    (TWO.replace('"pi3"', '"pi2"'), "meter[1].nodes[0]", "also on meter[0]"),
    (TWO.replace('"pi1", "pi2"', '"pi1", "pi1"'), "meter[0].nodes[1]", "twice"),
    (TWO.replace('trace = "tb"', 'trace = "ta/"'), "meter[1].trace", "also meter[0]"),
    (TWO.replace('trace = "tb"\n', ""), "meter[1].trace", "missing"),
    (TWO.replace('nodes = ["pi3"]\n', ""), "meter[1].nodes", "missing"),
    (TWO.replace('url = "http://meter-b:8757"', "emulate = true"), "meter[1].trace",
     "only with url"),
    (TWO.replace("http://meter-b:8757", "meter-b:8757"), "meter[1].url", "not a daemon URL"),
    (TWO.replace('nodes = ["pi3"]', 'nodes = ["a b"]'), "meter[1].nodes[0]", ""),
    (TWO.replace('nodes = ["pi3"]', "nodes = [3]"), "meter[1].nodes[0]", "node name"),
    (TWO.replace('nodes = ["pi3"]', 'nodes = ["pi3"]\nrate_hz = 5'), "meter[1].rate_hz",
     "only for emulate"),
    ("meter = []\n", "meter", "one or more [[meter]]"),
    ('meter = ["http://a:1"]\n', "meter[0]", "expected a table"),
    ("[[meter]]\nemulate = true\nnodes = ['a', 'b', 'c', 'd', 'e']\n", "meter[0].nodes",
     "at most 4"),
])
def test_hostile_meter_lists_are_one_line_naming_file_and_field(
        tmp_path: Path, meters: str, field: str, words: str) -> None:
    text = _refused(_study(tmp_path, meters))
    assert f"'{field}'" in text and words in text, text


def test_a_run_node_on_no_meter_is_refused(tmp_path: Path) -> None:
    text = _refused(_study(tmp_path, run='node = "pi1"\nworkers = "pi2=h:1, pi9=h:2"'))
    assert "'run.workers[1]'" in text and "'pi9'" in text
    text = _refused(_study(tmp_path, run='node = "head"'))
    assert "'run.node'" in text
    load_study(_study(tmp_path, run='node = "pi1"\nworkers = "pi2=h:1,pi3=h:2"'))


def test_the_dry_run_plan_lists_every_meter_with_its_trace_and_nodes(tmp_path: Path) -> None:
    text = "\n".join(plan_text(build_plan(load_study(_study(tmp_path)))))
    assert "meters: 2 daemons" in text
    assert f"meter 1: http://meter-a:8757, trace {tmp_path / 'ta'}, nodes pi1, pi2" in text
    assert f"meter 2: http://meter-b:8757, trace {tmp_path / 'tb'}, nodes pi3" in text
    single = load_study(_study(tmp_path, "[meter]\nemulate = true\n"))
    one = "\n".join(plan_text(build_plan(single)))
    assert "meters:" not in one  # one meter: the plan as before


def test_every_run_is_given_every_meter_in_the_study_order(tmp_path: Path) -> None:
    c = Campaign(load_study(_study(tmp_path)))
    step = c.plan.run_steps[0]
    args, _ = c._args(step, JournalState())
    assert args["meters"] == ["http://meter-a:8757", "http://meter-b:8757"]  # type: ignore[typeddict-item]


def _trace(d: Path, nodes: list[str | None]) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    meta = {"format": "epi-trace", "channels": [{"channel": i, "node": n}
                                                for i, n in enumerate(nodes)]}
    (d / "seg-000001.meta.json").write_text(json.dumps(meta))
    return d


def test_the_analysis_reads_every_trace_and_each_node_on_its_own_meter(tmp_path: Path) -> None:
    c = Campaign(load_study(_study(tmp_path)))
    with pytest.raises(UserError, match=r"'meter\[0\]\.trace'.*not a directory"):
        c.trace_dir()
    _trace(tmp_path / "ta", ["pi1", "pi2", None])
    _trace(tmp_path / "tb", ["pi3"])
    assert trace_nodes(tmp_path / "ta") == {"pi1", "pi2"}
    assert c.trace_dir() == [tmp_path / "ta", tmp_path / "tb"]
    _trace(tmp_path / "tb", ["pi3", "pi2"])  # meter b's board meters pi2 as well
    with pytest.raises(UserError, match=r"'meter\[0\]\.nodes\[1\]'.*meter\[1\]'s trace"):
        c.trace_dir()
    _trace(tmp_path / "tb", ["pi4"])  # pi3 on no channel of its meter
    with pytest.raises(UserError, match=r"'meter\[1\]\.nodes\[0\]'.*'pi3' is on no channel"):
        c.trace_dir()


def _status(power_w: float, t_ns: int) -> dict[str, object]:
    return {"channels": [{"last": {"t_mono_ns": t_ns, "power_w": power_w}}]}


def test_the_stable_settle_waits_for_every_meter() -> None:
    """Meter a is steady from the start (alone: settled at 2 s, its first full 2 s window);
    meter b (its own clock, 10^12 ns ahead) swings 9/7 W every 0.5 s until 2.5 s: together
    settled only at 4.5 s, when b's own window (2.5–4.5 s, all 7 W) is full and steady."""
    now = [0.0]
    spec = ThermalSpec(rule="stable", tolerance=0.02, window_s=2.0, timeout_s=30.0, poll_s=0.5)

    def status(url: str) -> object:
        t_ns = int(now[0] * 1e9)
        if url.endswith("a"):
            return _status(5.0, t_ns)
        return _status(7.0 if now[0] >= 3.0 or int(now[0] * 2) % 2 else 9.0, t_ns + 10**12)

    def sleep(s: float) -> None:
        now[0] += s

    out = settle(spec, ["http://a", "http://b"], status=status, sleep=sleep,
                 clock=lambda: now[0])
    assert out["settled"] and out["waited_s"] == pytest.approx(4.5)
    assert out["mean_power_w"] == pytest.approx(12.0)  # both meters' idle power summed
    now[0] = 0.0
    out = settle(spec, ["http://a"], status=status, sleep=sleep, clock=lambda: now[0])
    assert out["settled"] and out["waited_s"] == pytest.approx(2.0)
    now[0] = 0.0

    def never(url: str) -> object:
        return status(url) if url.endswith("a") else _status(7.0 + now[0] % 1.0, int(now[0] * 1e9))

    out = settle(spec, ["http://a", "http://b"], status=never, sleep=sleep, clock=lambda: now[0])
    assert not out["settled"] and "meter 2 of 2 not stable" in out["reason"]


@pytest.mark.slow  # two daemon subprocesses: the serial pass (the `slow` marker's definition)
def test_two_emulated_daemons_have_their_own_port_trace_board_and_record(tmp_path: Path) -> None:
    """As a campaign starts them (`emulate = true` in two [[meter]] tables)."""
    with ExitStack() as stack:
        urls = [stack.enter_context(emulated_daemon(tmp_path, tmp_path / f"trace{k}", 20.0,
                                                    "machine", index=k, nodes=nodes))
                for k, nodes in enumerate((("n0", "n1"), ("n2",)))]
        assert len(set(urls)) == 2
        records = [json.loads(daemon_json(tmp_path, k).read_text()) for k in range(2)]
        assert records[0]["pgid"] != records[1]["pgid"]
        assert records[0]["marker"] != records[1]["marker"]
        assert daemon_json(tmp_path, 1).name == "daemon-2.json"
        for url, nodes in zip(urls, (["n0", "n1"], ["n2"]), strict=True):
            with urllib.request.urlopen(url + "/status", timeout=10) as r:
                assert [c["node"] for c in json.loads(r.read())["channels"]] == nodes
    assert trace_nodes(tmp_path / "trace0") == {"n0", "n1"}
    assert trace_nodes(tmp_path / "trace1") == {"n2"}
    assert not list(tmp_path.glob("daemon*.json"))  # both stopped, their records gone


def test_a_resumed_campaign_stops_every_daemon_a_killed_one_left(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each record (daemon.json, daemon-2.json, ...) names a process group and its marker;
    without an index every one is stopped, with one only that daemon's."""
    from host.campaign import procs

    for k in range(3):
        daemon_json(tmp_path, k).write_text(json.dumps({"pgid": 100 + k, "marker": f"m{k}"}))
    (tmp_path / "daemon-9.json").write_text("{torn")  # a damaged record is skipped
    stopped: list[tuple[int, str]] = []
    monkeypatch.setattr(procs, "stop_stale_group",
                        lambda pgid, marker: stopped.append((pgid, marker)) or True)
    assert stop_stale_daemon(tmp_path)
    assert sorted(stopped) == [(100, "m0"), (101, "m1"), (102, "m2")]
    stopped.clear()
    assert stop_stale_daemon(tmp_path, 1) and stopped == [(101, "m1")]
