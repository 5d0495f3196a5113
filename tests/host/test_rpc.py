"""llama.cpp RPC: worker naming, HELLO probe, layer placement, runs across two local workers."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import threading
from pathlib import Path

import pytest

from epi.core.errors import UserError
from epi.core.net import free_port
from host.analysis.tokenlog_reader import read_run as read_token_log
from host.cluster.placement import parse_load_log, placement_from_log, predict_units
from host.cluster.rpc import Endpoint, parse_workers, probe
from host.cluster.workers import LocalWorker, worker_activity
from host.errors import RunFailed
from host.run.messages import ChildMessage, Idle
from host.run.runner import RunSettings, run

TOKENS = 10
PROMPTS = {
    "format": "epi-prompts",
    "format_version": 1,
    "name": "rpc-test",
    "version": "rpc-test-v1",
    "prompts": [
        {"id": "a", "n_tokens": 16, "text": " ".join(["Energy per token on small boards."] * 4)},
        {"id": "b", "n_tokens": 40, "text": " ".join(["The bridge crosses the river."] * 12)},
    ],
}

# ---- fast: parsing and the split rule -----------------------------------------------------


def test_parse_workers_names_nodes() -> None:
    eps = parse_workers("pi1=10.0.0.11:50052, 10.0.0.12:50052")
    assert eps == [Endpoint("10.0.0.11", 50052, "pi1"), Endpoint("10.0.0.12", 50052, "10.0.0.12")]
    same_host = parse_workers("127.0.0.1:5000,127.0.0.1:5001")
    assert [e.node for e in same_host] == ["127.0.0.1:5000", "127.0.0.1:5001"]
    for bad, msg in [
        ("pi1", "is not [name=]host:port"),
        ("h:notaport", "is not a number"),
        ("h:0", "outside 1..65535"),
        ("a=h:1,a=h:2", "node 'a' appears twice"),
        ("h:1,h:1", "address 'h:1' appears twice"),
        ("", "empty"),
    ]:
        with pytest.raises(UserError, match=re.escape(msg)):
            parse_workers(bad)


def test_split_rule_matches_llama_cpp_examples() -> None:
    # 8 layers + output = 9 units; equal shares: 5 / 4 (as seen in llama.cpp's own log)
    assert predict_units(8, [1, 1]) == [[0, 1, 2, 3, 4], [5, 6, 7, 8]]
    assert predict_units(8, [3, 1]) == [[0, 1, 2, 3, 4, 5, 6], [7, 8]]
    # 30 layers (SmolLM2): 31 units
    a, b = predict_units(30, [1, 1])
    assert a == list(range(16)) and b == [*range(16, 30), 30]
    assert sum(map(len, predict_units(30, [1, 2, 3]))) == 31


def test_placement_from_a_load_log() -> None:
    text = "\n".join(
        [f"load_tensors: layer {i:3d} assigned to device RPC0, is_swa = 0" for i in range(3)]
        + [f"load_tensors: layer {i:3d} assigned to device RPC1, is_swa = 0" for i in (3, 4)]
        + [
            "load_tensors:   CPU_Mapped model buffer size =    15.62 MiB",
            "load_tensors: RPC0[10.0.0.11:50052] model buffer size =     6.26 MiB",
            "load_tensors: RPC0[10.0.0.12:50052] model buffer size =    19.38 MiB",
        ]
    )
    devices = {
        "RPC0": Endpoint("10.0.0.11", 50052, "pi1"),
        "RPC1": Endpoint("10.0.0.12", 50052, "pi2"),
    }
    placement = placement_from_log(parse_load_log(text), 4, "host", devices)
    assert [(e["node"], e["layers"], e["extra_tensors"], e["weights_mib"]) for e in placement] == [
        ("host", [], ["token_embd"], 15.62),
        ("pi1", [0, 1, 2], [], 6.26),
        ("pi2", [3], ["output"], 19.38),
    ]


def test_probe_tells_a_non_rpc_server_apart(tmp_path: Path) -> None:
    srv = socket.create_server(("127.0.0.1", 0))
    port = srv.getsockname()[1]

    def answer_garbage() -> None:
        conn, _ = srv.accept()
        conn.recv(64)
        conn.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n")
        conn.close()

    t = threading.Thread(target=answer_garbage, daemon=True)
    t.start()
    with pytest.raises(UserError, match=r"not a llama\.cpp worker"):
        probe(Endpoint("127.0.0.1", port, "x"), timeout_s=2)
    t.join()
    srv.close()
    with pytest.raises(UserError, match="unreachable"):
        probe(Endpoint("127.0.0.1", free_port(), "y"), timeout_s=1)


def test_worker_activity_counts_debug_lines() -> None:
    log = (
        "Accepted client connection\n[hello] version: 7.0.0\n"
        "[alloc_buffer] device: 0, size: 1000 -> remote_ptr: 5, remote_size: 1000\n"
        "[set_tensor] buffer: 0x1, data: 0x2, offset: 0, size: 10\n"
        "[graph_compute] device: 0, n_nodes: 5, n_tensors: 9\n[graph_recompute] device: 0\n"
    )
    act = worker_activity(log)
    assert (act.tensors_received, act.graphs_computed, act.alloc_bytes, act.clients) == (
        1,
        2,
        1000,
        1,
    )


# ---- slow: two real workers on 127.0.0.1 ----------------------------------------------------


@pytest.fixture
def two_workers(tmp_path: Path):
    workers = [
        LocalWorker(free_port(), tmp_path / f"worker{i}.log", node=f"pi{i + 1}") for i in range(2)
    ]
    try:
        for w in workers:
            w.start()
        yield workers
    finally:
        for w in workers:
            if w.proc is not None and w.proc.poll() is None:
                os.kill(w.proc.pid, signal.SIGCONT)  # a test may have stopped it
            w.stop()


def _spec(workers: list[LocalWorker]) -> str:
    return ",".join(f"{w.endpoint.node}={w.endpoint.address}" for w in workers)


def _settings(model: Path, out: Path, prompts: Path, **kw) -> RunSettings:
    base = dict(
        model=model,
        out=out,
        prompts=prompts,
        tokens=TOKENS,
        repeats=1,
        warmups=0,
        threads=1,
        idle_s=0.1,
        cooldown_s=0.0,
    )
    return RunSettings(**{**base, **kw})


def _tokens(run_dir: Path) -> dict[str, list[int]]:
    ev = read_token_log(run_dir).events
    tok = ev[(ev["event"] == "token") & (ev["warmup"] == 0)]
    return {str(k): list(v) for k, v in tok.groupby("prompt_id")["token_id"]}


@pytest.mark.slow
def test_run_across_two_workers_matches_local(
    tiny_model: Path, tmp_path: Path, two_workers
) -> None:
    prompts = tmp_path / "prompts.json"
    prompts.write_text(json.dumps(PROMPTS))
    run(_settings(tiny_model, tmp_path / "local", prompts), echo=lambda line: None)
    before = [w.activity() for w in two_workers]  # HELLO probes only
    result = run(
        _settings(tiny_model, tmp_path / "rpc", prompts, workers=_spec(two_workers), node="pi0"),
        echo=lambda line: None,
    )
    log = read_token_log(tmp_path / "rpc")
    assert log.header["status"] == "completed" and log.header["llama_cpp"]["rpc"] is True
    placement = {e["node"]: e for e in log.header["placement"]}
    assert placement["pi1"]["layers"] == [0, 1, 2, 3, 4] and placement["pi1"]["extra_tensors"] == []
    assert placement["pi2"]["layers"] == [5, 6, 7] and placement["pi2"]["extra_tensors"] == [
        "output"
    ]
    assert placement["pi1"]["endpoint"] == two_workers[0].endpoint.address
    assert log.header["node"] == "pi0" and set(log.requests["node"]) == {"pi0"}
    local = placement["pi0"]
    assert local["layers"] == [] and local["extra_tensors"] == ["token_embd"]
    assert all(e["weights_mib"] > 0 for e in placement.values())
    assert result.placement == log.header["placement"]
    # both workers received tensors and computed one graph per evaluation
    n_evals = len(PROMPTS["prompts"]) * TOKENS  # prefill + (N - 1) decodes per request
    for w, b in zip(two_workers, before, strict=True):
        act = w.activity()
        assert act.tensors_received > b.tensors_received
        assert act.graphs_computed - b.graphs_computed >= n_evals
        assert act.alloc_bytes > 0
    # greedy decoding: the same tokens as the local run
    assert _tokens(tmp_path / "rpc") == _tokens(tmp_path / "local")


@pytest.mark.slow
def test_uneven_split_is_followed(tiny_model: Path, tmp_path: Path, two_workers) -> None:
    prompts = tmp_path / "prompts.json"
    prompts.write_text(json.dumps(PROMPTS))
    run(
        _settings(tiny_model, tmp_path / "rpc", prompts, workers=_spec(two_workers), split="3,1"),
        echo=lambda line: None,
    )
    header = read_token_log(tmp_path / "rpc").header
    placement = {e["node"]: e["layers"] for e in header["placement"]}
    assert placement["pi1"] == list(range(7)) and placement["pi2"] == [7]
    assert header["settings"]["split"] == [3.0, 1.0]


@pytest.mark.slow
def test_worker_killed_mid_run_fails_the_run(tiny_model: Path, tmp_path: Path, two_workers) -> None:
    prompts = tmp_path / "prompts.json"
    prompts.write_text(json.dumps(PROMPTS))

    def kill_second_worker(message: ChildMessage) -> None:
        if isinstance(message, Idle) and message.repeat == 1:
            two_workers[1].kill()

    with pytest.raises(RunFailed) as err:
        run(
            _settings(tiny_model, tmp_path / "rpc", prompts, workers=_spec(two_workers), repeats=2),
            echo=lambda line: None,
            on_message=kill_second_worker,
        )
    msg = str(err.value)
    assert err.value.exit_code == 1 and "\n" not in msg
    assert f"worker {two_workers[1].endpoint.address} (node pi2) no longer answers" in msg
    assert "nothing was retried" in msg
    log = read_token_log(tmp_path / "rpc")  # still a valid log
    assert log.header["status"] == "failed" and log.header["error"] in msg
    assert set(log.requests["repeat"]) == {0}  # repeat 0 finished, nothing after the kill
    assert len(log.requests) == len(PROMPTS["prompts"])


@pytest.mark.slow
def test_hung_worker_hits_the_stall_timeout(tiny_model: Path, tmp_path: Path, two_workers) -> None:
    prompts = tmp_path / "prompts.json"
    prompts.write_text(json.dumps(PROMPTS))

    # the stall must come from the frozen worker, not the model load
    frozen: list[ChildMessage] = []

    def freeze_first_worker(message: ChildMessage) -> None:
        if isinstance(message, Idle) and not frozen:
            os.kill(two_workers[0].proc.pid, signal.SIGSTOP)
            frozen.append(message)

    with pytest.raises(RunFailed, match="no progress from the inference process for 2 s"):
        run(
            _settings(
                tiny_model,
                tmp_path / "rpc",
                prompts,
                workers=_spec(two_workers),
                stall_timeout_s=2.0,
            ),
            echo=lambda line: None,
            on_message=freeze_first_worker,
        )
    assert frozen, "the run stalled before any worker was frozen (during the model load?)"
    assert read_token_log(tmp_path / "rpc").header["status"] == "failed"


@pytest.mark.slow
def test_epi_worker_command_serves_a_run(tiny_model: Path, tmp_path: Path) -> None:
    """`epi worker` (exec of ggml-rpc-server) answers HELLO and takes layers."""
    import subprocess
    import sys

    from host.cluster.rpc import wait_for_endpoint

    port = free_port()
    log = open(tmp_path / "w.log", "wb")  # noqa: SIM115
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "epi.cli",
            "worker",
            "--port",
            str(port),
            "--threads",
            "1",
            "--debug",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        assert wait_for_endpoint(Endpoint("127.0.0.1", port, "w"), 30)[0] == 7
        prompts = tmp_path / "prompts.json"
        prompts.write_text(json.dumps(PROMPTS))
        run(
            _settings(tiny_model, tmp_path / "rpc", prompts, workers=f"w=127.0.0.1:{port}"),
            echo=lambda line: None,
        )
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        log.close()
    text = (tmp_path / "w.log").read_text()
    assert text.startswith("epi worker: ggml-rpc-server on 127.0.0.1:")
    assert worker_activity(text).graphs_computed > 0
    placement = read_token_log(tmp_path / "rpc").header["placement"]
    assert [e["layers"] for e in placement if e["node"] == "w"] == [list(range(8))]
