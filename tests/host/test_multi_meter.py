"""Several meters in one study: two emulated daemons in separate processes, each on
its own simulated clock with its own offset and drift, nodes spread across both.

Meter A (two channels: nodes n0, n1) starts its clock at 5 s and runs 300 ppm fast; meter B
(one channel: node n2) starts at 900 s and runs 800 ppm slow, against the inference host's
clock. Each daemon's ScriptedProfile steps at the schedule's physical times as its own clock
reads them, so the truth of any window is that profile's `energy_j` between the window's ends in
that daemon's clock. The token log records both meters' offsets (format 2, keyed by meter URL)
at the start and end; `analyze(run, [trace A, trace B])` must recover every window's energy on
every node within 1 % (as the one-daemon test, tests/host/test_align_groundtruth.py), and the
J/token over all nodes within 1 %.
"""

from __future__ import annotations

import multiprocessing
import re
from pathlib import Path

import numpy as np
import pytest

from host.analysis import multi_trace
from host.analysis.pipeline import Options, analyze
from meter.emulation.power_models import ScriptedProfile

NS = 1_000_000_000
LOCAL0 = 70 * NS  # the inference host's clock at schedule second 0
METERS = {  # url: (clock at schedule second 0, drift ppm vs the host, nodes)
    "http://127.0.0.1:18801": (5 * NS, 300.0, ("n0", "n1")),
    "http://127.0.0.1:18802": (900 * NS, -800.0, ("n2",)),
}
N_GEN = 16


def _schedule() -> tuple[tuple[float, float], list[dict]]:
    rng = np.random.default_rng(3)
    t = 5.4
    reqs = []
    for rep in (-1, 0, 1, 2):
        for p in range(2):
            pf, dc = 0.5 + rng.uniform(0, 0.2), 1.0 + rng.uniform(0, 0.5)
            reqs.append({"repeat": rep, "prompt": p, "start": t, "first": t + pf,
                         "end": t + pf + dc})
            t += pf + dc + 0.4
    return (2.0, 5.0), reqs


def _meter_ns(url: str, t_s: float) -> int:
    t0, drift, _ = METERS[url]
    return t0 + round(t_s * (1 + drift * 1e-6) * NS)


WATTS = {"n0": (3.0, 8.0, 6.0), "n1": (2.5, 4.0, 5.5), "n2": (1.5, 7.0, 3.5)}


def _profile(url: str, node: str, reqs: list[dict]) -> ScriptedProfile:

    idle_w, pre_w, dec_w = WATTS[node]
    drift = METERS[url][1] * 1e-6
    steps = [(0.0, idle_w)]
    for r in reqs:  # schedule seconds → seconds of this daemon's clock since its start
        steps += [(r["start"] * (1 + drift), pre_w), (r["first"] * (1 + drift), dec_w),
                  (r["end"] * (1 + drift), idle_w)]
    return ScriptedProfile(steps, start_mono_ns=METERS[url][0], power_factor=0.6)


def _daemon(root: str, url: str, duration_s: float) -> None:
    """One emulated daemon on its own simulated clock (runs in a child process)."""
    from meter.clock import SimulatedClock
    from meter.daemon.service import DaemonOptions, MeterDaemon

    _, reqs = _schedule()
    nodes = METERS[url][2]
    board = Path(root) / "board.toml"
    lines = ['format = "epi-board"', "format_version = 1", 'name = "multi"',
             "[sampling]", "period_s = 0.1"]
    for i, node in enumerate(nodes):
        lines += ["[[channel]]", f'name = "c{i}"', f'node = "{node}"', f'chip_select = "CE{i}"',
                  "meter_constant_imp_per_kwh = 100000000"]
    board.write_text("\n".join(lines) + "\n")
    opts = DaemonOptions(out_dir=Path(root) / "trace", board_path=board, emulate=True,
                         duration_s=duration_s, listen=None,
                         clock=SimulatedClock(METERS[url][0]),
                         power_model=[_profile(url, n, reqs) for n in nodes])
    MeterDaemon(opts, log=lambda line: None).run()


def _local(t_s: float) -> int:
    return LOCAL0 + round(t_s * NS)


