"""Bridge vs direct SPI, end to end: the same scripted power through both paths to J/token.

Direct: the real daemon reads emulated chips over (emulated) SPI. Bridged: the real firmware
(meter/firmware, on CPython with the machine stand-in) reads the same kind of emulated chips,
streams over a simulated 115200-baud UART with a 30 ppm MCU crystal, and the real bridge
recorder maps MCU time to the Pi's clock from ping exchanges. Both traces go through
`epi analyze`'s pipeline with the same token log. The truth is ScriptedProfile.energy_j:
total within 0.2 %, every phase within 1 %, and bridged agrees with direct just as closely.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from host.analysis.align import window_energy
from host.analysis.pipeline import Options, analyze

NS = 1_000_000_000
T0 = 5 * NS
METER_CONSTANT = 1e8


def _schedule() -> tuple[tuple[float, float], list[dict]]:
    rng = np.random.default_rng(1)
    t = 5.4
    reqs = []
    for rep in (-1, 0, 1, 2):
        for p in range(2):
            pf, dc = 0.5 + rng.uniform(0, 0.2), 1.0 + rng.uniform(0, 0.5)
            reqs.append({"repeat": rep, "prompt": p, "start": t, "first": t + pf,
                         "end": t + pf + dc})
            t += pf + dc + 0.4
    return (2.0, 5.0), reqs


def _profiles(reqs: list[dict]) -> list:
    from meter.emulation.power_models import ScriptedProfile

    def steps(idle_w: float, pre_w: float, dec_w: float) -> list[tuple[float, float]]:
        out = [(0.0, idle_w)]
        for r in reqs:
            out += [(r["start"], pre_w), (r["first"], dec_w), (r["end"], idle_w)]
        return out

    return [ScriptedProfile(steps(3.0, 8.0, 6.0), start_mono_ns=T0, power_factor=0.6),
            ScriptedProfile(steps(2.5, 4.0, 5.5), start_mono_ns=T0, power_factor=0.6)]


def _board(root: Path, bridge: bool) -> Path:
    lines = ['format = "epi-board"', "format_version = 1", 'name = "cmp"']
    if bridge:
        lines += ['bus = "bridge"', "[bridge]", 'port = "(emulated)"', "baud = 115200",
                  "rate_hz = 10", 'encoding = "json"']
    else:
        lines += ["[sampling]", "period_s = 0.1"]
    for i in range(2):
        lines += ["[[channel]]", f'name = "c{i}"', f'node = "n{i}"']
        if not bridge:
            lines += [f'chip_select = "CE{i}"',
                      f"meter_constant_imp_per_kwh = {METER_CONSTANT:.0f}"]
    path = root / ("bridge.toml" if bridge else "spi.toml")
    path.write_text("\n".join(lines) + "\n")
    return path


def _meter_run(root: Path, profiles: list, duration_s: float, *, bridge: bool,
               faults: tuple[str, ...] = ()) -> Path:
    from meter.clock import SimulatedClock
    from meter.daemon.service import DaemonOptions, MeterDaemon

    out = root / ("trace-bridge" if bridge else "trace-spi")
    opts = DaemonOptions(out_dir=out, board_path=_board(root, bridge), emulate=not bridge,
                         emulate_bridge=bridge, duration_s=duration_s, listen=None,
                         clock=SimulatedClock(T0), power_model=profiles, faults=faults)
    MeterDaemon(opts, log=lambda line: None).run()
    return out


def _token_log(root: Path, idle: tuple[float, float], reqs: list[dict], end_s: float) -> Path:
    from host.run import tokenlog

    run = root / "run"
    hdr = tokenlog.RunHeader.create(run, {
        "model": {"path": "gt.gguf", "sha256": "e" * 64, "map_id": "gt", "n_layers": 8,
                  "n_params": 1},
        "llama_cpp": {"version": "test", "build_flags": "", "rpc": True}, "settings": {},
        "placement": [{"node": "n0", "endpoint": None, "layers": [0, 1, 2, 3]},
                      {"node": "n1", "endpoint": "127.0.0.1:50052", "layers": [4, 5, 6, 7]}],
        "host": "inference", "boot_id": "inference-boot"})
    for when, ts in (("start", 1.0), ("end", end_s)):
        hdr.add_clock_sync({"t_local_mono_ns": T0 + round(ts * NS), "offset_ns": 0,
                            "uncertainty_ns": 50_000, "rtt_ns": 100_000,
                            "meter_url": "simulated"}, when)
    app = tokenlog.CsvAppender(run)
    loc = lambda s: T0 + round(s * NS)  # noqa: E731
    app.write_idle(0, (loc(idle[0]), 0), (loc(idle[1]), 0))
    for i, r in enumerate(reqs):
        toks = np.linspace(loc(r["first"]), loc(r["end"]), 16).astype(np.int64).tolist()
        app.write_request(tokenlog.RequestRecord(
            request_id=i, repeat=r["repeat"], warmup=r["repeat"] < 0, prompt_id=f"p{r['prompt']}",
            n_prompt_tokens=20, t_start_mono_ns=loc(r["start"]), t_start_real_ns=0,
            token_ids=list(range(16)), token_mono_ns=toks, token_real_ns=[0] * 16,
            t_end_mono_ns=toks[-1], t_end_real_ns=0, node="n0"))
    app.close()
    hdr.finish("completed")
    return run


def _truth(profile, reqs: list[dict], kind: str) -> np.ndarray:
    a, b = {"prefill": ("start", "first"), "decode": ("first", "end"),
            "request": ("start", "end")}[kind]
    return np.array([profile.energy_j(T0 + round(r[a] * NS), T0 + round(r[b] * NS))
                     for r in reqs if r["repeat"] >= 0])


def _phase_errors(a, profiles, reqs) -> dict:
    w = a.windows
    worst = {}
    for kind in ("prefill", "decode", "request"):
        for ch, scope in ((0, "n0"), (1, "n1")):
            got = w[(w["kind"] == kind) & (w["scope"] == scope)]
            assert (got["energy_method"] == "counter").all()
            err = got["energy_j"].to_numpy() / _truth(profiles[ch], reqs, kind) - 1
            worst[(kind, scope)] = float(np.max(np.abs(err)))
    return worst


def _total(a, idle, reqs) -> float:
    ta, tb = T0 + round(idle[0] * NS), T0 + round(reqs[-1]["end"] * NS)
    return sum(window_energy(a.trace.series(ch, a.runs[0].boot_id), np.array([ta]),
                             np.array([tb])).energy_counter_j[0] for ch in (0, 1))


@pytest.mark.slow
def test_bridged_energy_matches_truth_and_the_direct_spi_path(tmp_path: Path) -> None:
    idle, reqs = _schedule()
    end_s = reqs[-1]["end"] + 2.0
    profiles = _profiles(reqs)
    run = _token_log(tmp_path, idle, reqs, end_s)
    results = {}
    for bridge in (False, True):
        trace = _meter_run(tmp_path, profiles, end_s, bridge=bridge)
        # repeat CV gate off: _schedule draws each request's prefill and decode lengths at
        # random, so J/token differs across repeats by design; the energies are under test
        a = analyze([run], trace, Options(cv_threshold=1.0))
        assert a.verdicts["valid"].all(), a.verdicts["reasons"].tolist()
        results[bridge] = (a, _phase_errors(a, profiles, reqs), _total(a, idle, reqs))
    ta, tb = T0 + round(idle[0] * NS), T0 + round(reqs[-1]["end"] * NS)
    truth_total = sum(p.energy_j(ta, tb) for p in profiles)
    for bridge, (_a, worst, total) in results.items():
        assert max(worst.values()) < 0.01, (bridge, worst)
        assert abs(total / truth_total - 1) < 0.002, (bridge, total, truth_total)
    # the two paths agree with each other on every window within the same bars
    wd, wb = results[False][0].windows, results[True][0].windows
    for kind in ("prefill", "decode", "request"):
        for scope in ("n0", "n1", "all"):
            d = wd[(wd["kind"] == kind) & (wd["scope"] == scope)]["energy_j"].to_numpy()
            b = wb[(wb["kind"] == kind) & (wb["scope"] == scope)]["energy_j"].to_numpy()
            assert np.max(np.abs(b / d - 1)) < 0.01, (kind, scope)
    assert abs(results[True][2] / results[False][2] - 1) < 0.002
    # J/token through the bridge equals J/token through SPI (0.2 %), per repeat and phase
    keys = ["phase", "unit", "basis", "scope", "repeat"]
    rd = results[False][0].repeats.set_index(keys)["j_per_token"]
    rb = results[True][0].repeats.set_index(keys)["j_per_token"]
    both = rd.to_frame("spi").join(rb.to_frame("bridge"), how="inner")
    both = both[np.isfinite(both["spi"].to_numpy(dtype=float))]
    assert len(both) >= 6
    assert np.allclose(both["bridge"].to_numpy(dtype=float), both["spi"].to_numpy(dtype=float),
                       rtol=0.01), both
    # the trace says it is bridged, with its clock mapping and uncertainty
    meta = results[True][0].trace.segments[0].meta
    assert meta["bridged"] is True and meta["board"]["bus"] == "bridge"
    # the meter constant comes from the firmware's hello (the analysis's counter resolution)
    assert [c["meter_constant_imp_per_kwh"] for c in meta["channels"]] == [METER_CONSTANT] * 2
    clock = meta["bridge"]["clock"]
    assert clock["drift_fitted"] and abs(clock["drift_ppm"] - 30.0) < 10.0, clock
    assert clock["uncertainty_ns"] < 1_000_000
