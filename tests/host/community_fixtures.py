"""Two emulated labs for the community tests: the synthetic two-configuration study of
tests/host/test_bundle.py (the fastest small analysis the suite builds), with the lab's own
schedule seeds, board in the trace meta and hardware file; lab B's meter is a real one
(no power model), lab A's is modelled."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from host.analysis.model import Options
from host.analysis.output import analyze_to
from tests.host.conftest import LEVELS, Steps, make_schedule, write_run, write_trace
from tests.host.test_bundle import ITEMS, _accuracy

NS = 1_000_000_000


def lab_study(root: Path, *, seed: int, board: str, measured: bool,
              q8_status: str = "completed") -> Path:
    """One lab's analysis directory (q4 and q8 on the same model files as every lab);
    `q8_status` other than completed makes q8's run one the analysis must not count."""
    s1 = make_schedule(500 * NS, seed=seed)
    s2 = make_schedule(s1.requests[-1]["end"] + 5 * NS, seed=seed + 1)
    p1, p2 = s1.profile(**LEVELS), s2.profile(idle_w=3.0, prefill_w=12.0, decode_w=9.0)
    prof = Steps(np.concatenate([p1.t_ns, p2.t_ns[1:]]),
                 np.concatenate([p1.level_w, p2.level_w[1:]]))
    tdir = write_trace(root / "trace", {0: prof}, 495 * NS, s2.requests[-1]["end"] + 60 * NS)
    for meta in tdir.glob("seg-*.meta.json"):
        doc = json.loads(meta.read_text())
        doc["board"] = {"bus": "emulator", "name": board}
        if measured:
            doc.update(emulated=False, power_model=None)
        meta.write_text(json.dumps(doc))
    models = root / "models"
    models.mkdir()
    runs = []
    for name, sched, sha in (("q4", s1, "1"), ("q8", s2, "2")):
        run = write_run(root / f"r_{name}", sched, offset_ns=7 * NS, map_id=name,
                        sha256=sha * 64,
                        status=q8_status if name == "q8" else "completed")
        header = json.loads((run / "run.json").read_text())
        header["model"]["path"] = str(models / f"{name}.gguf")
        header["llama_cpp"]["build_flags"] = ["-DGGML_NATIVE=OFF"]
        (run / "run.json").write_text(json.dumps(header))
        (models / f"{name}.manifest.json").write_text(json.dumps(
            {"format": "epi-quant-manifest", "format_version": 1, "map_id": name,
             "inputs": {"map_sha256": name * 32}}))
        runs.append(run)
    out = root / "out"
    analyze_to(out, runs, tdir, Options(), _accuracy(root / "acc.json", ITEMS))
    return out


def hardware_file(path: Path, board: str) -> Path:
    path.write_text(json.dumps({"board": board, "cpu": "Cortex-A76 x4", "memory_gb": 8,
                                "os": "Debian 12", "thermal": "active cooler, 22 C room"}))
    return path
