"""The inference process of `epi run`: loads the model, runs warm-ups, idle windows and requests.

It runs as a child process of `epi run` (`python -m host.run.child FD`) because llama.cpp
aborts the whole process when an RPC worker dies or a backend crashes; the parent survives,
marks the run failed and keeps the log valid. Parent and child talk over a socket pair
(multiprocessing Connection on the inherited FD); the first message is the Job as a dict.

The child appends events.csv/requests.csv itself (rows written and flushed once per request,
after its last token — never inside the timed loop) and reports to the parent: placement after
loading, each phase, each finished request. Its stdout and stderr (llama.cpp's log, any abort
message and backtrace) go to RUN_DIR/llama.log (set by the parent).

Messages to the parent are the records of host/run/messages.py: `Loaded`, `Cooldown` — then
the child waits for `Go` so the parent can sync clocks before the cool-down —, `Idle`,
`Request`, `Done`, or `Error` with one line.
"""

from __future__ import annotations

import sys
import time
import traceback
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import TYPE_CHECKING

from epi.core.errors import UserError
from host.cluster.placement import PlacementEntry
from host.run import messages as msg

if TYPE_CHECKING:
    from host.run.engine import LoadedModel, Timing

LLAMA_LOG = "llama.log"


@dataclass(frozen=True)
class Job:
    """Everything the child needs; built and validated by the parent (host.run.runner)."""

    model: str
    run_dir: str
    node: str
    threads: int
    n_ctx: int
    seed: int
    n_layers: int
    prompts: tuple[tuple[str, tuple[int, ...]], ...]  # (prompt id, token ids)
    tokens: int
    repeats: int
    warmups: int
    idle_s: float
    cooldown_s: float
    workers: tuple[tuple[str, int, str], ...]  # (host, port, node)
    split: tuple[float, ...]
    predicted: dict[str, list[int]]  # worker node → units llama.cpp should give it
    decode_model: str = ""  # a split configuration's decode GGUF (host/run/split.py)
    warmup_tokens: int = 0  # tokens per warm-up request (0: `tokens`)


def child_main(conn: Connection, job: Job) -> None:
    """Entry point of the inference process (see the module docstring)."""
    run_dir = Path(job.run_dir)
    try:
        _run(conn, job, run_dir)
    except UserError as exc:
        conn.send(msg.Error(str(exc)))
    except Exception as exc:  # a bug or llama.cpp error: report it, keep the traceback
        traceback.print_exc()
        conn.send(msg.Error(f"{type(exc).__name__}: {exc} (traceback in {run_dir / LLAMA_LOG})"))
    finally:
        conn.close()


def _load(job: Job, run_dir: Path) -> tuple[LoadedModel, list[PlacementEntry], int]:
    from host.cluster.placement import check_placement, placement_from_log
    from host.cluster.rpc import Endpoint, attach
    from host.run.engine import load_model

    endpoints = [Endpoint(h, p, n) for h, p, n in job.workers]
    devices = attach(endpoints) if endpoints else {}
    loaded = load_model(
        Path(job.model),
        threads=job.threads,
        n_ctx=job.n_ctx,
        seed=job.seed,
        n_gpu_layers=job.n_layers + 1 if endpoints else 0,
        tensor_split=list(job.split) if endpoints else None,
        log_path=run_dir / LLAMA_LOG,
    )
    placement = placement_from_log(loaded.load_log, job.n_layers, job.node, devices)
    if endpoints:
        check_placement(placement, job.predicted, job.n_layers)
    return loaded, placement, loaded.n_params


def _run(conn: Connection, job: Job, run_dir: Path) -> None:
    from host.run.engine import timed_request
    from host.run.perf_log import PerfLog
    from host.run.tokenlog import CsvAppender, RequestRecord

    t0 = time.monotonic()
    loaded, placement, n_params = _load(job, run_dir)
    split = None
    if job.decode_model:
        from host.run.split import load_split

        # both resident: the prefill model just loaded, the decode model beside it
        split = load_split(Path(job.model), Path(job.decode_model), threads=job.threads,
                           n_ctx=job.n_ctx, seed=job.seed, log_path=run_dir / LLAMA_LOG,
                           prefill_loaded=loaded)
    conn.send(msg.Loaded(placement=placement, n_params=n_params, eog_ids=loaded.eog_ids,
                         load_s=time.monotonic() - t0,
                         resident_bytes=split.resident_bytes if split else 0))
    llm = loaded.llm
    log = CsvAppender(run_dir)
    perf = PerfLog(run_dir)
    request_id = 0

    def one_request(repeat: int, warmup: bool, prompt_id: str, tokens: tuple[int, ...]) -> None:
        n_generate = job.warmup_tokens if warmup and job.warmup_tokens else job.tokens
        nonlocal request_id
        handover = None
        t: Timing
        counters = perf.counters()
        if split is not None:
            from host.run.split import timed_split_request

            st = timed_split_request(split, list(tokens), n_generate, counters)
            t = st
            handover = (st.t_handover_start_mono_ns, st.t_handover_start_real_ns,
                        st.t_handover_end_mono_ns, st.t_handover_end_real_ns)
        else:
            t = timed_request(llm, list(tokens), n_generate, counters)
        perf.write(request_id, counters)
        rec = RequestRecord(
            request_id=request_id,
            repeat=repeat,
            warmup=warmup,
            prompt_id=prompt_id,
            n_prompt_tokens=len(tokens),
            t_start_mono_ns=t.t_start_mono_ns,
            t_start_real_ns=t.t_start_real_ns,
            token_ids=t.token_ids,
            token_mono_ns=t.token_mono_ns,
            token_real_ns=t.token_real_ns,
            t_end_mono_ns=t.t_end_mono_ns,
            t_end_real_ns=t.t_end_real_ns,
            node=job.node,
            handover_ns=handover,
        )
        log.write_request(rec)
        conn.send(msg.Request(
            request_id=request_id,
            repeat=repeat,
            warmup=warmup,
            prompt_id=prompt_id,
            n_prompt_tokens=len(tokens),
            n_generated_tokens=len(t.token_ids),
            prefill_ms=(t.token_mono_ns[0] - t.t_start_mono_ns) / 1e6,
            decode_ns=t.token_mono_ns[-1] - t.token_mono_ns[0],
            total_ms=(t.t_end_mono_ns - t.t_start_mono_ns) / 1e6,
        ))
        request_id += 1

    try:
        for w in range(-job.warmups, 0):
            for pid, toks in job.prompts:
                one_request(w, True, pid, toks)
        for r in range(job.repeats):
            conn.send(msg.Cooldown(r))
            reply = conn.recv()
            if not isinstance(reply, msg.Go):
                raise RuntimeError(f"unexpected message from epi run: {reply!r}")
            time.sleep(job.cooldown_s)
            conn.send(msg.Idle(repeat=r, seconds=job.idle_s))
            start = (time.monotonic_ns(), time.time_ns())
            time.sleep(job.idle_s)
            end = (time.monotonic_ns(), time.time_ns())
            log.write_idle(r, start, end)
            for pid, toks in job.prompts:
                one_request(r, False, pid, toks)
    finally:
        log.close()
    conn.send(msg.Done(requests=request_id))


def main(argv: list[str]) -> int:
    """`python -m host.run.child FD`: receive the Job on FD, run it."""
    conn = Connection(int(argv[1]))
    data = conn.recv()
    try:
        job = Job(**data)
    except TypeError as exc:
        conn.send(msg.Error(f"epi run sent an invalid job ({exc})"))
        return 2
    child_main(conn, job)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
