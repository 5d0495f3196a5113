"""`epi run`: run a GGUF model on fixed prompts and write a token log (docs/formats.md §2).

The parent process (this module) checks everything the user gave before anything is written —
model file, prompt set and its token lengths against the model's context, workers (RPC HELLO),
split, meter — then creates the token log (status "running"), syncs clocks with the meter,
and starts the inference process (host.run.child). It follows the child's progress, syncs
clocks again before every repeat's cool-down and at the end, and marks the log "completed" or
"failed". A child that dies (llama.cpp aborts when an RPC worker goes away) or stops making
progress fails the run with one line naming the cause; nothing is retried, so a run never
continues with a different placement.

Order of a run: load → W warm-up passes over the prompts (repeat −W…−1, logged with warmup=1)
→ for each of R repeats: cool-down (sleep), idle-baseline window (idle_start/idle_end events),
one request per prompt.
"""

from __future__ import annotations

import dataclasses
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import TYPE_CHECKING, cast

from epi.core.errors import UserError
from epi.core.text import ranges_text
from epi.formats.tokenlog import RunStatus
from host.cluster.placement import PlacementEntry
from host.cluster.rpc import Endpoint, parse_workers, probe
from host.errors import RunFailed
from host.quant.model_info import ModelFacts, model_facts
from host.run import messages as msg
from host.run.child import LLAMA_LOG, Job
from host.run.meter_follow import MeterFollow
from host.run.prompts import PromptSet, load_prompt_set, prompt_tokens
from host.run.tokenlog import RUN_JSON, RunHeader, boot_id, host_name

if TYPE_CHECKING:
    from meter.sources.background import BackgroundRecording

DEFAULT_TOKENS = 64
DEFAULT_REPEATS = 3
DEFAULT_WARMUPS = 1
DEFAULT_IDLE_S = 10.0
DEFAULT_COOLDOWN_S = 5.0
DEFAULT_STALL_TIMEOUT_S = 600.0
CTX_ROUND = 256  # n_ctx is the longest prompt + N, rounded up to this (capped at the model's)


