"""`epi run` on one node: the token log of a real run, EOS suppression, clock sync, user errors."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from epi.core.errors import UserError
from epi.core.net import free_port
from host.analysis.tokenlog_reader import read_run as read_token_log
from host.run.messages import ChildMessage, Done, Idle, Loaded
from host.run.runner import RunSettings, plan_run, run
from tests.cli_run import run_epi as _epi

TOKENS = 12


def _fake_sync():
    """A clock-sync stand-in: meter = local + 5 s, drifting +10 ppm."""
    calls: list[int] = []

    def sync(url: str) -> dict:
        t = time.monotonic_ns()
        calls.append(t)
        return {
            "t_local_mono_ns": t,
            "offset_ns": 5_000_000_000 + (t - calls[0]) // 100_000,
            "uncertainty_ns": 20_000,
            "rtt_ns": 40_000,
            "meter_url": url,
        }

    return sync, calls


SMALL_PROMPTS = {
    "format": "epi-prompts",
    "format_version": 1,
    "name": "test",
    "version": "test-v1",
    "prompts": [
        {"id": "short", "n_tokens": 8, "text": "The quick brown fox jumps over the lazy dog."},
        {"id": "long", "n_tokens": 24, "text": " ".join(["A small town wants a bridge."] * 8)},
    ],
}


@pytest.fixture(scope="module")
def local_run(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory):
    """One real run of the test model: 1 warm-up pass, 2 repeats, fake meter clock."""
    base = tmp_path_factory.mktemp("run")
    prompts = base / "prompts.json"
    prompts.write_text(json.dumps(SMALL_PROMPTS))
    out = base / "log"
    sync, _ = _fake_sync()
    messages: list[ChildMessage] = []
    os.environ["EPI_PERF_COUNTERS"] = "1"  # opt-in counting; the run's child inherits it
    try:
        result = run(
            RunSettings(
                model=tiny_model,
                out=out,
                prompts=prompts,
                tokens=TOKENS,
                repeats=2,
                warmups=1,
                threads=1,
                idle_s=0.2,
                cooldown_s=0.05,
                meter="http://meter.test:8757",
            ),
            echo=lambda line: None,
            clock_sync=sync,
            on_message=messages.append,
        )
    finally:
        del os.environ["EPI_PERF_COUNTERS"]
    return result, read_token_log(out), messages


def test_run_writes_a_complete_token_log(local_run) -> None:
    result, log, _ = local_run
    h, rq = log.header, log.requests
    assert h["status"] == "completed" and h["error"] is None
    assert h["model"]["n_layers"] == 8 and len(h["model"]["sha256"]) == 64
    assert h["model"]["n_params"] > 0 and h["model"]["map_id"] is None
    s = h["settings"]
    assert (s["threads"], s["threads_batch"], s["tokens_per_request"]) == (1, 1, TOKENS)
    assert s["prompt_set_version"] == "test-v1" and s["eog_suppressed"] == [2]
    assert (
        h["llama_cpp"]["version"] == "0.3.36" and "-DGGML_RPC=ON" in h["llama_cpp"]["build_flags"]
    )
    assert h["boot_id"] and h["host"]
    # placement: everything on this host
    [node] = h["placement"]
    assert node["endpoint"] is None and node["layers"] == list(range(8))
    assert set(node["extra_tensors"]) == {"token_embd", "output"} and node["weights_mib"] > 0
    # 2 prompts x (1 warm-up + 2 repeats), N tokens each, stated prompt lengths
    assert len(rq) == 6 == result.n_requests
    assert (rq["n_generated_tokens"] == TOKENS).all()
    assert rq["prompt_id"].tolist() == ["short", "long"] * 3
    assert rq["n_prompt_tokens"].tolist() == [8, 24] * 3
    assert list(rq["repeat"].unique()) == [-1, 0, 1]
    assert (rq["warmup"] == (rq["repeat"] < 0)).all()
    assert rq["request_id"].tolist() == list(range(6))
    assert result.prefill_ms_median > 0 and result.decode_tok_s_median > 0


def test_events_mark_prefill_and_every_token(local_run) -> None:
    _, log, _ = local_run
    ev, rq = log.events, log.requests
    for _, r in rq.iterrows():
        e = ev[ev["request_id"] == r["request_id"]]
        assert e["event"].iloc[0] == "request_start" and e["event"].iloc[-1] == "request_end"
        tok = e[e["event"] == "token"]
        assert tok["token_index"].tolist() == list(range(TOKENS))
        assert 2 not in set(tok["token_id"])  # EOS suppressed
        assert e["t_mono_ns"].is_monotonic_increasing
        assert r["t_start_mono_ns"] == e["t_mono_ns"].iloc[0]
        assert r["t_first_token_mono_ns"] == tok["t_mono_ns"].iloc[0]
        assert r["t_end_mono_ns"] == tok["t_mono_ns"].iloc[-1]  # end of decode: last token
        assert e["t_mono_ns"].iloc[-1] >= r["t_end_mono_ns"]  # request_end right after it
        assert r["t_first_token_mono_ns"] > r["t_start_mono_ns"]  # prefill takes time
    # the two clocks were read together: their difference is constant to well under 1 ms
    diff = ev["t_real_ns"] - ev["t_mono_ns"]
    assert diff.max() - diff.min() < 1_000_000
    # greedy decoding: every repeat of a prompt generates the same tokens
    tok = ev[ev["event"] == "token"]
    per_prompt = tok.groupby(["prompt_id", "repeat"])["token_id"].apply(tuple)
    for prompt in per_prompt.index.get_level_values(0).unique():
        assert len(set(per_prompt[prompt])) == 1


def test_log_reads_with_the_analysis_reader(local_run) -> None:
    """The analysis reader (host.analysis.tokenlog_reader) accepts what the runner wrote."""
    from host.analysis.tokenlog_reader import read_run

    result, log, _ = local_run
    parsed = read_run(result.run_dir)
    assert parsed.status_problem is None
    assert len(parsed.requests) == len(log.requests) and len(parsed.idle) == 2
    assert [p.layers for p in parsed.placement] == [tuple(range(8))]


def test_idle_windows_precede_each_repeat(local_run) -> None:
    _, log, _ = local_run
    ev, rq = log.events, log.requests
    idle = ev[ev["event"].isin(["idle_start", "idle_end"])]
    assert idle["request_id"].isna().all()
    assert idle["event"].tolist() == ["idle_start", "idle_end"] * 2
    for r in (0, 1):
        start, end = idle[idle["repeat"] == r]["t_mono_ns"].tolist()
        assert end - start >= 0.2e9
        first_request = rq[(rq["repeat"] == r)]["t_start_mono_ns"].min()
        assert end <= first_request
        last_before = rq[rq["repeat"] == r - 1]["t_end_mono_ns"].max()
        assert start - last_before >= 0.05e9  # cool-down


def test_clock_sync_recorded_at_start_during_and_end(local_run) -> None:
    _, log, messages = local_run
    sync = log.header["clock_sync"]
    assert [e["when"] for e in sync] == ["start", "during", "end"]
    assert all(e["meter_url"] == "http://meter.test:8757" for e in sync)
    assert all(e["offset_ns"] >= 5_000_000_000 for e in sync)
    assert log.header["clock_drift_ppm"] == pytest.approx(10.0, rel=0.01)
    kinds = [type(m) for m in messages]
    assert kinds[0] is Loaded and kinds[-1] is Done and kinds.count(Idle) == 2


def test_clock_sync_against_a_real_meter_server(tiny_model: Path, tmp_path: Path) -> None:
    """The meter daemon's /clock endpoint with a clock 7 s ahead: the offset is found."""
    from meter.daemon.http_server import MeterServer
    from meter.daemon.live_stream import LiveHub
    from meter.daemon.metrics import MeterState

    class AheadClock:
        def monotonic_ns(self) -> int:
            return time.monotonic_ns() + 7_000_000_000

        def realtime_ns(self) -> int:
            return time.time_ns()

    with MeterServer(
        "127.0.0.1", 0, state=MeterState([], {}), hub=LiveHub(), clock=AheadClock()
    ) as srv:
        run(
            RunSettings(
                model=tiny_model,
                out=tmp_path / "log",
                tokens=2,
                repeats=1,
                warmups=0,
                threads=1,
                idle_s=0,
                cooldown_s=0,
                meter=srv.url,
            ),
            echo=lambda line: None,
        )
    sync = read_token_log(tmp_path / "log").header["clock_sync"]
    assert [e["when"] for e in sync] == ["start", "end"]
    for e in sync:
        assert abs(e["offset_ns"] - 7_000_000_000) <= e["uncertainty_ns"] + 1_000_000