def _token_log(root: Path, idle: tuple[float, float], reqs: list[dict], end_s: float) -> Path:
    from host.run import tokenlog

    run = root / "run"
    hdr = tokenlog.RunHeader.create(run, {
        "model": {"path": "mm.gguf", "sha256": "d" * 64, "map_id": "mm", "n_layers": 9,
                  "n_params": 1},
        "llama_cpp": {"version": "test", "build_flags": "", "rpc": True}, "settings": {},
        "placement": [{"node": "n0", "endpoint": None, "layers": [0, 1, 2]},
                      {"node": "n1", "endpoint": "127.0.0.1:50052", "layers": [3, 4, 5]},
                      {"node": "n2", "endpoint": "127.0.0.1:50053", "layers": [6, 7, 8]}],
        "host": "inference", "boot_id": "inference-boot"})
    for when, ts in (("start", 1.0), ("end", end_s)):
        for url in METERS:
            hdr.add_clock_sync({"t_local_mono_ns": _local(ts),
                                "offset_ns": _meter_ns(url, ts) - _local(ts),
                                "uncertainty_ns": 50_000, "rtt_ns": 100_000, "meter_url": url},
                               when)
    app = tokenlog.CsvAppender(run)
    app.write_idle(0, (_local(idle[0]), 0), (_local(idle[1]), 0))
    for i, r in enumerate(reqs):
        toks = np.linspace(_local(r["first"]), _local(r["end"]), N_GEN).astype(np.int64).tolist()
        app.write_request(tokenlog.RequestRecord(
            request_id=i, repeat=r["repeat"], warmup=r["repeat"] < 0, prompt_id=f"p{r['prompt']}",
            n_prompt_tokens=20, t_start_mono_ns=_local(r["start"]), t_start_real_ns=0,
            token_ids=list(range(N_GEN)), token_mono_ns=toks, token_real_ns=[0] * N_GEN,
            t_end_mono_ns=toks[-1], t_end_real_ns=0, node="n0"))
    app.close()
    hdr.finish("completed")
    return run


Study = tuple[Path, list[Path], list[dict]]  # run dir, traces (meter order), schedule
SPANS = {"prefill": ("start", "first"), "decode": ("first", "end"), "request": ("start", "end")}


def _truth(node: str, reqs: list[dict], kind: str) -> np.ndarray:
    url = next(u for u, m in METERS.items() if node in m[2])
    prof = _profile(url, node, reqs)
    a, b = SPANS[kind]
    return np.array([prof.energy_j(_meter_ns(url, r[a]), _meter_ns(url, r[b]))
                     for r in reqs if r["repeat"] >= 0])


@pytest.fixture(scope="module")
def study(tmp_path_factory: pytest.TempPathFactory) -> Study:
    root = tmp_path_factory.mktemp("multi")
    idle, reqs = _schedule()
    end_s = reqs[-1]["end"] + 2.0
    ctx = multiprocessing.get_context("spawn")
    procs, traces = [], []
    for i, url in enumerate(METERS):
        d = root / f"meter{i}"
        d.mkdir()
        procs.append(ctx.Process(target=_daemon, args=(str(d), url, end_s + 1.0)))
        traces.append(d / "trace")
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    return _token_log(root, idle, reqs, end_s), traces, reqs