def default_threads() -> int:
    """CPU cores this process may use: the explicit default when --threads is not given."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


@dataclass
class RunSettings:
    """What `epi run` was asked to do (CLI options, unvalidated)."""

    model: Path
    out: Path
    prompts: Path | None = None
    tokens: int = DEFAULT_TOKENS
    repeats: int = DEFAULT_REPEATS
    warmups: int = DEFAULT_WARMUPS
    warmup_tokens: int | None = None  # tokens per warm-up request (None: `tokens`)
    threads: int | None = None
    workers: str | None = None
    split: str | None = None
    meter: str | None = None  # one meter daemon (the shorthand of `meters`)
    meters: tuple[str, ...] = ()  # every meter daemon, in order (several meters: docs/analysis.md)
    idle_s: float = DEFAULT_IDLE_S
    cooldown_s: float = DEFAULT_COOLDOWN_S
    seed: int = 0
    map_id: str | None = None
    stall_timeout_s: float = DEFAULT_STALL_TIMEOUT_S
    node: str | None = None  # this host's node name in placement (default: hostname)
    power: str | None = None  # software power sources to record into RUN_DIR/power
    decode_model: Path | None = None  # a split configuration: `model` prefills, this decodes


@dataclass
class Plan:
    """Validated settings plus everything derived from them before the run starts."""

    settings: RunSettings
    facts: ModelFacts
    prompt_set: PromptSet
    tokens_by_prompt: dict[str, list[int]]
    threads: int
    n_ctx: int
    endpoints: list[Endpoint] = field(default_factory=list)
    split: list[float] = field(default_factory=list)
    predicted: dict[str, list[int]] = field(default_factory=dict)
    decode_facts: ModelFacts | None = None  # a split configuration's decode map
    # a split's prefill map as its own manifest names it (`facts.map_id` is the run's label,
    # which a campaign sets to the split's configuration id)
    prefill_map_id: str | None = None


def warmup_tokens(s: RunSettings) -> int:
    """Tokens per warm-up request: `--warmup-tokens`, never more than `--tokens`."""
    return s.tokens if s.warmup_tokens is None else min(s.warmup_tokens, s.tokens)


def _check_numbers(s: RunSettings) -> None:
    checks: tuple[tuple[str, float, float], ...] = (
        ("--tokens", s.tokens, 1),
        ("--repeats", s.repeats, 1),
        ("--warmups", s.warmups, 0),
        ("--warmup-tokens", s.warmup_tokens if s.warmup_tokens is not None else 1, 1),
        ("--threads", s.threads if s.threads is not None else 1, 1),
    )
    for name, value, low in checks:
        if value < low:
            raise UserError(f"{name}: {value} is below the minimum {low}")
    for name, value in (("--idle-s", s.idle_s), ("--cooldown-s", s.cooldown_s)):
        if not value >= 0:
            raise UserError(f"{name}: {value} must be zero or more seconds")
    if not s.stall_timeout_s > 0:
        raise UserError(f"--stall-timeout-s: {s.stall_timeout_s} must be positive")


def plan_run(s: RunSettings) -> Plan:
    """Check every input; raise one-line UserErrors before anything is written.

    Cheap checks first (numbers, worker list, split), then the model header, the prompt set
    against the model's context and tokenizer, the split against the layer count, and last
    the workers themselves (RPC HELLO).
    """
    from host.cluster.placement import check_predicted, parse_split, predict_units
    from host.run.engine import tokenize_texts

    _check_numbers(s)
    endpoints = parse_workers(s.workers) if s.workers is not None else []
    split = parse_split(s.split, len(endpoints)) if endpoints or s.split is not None else []
    local = s.node or host_name()
    if any(ep.node == local for ep in endpoints):
        raise UserError(
            f"--workers: node name {local!r} is this host's (--node); name the worker NAME=h:p"
        )
    if (Path(s.out) / RUN_JSON).exists():
        raise UserError(f"{s.out}: already holds a token log (run.json); choose a new --out")
    facts = model_facts(s.model, s.map_id)
    decode_facts, prefill_map_id = None, None
    if s.decode_model is not None:
        from host.run.split import check_same_base, refuse_rpc

        refuse_rpc(len(endpoints))
        check_same_base(s.model, s.decode_model)
        decode_facts = model_facts(s.decode_model, None)
        prefill_map_id = model_facts(s.model, None).map_id if s.map_id else facts.map_id
    prompt_set = load_prompt_set(s.prompts)
    longest = max(prompt_set.prompts, key=lambda p: p.n_tokens)
    needed = longest.n_tokens + s.tokens
    if needed > facts.context_length:
        raise UserError(
            f"--tokens {s.tokens}: prompt {longest.id!r} ({longest.n_tokens} tokens) + "
            f"{s.tokens} generated = {needed} exceeds the context length {facts.context_length} "
            f"of {facts.path.name} ({facts.architecture}.context_length)"
        )
    n_ctx = min(facts.context_length, -(-needed // CTX_ROUND) * CTX_ROUND)
    predicted: dict[str, list[int]] = {}
    if endpoints:
        units = predict_units(facts.n_layers, split)
        predicted = {ep.node: u for ep, u in zip(endpoints, units, strict=True)}
        check_predicted(predicted, facts.n_layers, split)
    tokens_by_prompt = prompt_tokens(prompt_set, lambda texts: tokenize_texts(facts.path, texts))
    for ep in endpoints:
        probe(ep)
    return Plan(
        settings=s,
        facts=facts,
        prompt_set=prompt_set,
        tokens_by_prompt=tokens_by_prompt,
        threads=s.threads if s.threads is not None else default_threads(),
        n_ctx=n_ctx,
        endpoints=endpoints,
        split=split,
        predicted=predicted,
        decode_facts=decode_facts,
        prefill_map_id=prefill_map_id if decode_facts is not None else None,
    )


def _header_fields(plan: Plan) -> dict[str, object]:
    from host.llama.install import llama_info
    from host.run.cpu_features import cpu_features

    s, f = plan.settings, plan.facts
    info = llama_info()
    return {
        "model": {
            "path": str(f.path),
            "sha256": f.sha256,
            "map_id": f.map_id,
            "n_layers": f.n_layers,
            "n_params": f.n_params,
        },
        "llama_cpp": {
            "version": info["llama_cpp_python"],
            "build_flags": info["build_flags"],
            "cpu_features": cpu_features(),  # the build's next to the CPU's
            "rpc": bool(plan.endpoints),
        },
        "settings": {
            "threads": plan.threads,
            "threads_batch": plan.threads,
            "n_ctx": plan.n_ctx,
            "tokens_per_request": s.tokens,
            "repeats": s.repeats,
            "warmups": s.warmups,
            "warmup_tokens_per_request": warmup_tokens(s),
            "idle_s": s.idle_s,
            "cooldown_s": s.cooldown_s,
            "prompts_file": str(plan.prompt_set.path),
            "prompt_set_version": plan.prompt_set.version,
            "prompts_sha256": plan.prompt_set.sha256,
            "seed": s.seed,
            "sampling": "greedy",
            "eog_suppressed": None,
            "workers": [{"node": ep.node, "endpoint": ep.address} for ep in plan.endpoints],
            "split": plan.split or None,
        },
        **({} if plan.decode_facts is None else {"split": _split_header(plan)}),
        "placement": [],
        "host": host_name(),
        "node": s.node or host_name(),
        "boot_id": boot_id(),
        "clock_sync": [],
        "clock_drift_ppm": None,
        "started_mono_ns": time.monotonic_ns(),
        "started_real_ns": time.time_ns(),
        "error": None,
    }


def _split_header(plan: Plan) -> dict[str, object]:
    """run.json `split`: which GGUF ran which phase (the `model` block is the prefill one)."""
    d = plan.decode_facts
    assert d is not None
    f = plan.facts
    return {
        "prefill": {"path": str(f.path), "sha256": f.sha256,
                    "map_id": plan.prefill_map_id or f.map_id},
        "decode": {"path": str(d.path), "sha256": d.sha256, "map_id": d.map_id},
        "handover": "llama_state_seq_get_data/llama_state_seq_set_data",
    }


def meter_urls(s: RunSettings) -> list[str]:
    """Every meter daemon the run syncs clocks with, in order, each once (`meter`, then
    `meters`): the token log's `meters` list takes this order, and `epi analyze` pairs the
    k-th `--trace` with the k-th."""
    return list(dict.fromkeys([*([s.meter] if s.meter else []), *s.meters]))


def sync_all(header: RunHeader, sync: Callable[[str], Mapping[str, object]], urls: list[str],
             when: str) -> None:
    """One clock-sync estimate per meter daemon, each recorded with its `meter_url`."""
    for url in urls:
        header.add_clock_sync({**sync(url), "meter_url": url}, when)


def _default_clock_sync(url: str) -> Mapping[str, object]:
    from epi.core.clocksync import estimate_offset

    return estimate_offset(url).as_dict()


def describe_placement(placement: list[PlacementEntry]) -> list[str]:
    """One line per node: which layers (and non-layer tensors) it holds."""
    lines = []
    for e in placement:
        where = f" ({e['endpoint']})" if e["endpoint"] else " (local)"
        extra = f" + {', '.join(e['extra_tensors'])}" if e["extra_tensors"] else ""
        lines.append(
            f"{e['node']}{where}: layers {ranges_text(e['layers'], empty='none')}{extra}, "
            f"{e['weights_mib']:.1f} MiB of weights"
        )
    return lines


def _abort_reason(run_dir: Path) -> str | None:
    """The last abort/error line llama.cpp wrote to the child's log, if any."""
    try:
        lines = (run_dir / LLAMA_LOG).read_text(errors="replace").splitlines()[-200:]
    except OSError:
        return None
    for line in reversed(lines):
        m = re.search(r"\.(?:c|cpp|h):\d+: (.*\S)", line)
        if m:
            return m.group(1)
    return None