def test_eos_is_suppressed_and_prefill_is_full(tiny_model: Path) -> None:
    from host.run.engine import load_model, perf_context, timed_request

    m = load_model(tiny_model, threads=1, n_ctx=256)
    prompt = [1, 450, 4996, 17354, 1701]
    m.llm.epi_ban_tokens([])
    free = timed_request(m.llm, prompt, 6).token_ids
    m.llm.epi_ban_tokens([free[0]])
    banned = timed_request(m.llm, prompt, 6).token_ids
    assert banned[0] != free[0] and free[0] not in banned
    m.llm.epi_ban_tokens(m.eog_ids)
    before = perf_context(m.llm)["n_prompt_eval"]
    timed_request(m.llm, prompt, 3)
    timed_request(m.llm, prompt, 3)  # same prompt again: no KV-cache reuse
    assert perf_context(m.llm)["n_prompt_eval"] - before == 2 * len(prompt)


# ---- user errors: one line, non-zero exit, nothing written ------------------------------------


def test_missing_model(monkeypatch, capsys, tmp_path: Path) -> None:
    code, _, err = _epi(
        monkeypatch, capsys, "run", str(tmp_path / "no.gguf"), "--out", str(tmp_path / "o")
    )
    assert code == 2 and err == f"epi: error: {tmp_path / 'no.gguf'}: model file not found\n"
    assert not (tmp_path / "o").exists()


