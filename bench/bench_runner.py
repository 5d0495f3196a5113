"""Tokens/s of the epi runner's request loop (all logging) vs a bare llama-cpp-python loop.

Both sides run in this one process on the same model file, the same threads and the same
prompts, in pairs (each prompt on both sides back to back, order alternating) so machine noise
hits both alike; the ratio is the median over pairs:

- bare: a plain `llama_cpp.Llama`; `llm.reset()`, then `llm.generate(prompt, temp=0)` until N
  tokens — what anyone would write.
- epi:  `host.run.engine.timed_request` (EOG-suppressing greedy sampler, CLOCK_MONOTONIC and
  CLOCK_REALTIME stamps per token) plus writing every request to a real token log
  (`host.run.tokenlog.CsvAppender`: events.csv and requests.csv, flushed per request).

Prints tokens/s of each (generated tokens over wall time, prefill included), the ratio
epi / bare per pair (median and interquartile range; goal ≥ 0.99), and the per-token cost of
the timestamping itself measured in a tight loop, and of writing one request to the log.

Usage: `python bench/bench_runner.py [--model M.gguf] [--tokens 64] [--rounds 5]` (default
model: the 8-layer test model, written to a temporary directory).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchlib import emit, machine_line


def stamp_overhead_us(n: int = 200_000) -> float:
    """µs per token of the runner's per-token work: two clock reads and three list stores."""
    mono, real = time.monotonic_ns, time.time_ns
    ids = [0] * n
    monos = [0] * n
    reals = [0] * n
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter_ns()
        for i in range(n):
            monos[i] = mono()
            reals[i] = real()
            ids[i] = i
        t1 = time.perf_counter_ns()
        for i in range(n):
            ids[i] = i
        t2 = time.perf_counter_ns()
        best = min(best, ((t1 - t0) - (t2 - t1)) / n / 1000)
    return best


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", type=Path, default=None)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    print(machine_line("bench_runner.py"), flush=True)

    from llama_cpp import Llama

    from host.run.engine import load_model, timed_request, tokenize_texts
    from host.run.prompts import load_prompt_set, prompt_tokens
    from host.run.tokenlog import CsvAppender, RequestRecord, RunHeader

    with tempfile.TemporaryDirectory() as tmp:
        model = args.model
        if model is None:
            from host.quant.tiny_model import write_test_model

            model = write_test_model(Path(tmp) / "tiny.gguf")
        ps = load_prompt_set()
        prompts = list(prompt_tokens(ps, lambda texts: tokenize_texts(model, texts)).items())
        n_ctx = 512 if ps.max_tokens + args.tokens <= 512 else 1024
        epi = load_model(model, threads=args.threads, n_ctx=n_ctx)
        bare = Llama(
            str(model),
            n_ctx=n_ctx,
            n_threads=args.threads,
            n_threads_batch=args.threads,
            n_gpu_layers=0,
            verbose=False,
        )
        header = RunHeader.create(Path(tmp) / "log", {"placement": []})
        log = CsvAppender(header.run_dir)

        def run_bare(prompt: list[int]) -> list[int]:
            bare.reset()
            out: list[int] = []
            for tok in bare.generate(prompt, temp=0.0):
                out.append(tok)
                if len(out) == args.tokens:
                    break
            return out

        request_id = 0
        write_ns: list[int] = []

        def run_epi(pid: str, prompt: list[int]) -> list[int]:
            nonlocal request_id
            t = timed_request(epi.llm, prompt, args.tokens)
            w0 = time.perf_counter_ns()
            log.write_request(
                RequestRecord(
                    request_id,
                    0,
                    False,
                    pid,
                    len(prompt),
                    t.t_start_mono_ns,
                    t.t_start_real_ns,
                    t.token_ids,
                    t.token_mono_ns,
                    t.token_real_ns,
                    t.t_end_mono_ns,
                    t.t_end_real_ns,
                    "bench",
                )
            )
            write_ns.append(time.perf_counter_ns() - w0)
            request_id += 1
            return t.token_ids

        same = True  # warm-up both sides, and compare their greedy tokens
        for pid, prompt in prompts:
            same &= run_bare(prompt) == run_epi(pid, prompt)
        # Paired design: each prompt runs on both sides back to back (order alternating), so
        # the two runs of a pair see the same machine load; the ratio is taken per pair.
        bare_s: list[float] = []
        epi_s: list[float] = []
        for r in range(args.rounds):
            for k, (pid, prompt) in enumerate(prompts):
                sides = ("bare", "epi") if (r + k) % 2 == 0 else ("epi", "bare")
                for side in sides:
                    t0 = time.perf_counter()
                    if side == "bare":
                        run_bare(prompt)
                    else:
                        run_epi(pid, prompt)
                    (bare_s if side == "bare" else epi_s).append(time.perf_counter() - t0)
        log.close()

    bare_tps = args.tokens * len(bare_s) / sum(bare_s)
    epi_tps = args.tokens * len(epi_s) / sum(epi_s)
    ratios = sorted(b / e for b, e in zip(bare_s, epi_s, strict=True))  # time ratio = tok/s ratio
    q1, q3 = ratios[len(ratios) // 4], ratios[(3 * len(ratios)) // 4]
    print(
        f"model {model.name}, {len(prompts)} prompts x {args.tokens} tokens, "
        f"{args.threads} thread(s), {args.rounds} rounds of paired requests"
    )
    print(f"bare llama-cpp-python loop : {bare_tps:8.1f} tok/s (all pairs, prefill included)")
    print(f"epi runner, all logging    : {epi_tps:8.1f} tok/s")
    print(
        f"ratio epi / bare           : {statistics.median(ratios):8.3f} (median of "
        f"{len(ratios)} pairs; IQR {q1:.3f}-{q3:.3f}; goal >= 0.99)"
    )
    print(f"timestamping per token     : {stamp_overhead_us():8.3f} us (2 clock reads + stores)")
    print(
        f"token-log write per request: {statistics.median(write_ns) / 1000:8.1f} us "
        f"(median; {args.tokens + 2} events + 1 summary row, flushed)"
    )
    print(f"same tokens as bare greedy : {same} (differs only where EOS would have won)")
    emit("runner_vs_bare_llama_cpp", statistics.median(ratios), len(ratios), [q1, q3],
         f"{len(prompts)} prompts x {args.tokens} tokens, {args.threads} thread(s); spread = IQR")
    return 0


if __name__ == "__main__":
    sys.exit(main())
