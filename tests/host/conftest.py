"""Synthetic traces and token logs written per docs/formats.md, with exact ground truth.

Writing them here (not with meter/trace.py or host/tokenlog.py) makes these tests a check of the
documented contract as the analysis reads it; the ground-truth test in test_align_groundtruth.py
goes through the real writers.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

NS = 1_000_000_000
METER_BOOT = "meter-boot-0000"
HOST_BOOT = "host-boot-1111"


@dataclass
class Steps:
    """Piecewise-constant power: level[i] holds on [t[i], t[i+1]); exact integral."""

    t_ns: np.ndarray
    level_w: np.ndarray

    def power(self, t: np.ndarray) -> np.ndarray:
        i = np.clip(np.searchsorted(self.t_ns, t, side="right") - 1, 0, len(self.t_ns) - 1)
        return self.level_w[i]

    def cum(self, t: np.ndarray) -> np.ndarray:
        seg = np.diff(self.t_ns) / NS * self.level_w[:-1]
        c = np.concatenate([[0.0], np.cumsum(seg)])
        i = np.clip(np.searchsorted(self.t_ns, t, side="right") - 1, 0, len(self.t_ns) - 1)
        return c[i] + self.level_w[i] * (np.asarray(t) - self.t_ns[i]) / NS

    def energy(self, t0: float, t1: float) -> float:
        return float(self.cum(np.array([t1]))[0] - self.cum(np.array([t0]))[0])


@dataclass
class Schedule:
    """A synthetic run on the meter clock: idle window, then requests (prefill, decode)."""

    idle: tuple[int, int]
    requests: list[dict] = field(default_factory=list)  # meter-clock times and counts

    def profile(self, idle_w: float, prefill_w: float, decode_w: float) -> Steps:
        t = [self.idle[0] - 60 * NS]
        lv = [idle_w]
        for r in self.requests:
            t += [r["start"], r["first"], r["end"]]
            lv += [prefill_w, decode_w, idle_w]
        return Steps(np.array(t, dtype=np.int64), np.array(lv, dtype=np.float64))


def make_schedule(t0_ns: int, *, n_repeats: int = 3, prompts: int = 2, warmups: int = 1,
                  idle_s: float = 3.0, prefill_s: float = 0.6, decode_s: float = 1.5,
                  gap_s: float = 0.4, n_prompt: int = 20, n_gen: int = 16,
                  seed: int = 0) -> Schedule:
    """Request times (meter clock) with a little random variation, warm-ups first."""
    rng = np.random.default_rng(seed)
    idle = (t0_ns, t0_ns + int(idle_s * NS))
    t = idle[1] + int(gap_s * NS)
    reqs = []
    rid = 0
    for rep in [*range(-warmups, 0), *range(n_repeats)]:
        for p in range(prompts):
            pf = int((prefill_s + rng.uniform(0, 0.01)) * NS)
            dc = int((decode_s + rng.uniform(0, 0.02)) * NS)
            reqs.append({"request_id": rid, "repeat": rep, "warmup": int(rep < 0),
                         "prompt_id": f"p{p}", "start": t, "first": t + pf, "end": t + pf + dc,
                         "n_prompt": n_prompt, "n_gen": n_gen})
            rid += 1
            t += pf + dc + int(gap_s * NS)
    return Schedule(idle, reqs)


def write_trace(root: Path, profiles: dict[int, Steps], t_start_ns: int, t_stop_ns: int, *,
                period_s: float = 0.1, nodes: dict[int, str | None] | None = None,
                boot_id: str = METER_BOOT, segments: list[tuple[int, int]] | None = None,
                events: list[tuple] | None = None, drop: Callable | None = None,
                status: Callable | None = None, real_offset_ns: int = 1_700_000_000 * NS,
                meter_constant: float = 1e7, jitter_ns: int = 2_000_000,
                seed: int = 1) -> Path:
    """A trace directory per formats.md §1 (one segment per (start, stop) span)."""
    root.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    nodes = nodes if nodes is not None else {ch: f"n{ch}" for ch in profiles}
    segments = segments or [(t_start_ns, t_stop_ns)]
    for number, (s0, s1) in enumerate(segments, start=1):
        meta = {
            "format": "epi-trace", "format_version": 1, "segment": number,
            "daemon_version": "test", "host": "meter", "boot_id": boot_id,
            "started_mono_ns": s0, "started_real_ns": s0 + real_offset_ns, "emulated": True,
            "power_model": {"kind": "test-steps", "modelled": True},
            "sample_period_s": period_s,
            "channels": [{"channel": ch, "name": f"ch{ch}", "node": nodes.get(ch),
                          "meter_constant_imp_per_kwh": meter_constant, "ct": None,
                          "calibration": {}} for ch in sorted(profiles)],
            "board": {"bus": "emulator"},
        }
        (root / f"seg-{number:06d}.meta.json").write_text(json.dumps(meta))
        sweeps = np.arange(s0, s1, int(period_s * NS), dtype=np.int64)
        lines = ["seq,channel,t_mono_ns,t_real_ns,power_w,voltage_v,current_a,power_factor,"
                 "frequency_hz,energy_j,status"]
        for seq, ts in enumerate(sweeps):
            for ch, prof in sorted(profiles.items()):
                t = int(ts + ch * 1_000_000 + rng.integers(0, jitter_ns + 1))
                if drop is not None and drop(ch, t):
                    continue
                pw = float(prof.power(np.array([t]))[0])
                e = float(prof.cum(np.array([t]))[0] - prof.cum(np.array([s0]))[0])
                st = status(ch, t) if status is not None else 0
                lines.append(f"{seq},{ch},{t},{t + real_offset_ns},{pw!r},230.0,"
                             f"{pw / 230.0!r},1.0,50.0,{e!r},{st}")
        (root / f"seg-{number:06d}.samples.csv").write_text("\n".join(lines) + "\n")
        ev = ["t_mono_ns,t_real_ns,channel,kind,detail",
              f"{s0},{s0 + real_offset_ns},,start,daemon start"]
        for t, ch, kind, detail in events or []:
            if s0 <= t < s1:
                ev.append(f"{t},{t + real_offset_ns},{'' if ch is None else ch},{kind},{detail}")
        (root / f"seg-{number:06d}.events.csv").write_text("\n".join(ev) + "\n")
    return root


def write_run(root: Path, sched: Schedule, *, offset_ns: int = 0, drift_ppm: float = 0.0,
              sync: str = "both", boot_id: str = HOST_BOOT, status: str = "completed",
              map_id: str = "q4_k_m", sha256: str = "a" * 64, nodes: list[str] | None = None,
              run_id: str | None = None, real_offset_ns: int = 1_700_000_000 * NS,
              sync_uncertainty_ns: int = 200_000, error: str | None = None) -> Path:
    """A token-log directory per formats.md §2 from a meter-clock schedule.

    local = meter − offset(t), the offset drifting by `drift_ppm` from the run start.
    """
    root.mkdir(parents=True, exist_ok=True)
    t_ref = sched.idle[0]

    def off(t_meter: int) -> int:
        return offset_ns + round((t_meter - t_ref) * drift_ppm * 1e-6)

    def local(t_meter: int) -> int:
        return t_meter - off(t_meter)

    nodes = nodes or ["n0"]
    n_layers = 8
    per = int(np.ceil(n_layers / len(nodes)))
    placement = [{"node": n, "endpoint": None if i == 0 else f"127.0.0.1:{50052 + i}",
                  "layers": list(range(i * per, min((i + 1) * per, n_layers)))}
                 for i, n in enumerate(nodes)]
    t_last = sched.requests[-1]["end"] + NS
    syncs = []
    if sync in ("start", "both"):
        syncs.append({"t_local_mono_ns": local(t_ref - NS), "offset_ns": off(t_ref - NS),
                      "uncertainty_ns": sync_uncertainty_ns, "rtt_ns": 400_000,
                      "meter_url": "http://127.0.0.1:8765", "when": "start"})
    if sync in ("end", "both"):
        syncs.append({"t_local_mono_ns": local(t_last), "offset_ns": off(t_last),
                      "uncertainty_ns": sync_uncertainty_ns, "rtt_ns": 400_000,
                      "meter_url": "http://127.0.0.1:8765", "when": "end"})
    header = {
        "format": "epi-tokenlog", "format_version": 1, "run_id": run_id or root.name,
        "status": status, "error": error,
        "model": {"path": f"/models/{map_id}.gguf", "sha256": sha256, "map_id": map_id,
                  "n_layers": n_layers, "n_params": 1000},
        "llama_cpp": {"version": "test", "build_flags": "", "rpc": len(nodes) > 1},
        "settings": {"threads": 2, "n_ctx": 512, "tokens_per_request": 16, "repeats": 3,
                     "warmups": 1, "idle_s": 3.0, "cooldown_s": 0.0, "prompts_file": "x",
                     "prompt_set_version": 1, "seed": 0},
        "placement": placement, "host": "inference", "boot_id": boot_id, "clock_sync": syncs,
    }
    (root / "run.json").write_text(json.dumps(header))
    ev = ["request_id,repeat,warmup,prompt_id,event,token_index,token_id,t_mono_ns,t_real_ns"]
    rq = ["request_id,repeat,warmup,prompt_id,n_prompt_tokens,n_generated_tokens,"
          "t_start_mono_ns,t_first_token_mono_ns,t_end_mono_ns,node"]

    def row(*vals: object) -> str:
        return ",".join("" if v is None else str(v) for v in vals)

    a, b = local(sched.idle[0]), local(sched.idle[1])
    ev.append(row(None, 0, 0, None, "idle_start", None, None, a, a + real_offset_ns))
    ev.append(row(None, 0, 0, None, "idle_end", None, None, b, b + real_offset_ns))
    for r in sched.requests:
        s, f, e = local(r["start"]), local(r["first"]), local(r["end"])
        head = (r["request_id"], r["repeat"], r["warmup"], r["prompt_id"])
        ev.append(row(*head, "request_start", None, None, s, s + real_offset_ns))
        toks = np.linspace(f, e, r["n_gen"]).astype(np.int64)
        for i, tt in enumerate(toks):
            ev.append(row(*head, "token", i, 100 + i, int(tt), int(tt) + real_offset_ns))
        ev.append(row(*head, "request_end", None, None, e + 1000, e + 1000 + real_offset_ns))
        rq.append(row(*head, r["n_prompt"], r["n_gen"], s, f, e, nodes[0]))
    (root / "events.csv").write_text("\n".join(ev) + "\n")
    (root / "requests.csv").write_text("\n".join(rq) + "\n")
    return root


LEVELS = {"idle_w": 3.0, "prefill_w": 8.0, "decode_w": 6.0}


def write_synth_run(root: Path, name: str = "run1", *, t0_ns: int = 500 * NS,
                    channels: int = 1, trace_kw: dict | None = None,
                    run_kw: dict | None = None, sched_kw: dict | None = None,
                    trace_dir: Path | None = None, write_trace_dir: bool = True
                    ) -> tuple[Path, Path, Schedule, dict[int, Steps]]:
    """(trace_dir, run_dir, schedule, profiles) of one synthetic run on 1–2 channels under
    `root` (trace in root/trace, run in root/NAME): the `synth_run` fixture's recipe, callable
    from module-scoped fixtures too."""
    sched = make_schedule(t0_ns, **(sched_kw or {}))
    base = sched.profile(**LEVELS)
    profiles = {ch: Steps(base.t_ns, base.level_w * (1.0 + 0.5 * ch)) for ch in range(channels)}
    tdir = trace_dir or root / "trace"
    if write_trace_dir:
        write_trace(tdir, profiles, t0_ns - 2 * NS, sched.requests[-1]["end"] + 3 * NS,
                    **(trace_kw or {}))
    nodes = [f"n{ch}" for ch in range(channels)]
    rdir = write_run(root / name, sched, nodes=nodes, **(run_kw or {}))
    return tdir, rdir, sched, profiles


@pytest.fixture
def synth_run(tmp_path: Path) -> Callable[..., tuple[Path, Path, Schedule, dict[int, Steps]]]:
    """Factory: (trace_dir, run_dir, schedule, profiles) for one synthetic run on 1–2 channels
    (`write_synth_run` under the test's tmp_path)."""

    def make(name: str = "run1", **kw: Any) -> tuple[Path, Path, Schedule, dict[int, Steps]]:
        return write_synth_run(tmp_path, name, **kw)

    return make


@pytest.fixture
def synth_tools() -> SimpleNamespace:
    """The writers above, for tests (conftest modules cannot be imported by name)."""
    return SimpleNamespace(NS=NS, Steps=Steps, Schedule=Schedule, make_schedule=make_schedule,
                           write_trace=write_trace, write_run=write_run, LEVELS=LEVELS,
                           METER_BOOT=METER_BOOT, HOST_BOOT=HOST_BOOT)