def test_not_a_gguf(monkeypatch, capsys, tmp_path: Path) -> None:
    bad = tmp_path / "model.gguf"
    bad.write_bytes(b"PK\x03\x04 not a model")
    code, _, err = _epi(monkeypatch, capsys, "run", str(bad), "--out", str(tmp_path / "o"))
    assert code == 2 and "not a GGUF file" in err and err.count("\n") == 1


def test_short_warm_ups_generate_their_own_tokens_and_the_log_says_so(
        tiny_model: Path, tmp_path: Path) -> None:
    """`warmup_tokens`: every warm-up request generates that many tokens, every measured one
    the run's, and run.json records both (a warm-up longer than the run is cut to the run's)."""
    prompts = tmp_path / "prompts.json"
    prompts.write_text(json.dumps(SMALL_PROMPTS))
    for asked, warm in ((3, 3), (100, TOKENS)):
        out = tmp_path / f"log{asked}"
        run(RunSettings(model=tiny_model, out=out, prompts=prompts, tokens=TOKENS, repeats=1,
                        warmups=2, warmup_tokens=asked, threads=1, idle_s=0.0, cooldown_s=0.0,
                        meter="http://meter.test:8757"),
            echo=lambda line: None, clock_sync=_fake_sync()[0])
        log = read_token_log(out)
        rq = log.requests
        assert rq.loc[rq["warmup"].astype(bool), "n_generated_tokens"].tolist() == [warm] * 4
        assert rq.loc[~rq["warmup"].astype(bool), "n_generated_tokens"].tolist() == [TOKENS] * 2
        s = log.header["settings"]
        assert (s["tokens_per_request"], s["warmup_tokens_per_request"]) == (TOKENS, warm)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--tokens", "300"], "exceeds the context length 512"),
        (["--tokens", "0"], "--tokens: 0 is below the minimum 1"),
        (["--repeats", "0"], "--repeats: 0 is below the minimum 1"),
        (["--warmup-tokens", "0"], "--warmup-tokens"),
        (["--threads", "0"], "--threads: 0 is below the minimum 1"),
        (["--idle-s", "-1"], "--idle-s"),
        (["--split", "1,1"], "--split: only applies with --workers"),
        (["--workers", "127.0.0.1"], "is not [name=]host:port"),
        (["--workers", "a=127.0.0.1:1,b=127.0.0.1:2", "--split", "1"], "1 shares for 2 workers"),
        (["--workers", "a=127.0.0.1:1,b=127.0.0.1:2", "--split", "100,1"], "would get no layer"),
    ],
)
def test_bad_options(monkeypatch, capsys, tiny_model: Path, tmp_path: Path, args, message) -> None:
    code, _, err = _epi(
        monkeypatch, capsys, "run", str(tiny_model), "--out", str(tmp_path / "o"), *args
    )
    assert code == 2 and message in err and err.count("\n") == 1, err
    assert not (tmp_path / "o").exists()


def test_prompt_file_problem(monkeypatch, capsys, tiny_model: Path, tmp_path: Path) -> None:
    prompts = tmp_path / "p.json"
    prompts.write_text('{"format": "epi-prompts", "format_version": 1, "prompts": 3}')
    code, _, err = _epi(
        monkeypatch,
        capsys,
        "run",
        str(tiny_model),
        "--out",
        str(tmp_path / "o"),
        "--prompts",
        str(prompts),
    )
    assert code == 2 and str(prompts) in err and err.count("\n") == 1


def test_unreachable_worker(monkeypatch, capsys, tiny_model: Path, tmp_path: Path) -> None:
    port = free_port()
    code, _, err = _epi(
        monkeypatch,
        capsys,
        "run",
        str(tiny_model),
        "--out",
        str(tmp_path / "o"),
        "--workers",
        f"pi1=127.0.0.1:{port}",
    )
    assert code == 2 and f"worker 127.0.0.1:{port} (node pi1): unreachable" in err
    assert err.count("\n") == 1 and not (tmp_path / "o").exists()