def test_two_daemons_with_their_own_offsets_and_drifts_give_the_truth(study: Study) -> None:
    run, traces, reqs = study
    a = analyze([run], traces, Options(cv_threshold=1.0))
    assert a.runs[0].clock.drift_ppm == pytest.approx(300.0, abs=0.5)  # meter A's own
    assert a.verdicts["valid"].all(), a.verdicts["reasons"].tolist()
    assert sorted(a.runs[0].node_channels.items()) == [("n0", [0]), ("n1", [1]), ("n2", [2])]
    # every joined channel remembers the trace it came from (its labels and instrument terms)
    assert a.trace.origins is not None
    assert {ch: (Path(t.path).resolve(), c) for ch, (t, c) in a.trace.origins.items()} == {
        0: (Path(traces[0]).resolve(), 0), 1: (Path(traces[0]).resolve(), 1),
        2: (Path(traces[1]).resolve(), 0)}
    # meter B placed in meter A's clock: its rate relative to A's, from its own offsets
    note = next(n for n in a.notes if "placed in" in n)
    found = re.search(r"drift ([-+][\d.]+) ppm", note)
    assert found, note
    drift = float(found.group(1))
    assert drift == pytest.approx(((1 + 300e-6) / (1 - 800e-6) - 1) * 1e6, abs=0.05)
    w = a.windows
    worst = {}
    for kind in SPANS:
        total = np.zeros(sum(r["repeat"] >= 0 for r in reqs))
        for node in ("n0", "n1", "n2"):
            got = w[(w["kind"] == kind) & (w["scope"] == node)]
            assert (got["energy_method"] == "counter").all()
            truth = _truth(node, reqs, kind)
            total += truth
            worst[(kind, node)] = float(np.max(np.abs(got["energy_j"].to_numpy() / truth - 1)))
        both = w[(w["kind"] == kind) & (w["scope"] == "all")]["energy_j"].to_numpy()
        worst[(kind, "all")] = float(np.max(np.abs(both / total - 1)))
    assert max(worst.values()) < 0.01, worst
    # J/token of the decode over all nodes, per repeat, against the emulators' truth (a decode
    # holds n_generated − 1 tokens: token 0 ends the prefill)
    rep = a.repeats
    rep = rep[(rep["scope"] == "all") & (rep["phase"] == "decode") & (rep["unit"] == "generated")
              & (rep["basis"] == "gross")].sort_values("repeat")
    dec = np.sum([_truth(n, reqs, "decode") for n in ("n0", "n1", "n2")], axis=0)
    measured = [r for r in reqs if r["repeat"] >= 0]
    want = [sum(e for e, r in zip(dec, measured, strict=True) if r["repeat"] == k)
            / ((N_GEN - 1) * sum(r["repeat"] == k for r in measured)) for k in (0, 1, 2)]
    assert rep["j_per_token"].to_numpy() == pytest.approx(want, rel=0.01)


def test_meter_b_read_in_meter_a_clock_without_its_own_mapping_fails(study: Study,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Break the per-daemon mapping (meter B's trace taken as if in meter A's clock): n2's
    windows miss the truth by far more than 1 %."""
    run, traces, reqs = study
    real = multi_trace._map_points

    def no_mapping(*args: object) -> tuple[np.ndarray, np.ndarray, float]:
        t, d, u = real(*args)  # type: ignore[arg-type]  # passes the real call's arguments on
        return t, np.zeros_like(d), u

    monkeypatch.setattr(multi_trace, "_map_points", no_mapping)
    a = analyze([run], traces, Options(cv_threshold=1.0))
    got = a.windows[(a.windows["kind"] == "decode") & (a.windows["scope"] == "n2")]
    err = got["energy_j"].to_numpy() / _truth("n2", reqs, "decode") - 1
    assert np.all(np.isnan(err) | (np.abs(err) > 0.05))


def test_traces_the_runs_did_not_sync_with_are_refused(study: Study) -> None:
    """A third trace with no matching meter in the run: one line naming it."""
    from epi.core.errors import UserError

    run, traces, _ = study
    with pytest.raises(UserError, match=r"no run synced clocks with meter 3"):
        analyze([run], [*traces, traces[1]], Options(cv_threshold=1.0))


def test_epi_analyze_takes_repeated_traces_or_a_list_file(
        study: Study, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """`--trace A --trace B` and `--trace LIST` (one directory a line) give the same results;
    a bad list is one line and exit 2, never a traceback."""
    import json

    from tests.cli_run import run_epi

    run, traces, _ = study
    figures = []
    listing = tmp_path / "traces.txt"
    listing.write_text("# one trace per meter daemon, in --meter order\n"
                       + "".join(f"{t}\n" for t in traces))
    for i, trace_args in enumerate((["--trace", str(traces[0]), "--trace", str(traces[1])],
                                    ["--trace", str(listing)])):
        out = tmp_path / f"an{i}"
        code, _, err = run_epi(monkeypatch, capsys, "analyze", str(run), *trace_args,
                               "--cv-threshold", "1", "--out", str(out))
        assert code == 0, err
        res = json.loads((out / "results.json").read_text())
        figures.append(json.dumps(res["results"], sort_keys=True))
    assert figures[0] == figures[1]
    listing.write_text("# nothing\n\n")
    code, _, err = run_epi(monkeypatch, capsys, "analyze", str(run), "--trace", str(listing),
                           "--out", str(tmp_path / "bad"))
    assert code != 0 and "the list of traces is empty" in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1