def _start_child(job: Job, log_path: Path) -> tuple[subprocess.Popen[bytes], Connection]:
    """Start `python -m host.run.child FD` with its output in `log_path`; send it the job."""
    parent_sock, child_sock = socket.socketpair()
    child_fd = child_sock.fileno()
    try:
        with open(log_path, "ab") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "host.run.child", str(child_fd)],
                pass_fds=[child_fd],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
    finally:
        child_sock.close()
    conn = Connection(parent_sock.detach())
    conn.send(dataclasses.asdict(job))
    return proc, conn


def _wait(proc: subprocess.Popen[bytes], timeout_s: float) -> None:
    """Wait for the child to exit; kill it if it does not within `timeout_s`."""
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _child_death_reason(
    proc: subprocess.Popen[bytes], run_dir: Path, endpoints: list[Endpoint]
) -> str:
    code = proc.returncode
    if code is not None and code < 0:
        try:
            how = f"killed by {signal.Signals(-code).name}"
        except ValueError:
            how = f"killed by signal {-code}"
    else:
        how = f"exited with code {code}"
    parts = [f"inference process {how}"]
    reason = _abort_reason(run_dir)
    if reason:
        parts.append(f"llama.cpp: {reason}")
    dead = []
    for ep in endpoints:
        try:
            probe(ep, timeout_s=2.0)
        except UserError:
            dead.append(f"{ep.address} (node {ep.node})")
    if dead:
        parts.append(f"worker {', '.join(dead)} no longer answers")
    return "; ".join(parts) + "; nothing was retried"