def test_unreachable_meter(monkeypatch, capsys, tiny_model: Path, tmp_path: Path) -> None:
    port = free_port()
    code, _, err = _epi(
        monkeypatch,
        capsys,
        "run",
        str(tiny_model),
        "--out",
        str(tmp_path / "o"),
        "--meter",
        f"http://127.0.0.1:{port}",
    )
    assert code == 2 and "cannot reach" in err and err.count("\n") == 1
    assert not (tmp_path / "o").exists()


def test_existing_log_is_not_overwritten(local_run, tiny_model: Path) -> None:
    result, _, _ = local_run
    with pytest.raises(UserError, match="already holds a token log"):
        run(
            RunSettings(model=tiny_model, out=result.run_dir, tokens=2, repeats=1, warmups=0),
            echo=lambda line: None,
        )


def test_plan_rounds_context_and_uses_stated_prompt_lengths(
    tiny_model: Path, tmp_path: Path
) -> None:
    plan = plan_run(RunSettings(model=tiny_model, out=tmp_path / "o", tokens=10, threads=1))
    assert plan.n_ctx == 512  # 256 + 10 rounded up to 256s
    assert {k: len(v) for k, v in plan.tokens_by_prompt.items()} == {
        "p032-kettle": 32,
        "p064-bridge": 64,
        "p128-letter": 128,
        "p256-notes": 256,
    }
    assert all(v[0] == 1 for v in plan.tokens_by_prompt.values())  # BOS of the SPM vocab


@pytest.mark.slow
def test_long_idle_and_cool_down_are_not_stalls(tiny_model: Path, tmp_path: Path) -> None:
    """The stall watchdog allows for the idle window and cool-down on top of its timeout."""
    prompts = tmp_path / "prompts.json"
    prompts.write_text(json.dumps(SMALL_PROMPTS))
    run(
        RunSettings(
            model=tiny_model,
            out=tmp_path / "log",
            prompts=prompts,
            tokens=2,
            repeats=1,
            warmups=0,
            threads=1,
            idle_s=1.5,
            cooldown_s=1.2,
            stall_timeout_s=1.0,
        ),
        echo=lambda line: None,
    )
    assert read_token_log(tmp_path / "log").header["status"] == "completed"


def test_meter_lost_mid_run_fails_the_run(tiny_model: Path, tmp_path: Path) -> None:
    """A clock sync that fails between repeats fails the run (exit 1), log valid."""
    from host.errors import RunFailed

    calls: list[str] = []

    def sync(url: str) -> dict:
        calls.append(url)
        if len(calls) > 1:
            raise UserError(f"meter {url}: cannot reach the clock-sync endpoint (refused)")
        t = time.monotonic_ns()
        return {
            "t_local_mono_ns": t,
            "offset_ns": 0,
            "uncertainty_ns": 1,
            "rtt_ns": 1,
            "meter_url": url,
        }

    prompts = tmp_path / "prompts.json"
    prompts.write_text(json.dumps(SMALL_PROMPTS))
    with pytest.raises(RunFailed, match="clock sync before repeat 2 failed") as err:
        run(
            RunSettings(
                model=tiny_model,
                out=tmp_path / "log",
                prompts=prompts,
                tokens=2,
                repeats=2,
                warmups=0,
                threads=1,
                idle_s=0,
                cooldown_s=0,
                meter="http://m:1",
            ),
            echo=lambda line: None,
            clock_sync=sync,
        )
    assert err.value.exit_code == 1
    log = read_token_log(tmp_path / "log")
    assert log.header["status"] == "failed" and set(log.requests["repeat"]) == {0}
    assert [e["when"] for e in log.header["clock_sync"]] == ["start"]


def test_perf_counters_per_request_and_phase(local_run) -> None:
    """Software counters for every request's prefill and decode (this VM has no PMU: its
    hardware events are recorded as unavailable with the kernel's reason). The CPU time a
    phase counted cannot exceed the phase's wall time × the threads counted (one here)."""
    from host.run.perf_log import read_perf_counters

    result, log, _ = local_run
    info = json.loads((result.run_dir / "perf_counters.json").read_text())
    assert "task-clock" in info["events"]
    assert set(info["events"]).isdisjoint(info["unavailable"])
    counts = read_perf_counters(result.run_dir)
    rq = log.requests
    assert {rid for rid, _ in counts} == set(rq["request_id"])
    for _, r in rq.iterrows():
        rid = int(r["request_id"])
        prefill_ns = int(r["t_first_token_mono_ns"]) - int(r["t_start_mono_ns"])
        decode_ns = int(r["t_end_mono_ns"]) - int(r["t_first_token_mono_ns"])
        for phase, wall in (("prefill", prefill_ns), ("decode", decode_ns)):
            cpu = counts[(rid, phase)]["task-clock"]
            assert 0 < cpu <= 1.05 * wall + 2_000_000, (rid, phase, cpu, wall)
