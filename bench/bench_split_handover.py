"""Handover time of a split configuration per request, as a share of prefill time.

A split configuration (host/run/split.py) prefills on one map, hands the sequence's state to
the decode model (llama_state_seq_get_data → llama_state_seq_set_data) and decodes there. The
handover is extra work a request pays; this bench measures it where it matters, beside the
prefill it follows, at 256 and 2,048 context tokens.

Each round runs `timed_split_request` (the runner's own loop) once per context length and reads
its stamps: prefill = request start → token 0, handover = handover_start → handover_end. The
figure is the median over rounds of handover / prefill; the state's size is printed too.

Usage: `python bench/bench_split_handover.py [--prefill M.gguf --decode N.gguf] [--rounds 3]
[--threads 2]` (default: SmolLM2-135M's F16 base prefills and its Q4_1 GGUF decodes, as
`epi model prepare smollm2` leaves them).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchlib import emit, machine_line

CONTEXTS = (256, 2048)
KEYS = {256: "split_handover_share_of_prefill_256", 2048: "split_handover_share_of_prefill_2048"}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--prefill", type=Path, default=None)
    ap.add_argument("--decode", type=Path, default=None)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=4)
    args = ap.parse_args()
    print(machine_line("bench_split_handover.py"), flush=True)

    from host.run.split import load_split, timed_split_request

    prefill, decode = args.prefill, args.decode
    if prefill is None or decode is None:
        from host.quant.models import prepare_model

        path = prepare_model("smollm2").path
        assert path is not None
        prefill = Path(path)
        decode = prefill.parent / "SmolLM2-135M-Instruct.Q4_1.gguf"
    n_ctx = max(CONTEXTS) + 256
    models = load_split(prefill, decode, threads=args.threads, n_ctx=n_ctx)
    print(f"prefill {prefill.name}, decode {decode.name}; both resident: "
          f"{models.resident_bytes / 2**20:.1f} MiB (weights + two KV caches of {n_ctx} cells)")
    n_vocab = models.prefill.llm.n_vocab()
    for n in CONTEXTS:
        prompt = [1 + (7919 * i) % (n_vocab - 1) for i in range(n)]
        timed_split_request(models, prompt, args.tokens)  # warm-up
        shares, hand_ms, pre_ms = [], [], []
        state_bytes = 0
        for _ in range(args.rounds):
            t = timed_split_request(models, prompt, args.tokens)
            p = t.token_mono_ns[0] - t.t_start_mono_ns
            h = t.t_handover_end_mono_ns - t.t_handover_start_mono_ns
            shares.append(h / p)
            hand_ms.append(h / 1e6)
            pre_ms.append(p / 1e6)
            state_bytes = t.state_bytes
        share = statistics.median(shares)
        print(f"{n:5d} context tokens: prefill {statistics.median(pre_ms):9.1f} ms, handover "
              f"{statistics.median(hand_ms):7.2f} ms ({state_bytes / 2**20:.1f} MiB of state), "
              f"share {share:.4f} (median of {args.rounds})")
        emit(KEYS[n], share, len(shares), [min(shares), max(shares)],
             f"{prefill.name} → {decode.name}, {args.threads} thread(s); spread = min-max")
    return 0


if __name__ == "__main__":
    sys.exit(main())