@dataclass
class RunResult:
    """Where the log went and the headline figures of the measured requests."""

    run_dir: Path
    n_requests: int
    n_measured: int
    prefill_ms_median: float | None
    decode_tok_s_median: float | None
    placement: list[PlacementEntry]


def _plural(n: int, one: str, many: str | None = None) -> str:
    return f"{n} {one if n == 1 else (many or one + 's')}"


def _echo_stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def run(
    settings: RunSettings,
    *,
    echo: Callable[[str], None] = _echo_stderr,
    clock_sync: Callable[[str], Mapping[str, object]] | None = None,
    on_message: Callable[[msg.ChildMessage], None] | None = None,
) -> RunResult:
    """Plan, then run with the inference child; raise RunFailed when the run fails.

    `clock_sync(url)` returns one estimate as a dict (epi.core.clocksync by default);
    `on_message(message)` sees every message record from the child (tests use it).
    """
    plan = plan_run(settings)
    sync = clock_sync or _default_clock_sync
    meters = meter_urls(settings)
    # every meter first (an unreachable one stops the run before a log is made)
    start_syncs = [{**sync(url), "meter_url": url} for url in meters]
    f = plan.facts
    n_prompts = len(plan.prompt_set.prompts)
    echo(
        f"epi run: {f.path.name} ({f.n_layers} layers, sha256 {f.sha256[:12]}), "
        f"{_plural(n_prompts, 'prompt')} x {_plural(settings.repeats, 'repeat')} + "
        f"{_plural(settings.warmups, 'warm-up pass', 'warm-up passes')}"
        + (f" of {warmup_tokens(settings)} tokens" if settings.warmups
           and warmup_tokens(settings) != settings.tokens else "")
        + ", "
        f"{settings.tokens} tokens each, {_plural(plan.threads, 'thread')}"
        + (f", workers {', '.join(e.address for e in plan.endpoints)}" if plan.endpoints else "")
    )
    power = _open_power(settings, echo)  # before the log: an unreadable source stops us here
    header = RunHeader.create(settings.out, _header_fields(plan))
    for entry in start_syncs:
        header.add_clock_sync(entry, "start")
    follow = MeterFollow(meters, echo)
    follow.start()
    try:
        if power is not None:
            power.start(header.run_dir / "power", header.text("node"))
            header.update(power_trace="power")
        try:
            return _supervise(plan, header, echo, sync, on_message)
        finally:
            if power is not None:
                power.stop()
    except RunFailed:
        raise
    except KeyboardInterrupt:
        header.finish(RunStatus.FAILED, "interrupted by the user")
        raise
    except Exception as exc:  # e.g. a clock sync that fails mid-run: the log says why
        header.finish(RunStatus.FAILED, str(exc) if isinstance(exc, UserError) else repr(exc))
        raise
    finally:
        follow.stop()


def _open_power(settings: RunSettings, echo: Callable[[str], None]
                ) -> BackgroundRecording | None:
    """`--power SPEC`: the software sources, recorded beside the run (meter/sources)."""
    if not settings.power:
        return None
    from meter.sources.background import BackgroundRecording

    return BackgroundRecording(settings.power, log=echo)


def _supervise(
    plan: Plan,
    header: RunHeader,
    echo: Callable[[str], None],
    sync: Callable[[str], Mapping[str, object]],
    on_message: Callable[[msg.ChildMessage], None] | None,
) -> RunResult:
    s = plan.settings
    meters = meter_urls(s)
    job = Job(
        model=str(plan.facts.path),
        run_dir=str(header.run_dir),
        node=header.text("node"),
        threads=plan.threads,
        n_ctx=plan.n_ctx,
        seed=s.seed,
        n_layers=plan.facts.n_layers,
        prompts=tuple((p.id, tuple(plan.tokens_by_prompt[p.id])) for p in plan.prompt_set.prompts),
        tokens=s.tokens,
        repeats=s.repeats,
        warmups=s.warmups,
        warmup_tokens=warmup_tokens(s),
        idle_s=s.idle_s,
        cooldown_s=s.cooldown_s,
        workers=tuple((e.host, e.port, e.node) for e in plan.endpoints),
        split=tuple(plan.split),
        predicted=plan.predicted,
        decode_model=str(plan.decode_facts.path) if plan.decode_facts else "",
    )
    proc, conn = _start_child(job, header.run_dir / LLAMA_LOG)
    n_prompts = len(job.prompts)
    measured: list[msg.Request] = []
    placement: list[PlacementEntry] = []
    n_requests = 0
    wait_s = s.stall_timeout_s
    error: str | None = None
    try:
        while True:
            if not conn.poll(wait_s):
                proc.kill()
                proc.wait()
                error = (
                    f"no progress from the inference process for {wait_s:.0f} s (a worker "
                    "hung or the machine is overloaded); stopped it, nothing was retried"
                )
                break
            try:
                message: msg.ChildMessage = conn.recv()
            except (EOFError, ConnectionResetError):
                _wait(proc, 10)
                error = _child_death_reason(proc, header.run_dir, plan.endpoints)
                break
            if on_message is not None:
                on_message(message)
            wait_s = s.stall_timeout_s
            match message:
                case msg.Loaded():
                    placement = message.placement
                    settings = dict(header.settings(), eog_suppressed=message.eog_ids)
                    header.update(placement=placement, settings=settings)
                    if message.resident_bytes:  # a split: both models and KV caches resident
                        mib = message.resident_bytes / 2**20
                        header.update(split={**cast(dict[str, object], header.data["split"]),
                                             "resident_mib": round(mib, 1)})
                        echo(f"split: prefill and decode models resident together, "
                             f"{mib:.1f} MiB of weights and KV caches")
                    echo(f"loaded in {message.load_s:.1f} s; placement:")
                    for line in describe_placement(placement):
                        echo(f"  {line}")
                case msg.Cooldown(repeat=r):
                    if meters and r > 0:
                        try:
                            sync_all(header, sync, meters, "during")
                        except UserError as exc:
                            error = f"clock sync before repeat {r + 1} failed: {exc}"
                            break
                    echo(
                        f"repeat {r + 1}/{s.repeats}: cool-down {s.cooldown_s:g} s, "
                        f"idle baseline {s.idle_s:g} s"
                    )
                    conn.send(msg.Go())
                    wait_s = s.cooldown_s + s.idle_s + s.stall_timeout_s
                case msg.Idle():
                    wait_s = s.idle_s + s.stall_timeout_s
                case msg.Request():
                    n_requests += 1
                    if not message.warmup:
                        measured.append(message)
                    echo(_request_line(message, n_prompts, s.repeats, s.warmups))
                case msg.Error():
                    error = message.message
                    _wait(proc, 30)
                    break
                case msg.Done():
                    _wait(proc, 30)
                    break
    finally:
        conn.close()
        if proc.poll() is None:  # leaving early (interrupt, failed clock sync): stop it
            proc.kill()
            proc.wait()
    if meters:
        try:
            sync_all(header, sync, meters, "end")
        except UserError as exc:
            if error is None:
                error = f"end-of-run clock sync failed: {exc}"
    header.update(ended_mono_ns=time.monotonic_ns(), ended_real_ns=time.time_ns())
    if error is not None:
        header.finish(RunStatus.FAILED, error)
        raise RunFailed(f"{error} (token log {header.run_dir}: status failed)")
    header.finish(RunStatus.COMPLETED)
    prefill = [m.prefill_ms for m in measured]
    decode = [
        (m.n_generated_tokens - 1) / (m.decode_ns / 1e9)
        for m in measured
        if m.n_generated_tokens > 1 and m.decode_ns > 0
    ]
    return RunResult(
        run_dir=header.run_dir,
        n_requests=n_requests,
        n_measured=len(measured),
        prefill_ms_median=statistics.median(prefill) if prefill else None,
        decode_tok_s_median=statistics.median(decode) if decode else None,
        placement=placement,
    )


def _request_line(p: msg.Request, n_prompts: int, repeats: int, warmups: int) -> str:
    idx = p.request_id % n_prompts + 1
    if p.warmup:
        what = f"warm-up {p.repeat + warmups + 1}/{warmups}"
    else:
        what = f"repeat {p.repeat + 1}/{repeats}"
    n = p.n_generated_tokens
    decode = (n - 1) / (p.decode_ns / 1e9) if n > 1 and p.decode_ns > 0 else float("nan")
    return (
        f"  {what} [{idx}/{n_prompts}] {p.prompt_id}: {p.n_prompt_tokens}+{n} tokens, "
        f"prefill {p.prefill_ms:.1f} ms, decode {decode:.1f} tok/s"
    )
