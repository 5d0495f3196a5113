"""Seconds per item of epi's HellaSwag scoring and per window of its perplexity, against
llama-perplexity's, on the same basis, side by side in one run.

    .venv/bin/python bench/bench_accuracy.py [MODEL.gguf] [--n 16] [--windows 4] [--repeats 3]

Basis: both sides are timed from model load to result at N and at 2N items (W and 2W
perplexity windows), and the per-item time is the difference over N: process start, model
load and tokenizer set-up cancel on both sides. epi runs in this process (a fresh `Scorer`
per timing), llama-perplexity as a subprocess; the four timings of a round are interleaved
(ours N, theirs N, ours 2N, theirs 2N, order alternating between rounds) so machine load hits
both alike, and the ratio is taken per round: median and [min-max] over `--repeats` rounds.

The accuracies (epi's accuracy_token_norm, llama-perplexity's per-token-mean ranking) and
perplexities of the 2N run are printed next to the times, so the agreement is visible in the
same run. MODEL defaults to the prepared SmolLM2 F16 base (`epi model prepare smollm2`), else
a freshly written tiny test model. HellaSwag and LAMBADA need `epi data prepare`.
"""

from __future__ import annotations

import argparse
import resource
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchlib import emit, machine_line, summary

from host.accuracy import crosscheck, evaldata, window_context
from host.accuracy import multiple_choice as mc
from host.accuracy import perplexity as ppl
from host.accuracy.readers import load_items
from host.accuracy.scorer import Scorer
from host.accuracy.subset import take_subset


def default_model(tmp: Path) -> Path:
    from host.quant.models import model_path

    f16 = model_path("smollm2")
    if f16.is_file():
        return f16
    from host.quant.tiny_model import write_test_model

    return write_test_model(tmp / "tiny.gguf")


def _cpu_s() -> float:
    """CPU seconds of this process (all its threads) and of its finished children."""
    me = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def timed(fn: Callable[[], dict]) -> tuple[float, float, dict]:
    """(wall s, CPU s, result) of one call."""
    c0, t0 = _cpu_s(), time.monotonic()
    out = fn()
    return time.monotonic() - t0, _cpu_s() - c0, out


# (ours s/unit, theirs s/unit, CPU-time ratio or None, ours 2N wall s) of one round
Row = tuple[float, float, float | None, float]

NOISE = "; rounds where t(2N) <= t(N) (load noise larger than the work) are left out"


def ratio(ours: float, theirs: float) -> float | None:
    """ours / theirs, None where either difference is not positive (noise beat the work)."""
    return ours / theirs if ours > 0 and theirs > 0 else None


def valid_summary(values: list[float | None]) -> tuple[float | None, list[float] | None]:
    """Median and [min, max] of the valid rounds; (None, None) when no round is valid."""
    good = [v for v in values if v is not None]
    return summary(good) if good else (None, None)


def valid(values: list[float | None]) -> int:
    """Rounds behind a figure."""
    return sum(v is not None for v in values)


def fmt(value: float | None, spread: list[float] | None) -> str:
    if value is None or spread is None:
        return "not measurable (every round's difference was swamped by noise)"
    return f"{value:.2f} [{spread[0]:.2f}-{spread[1]:.2f}]"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", nargs="?", type=Path)
    ap.add_argument("--n", type=int, default=16, help="HellaSwag items N (also timed at 2N)")
    ap.add_argument("--windows", type=int, default=4, help="perplexity windows W (and 2W)")
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--ppl-batch", type=int, default=None,
                    help="perplexity tokens per decode for both tools (default: "
                    "llama-perplexity's 2048, n_batch / n_ctx windows per decode, on both)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3, help="rounds (median and spread)")
    ap.add_argument("--only", choices=("mc", "ppl"), help="time one of the two (default both)")
    ap.add_argument("--pack", action="store_true",
                    help="epi packs consecutive items into one batch (mc.score_items pack=True)")
    args = ap.parse_args()
    print(machine_line("bench_accuracy.py"), flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        model = args.model or default_model(Path(tmp))
        print(f"model {model}  threads {args.threads}  ctx {args.ctx}  N {args.n}  "
              f"W {args.windows}  rounds {args.repeats}", flush=True)
        root = evaldata.data_dir()
        files, _ = evaldata.benchmark_files(root, "hellaswag")
        all_items = load_items("hellaswag", files)
        subsets = {k: take_subset(all_items, k * args.n, 0) for k in (1, 2)}
        text_path, _ = evaldata.text_file(root, "lambada")

        def ours_mc(k: int) -> dict:
            with Scorer(model, args.ctx, args.threads) as scorer:
                return mc.summarize(mc.score_items(scorer, subsets[k], pack=args.pack))

        def theirs_mc(k: int) -> dict:
            out = crosscheck.hellaswag(model, subsets[k], args.ctx, args.threads)
            if not out.get("ok"):
                sys.exit(f"llama-perplexity failed: {out.get('reason')}")
            return out

        def ours_ppl(k: int) -> dict:
            with Scorer(model, args.ctx, args.threads) as scorer:
                tokens = scorer.tokenize(ppl.read_text(text_path))
                return ppl.perplexity_tokens(scorer, tokens, args.ctx, args.ctx,
                                             k * args.windows,
                                             batch_tokens=args.ppl_batch
                                             or window_context.DEFAULT_BATCH_TOKENS)

        def theirs_ppl(k: int) -> dict:
            # at llama-perplexity's own default batch (2048: n_batch / n_ctx chunks per
            # decode) unless --ppl-batch names one
            out = crosscheck.perplexity(model, text_path, args.ctx, k * args.windows,
                                        args.threads, batch=args.ppl_batch)
            if not out.get("ok"):
                sys.exit(f"llama-perplexity failed: {out.get('reason')}")
            return out

        # One untimed pass of each side first: the first model load of a session reads the
        # file into the page cache and pays one-time start-up, which otherwise lands in
        # round 1's first timing (t(N) > t(2N) was seen on an idle machine, 2026-11-27).
        for what, sides in (("mc", (ours_mc, theirs_mc)), ("ppl", (ours_ppl, theirs_ppl))):
            if args.only in (None, what):
                for fn in sides:
                    fn(1)
        print("warm-up done (one untimed N pass of each side)", flush=True)
        mc_rows: list[Row] = []
        ppl_rows: list[Row] = []
        last: dict[str, dict] = {}
        for r in range(args.repeats):
            for what, sides, rows, per in (
                ("mc", (ours_mc, theirs_mc), mc_rows, args.n),
                ("ppl", (ours_ppl, theirs_ppl), ppl_rows, args.windows),
            ):
                if args.only not in (None, what):
                    continue
                t: dict[tuple[str, int], float] = {}
                cpu: dict[tuple[str, int], float] = {}
                order = ("ours", "theirs") if r % 2 == 0 else ("theirs", "ours")
                for k in (1, 2):
                    for side in order:
                        fn = sides[0] if side == "ours" else sides[1]
                        t[side, k], cpu[side, k], last[f"{what}-{side}-{k}"] = timed(
                            lambda fn=fn, k=k: fn(k))
                ours_s = (t["ours", 2] - t["ours", 1]) / per
                theirs_s = (t["theirs", 2] - t["theirs", 1]) / per
                cpu_ratio = ratio(cpu["ours", 2] - cpu["ours", 1],
                                  cpu["theirs", 2] - cpu["theirs", 1])
                rows.append((ours_s, theirs_s, cpu_ratio, t["ours", 2]))
                unit = "item" if what == "mc" else "window"
                print(f"round {r + 1} {what}: ours {ours_s:.3f} s/{unit}, llama-perplexity "
                      f"{theirs_s:.3f} s/{unit} (2N runs incl. load: ours {t['ours', 2]:.1f} s,"
                      f" theirs {t['theirs', 2]:.1f} s); CPU-time ratio ours/theirs "
                      f"{cpu_ratio if cpu_ratio is None else round(cpu_ratio, 2)}", flush=True)

    if args.only != "ppl":
        report_mc(args, mc_rows, last)
    if args.only != "mc":
        report_ppl(args, ppl_rows, last)


def report_mc(args: argparse.Namespace, mc_rows: list[Row], last: dict[str, dict]) -> None:
    """Print and emit the HellaSwag figures."""
    ours_acc = last["mc-ours-2"]["accuracy_token_norm"]
    theirs_acc = last["mc-theirs-2"]["accuracy"]
    n2 = 2 * args.n
    mc_ratios = [ratio(o, t) for o, t, _, _ in mc_rows]
    mc_ratio, mc_spread = valid_summary(mc_ratios)
    print(f"hellaswag (N={args.n}, 2N={n2}; per item = (t(2N) - t(N)) / N, load excluded on "
          f"both sides): ours {summary([o for o, *_ in mc_rows])[0]:.3f} s/item, "
          f"llama-perplexity {summary([t for _, t, *_ in mc_rows])[0]:.3f} s/item; ratio "
          f"ours/theirs {fmt(mc_ratio, mc_spread)} over {len(mc_rows)} rounds")
    print(f"accuracy on the {n2} items: ours {ours_acc:.4f} (accuracy_token_norm), "
          f"llama-perplexity {theirs_acc:.4f}; difference {abs(ours_acc - theirs_acc):.4f} "
          f"({round(abs(ours_acc - theirs_acc) * n2)} item(s))")
    emit("mc_scoring_vs_llama_perplexity", mc_ratio, valid(mc_ratios), mc_spread,
         f"HellaSwag N={args.n}/2N, {args.threads} threads, ctx {args.ctx}"
         f"{', epi packing items' if args.pack else ''}{NOISE}")
    mc_cpus = [c for _, _, c, _ in mc_rows]
    mc_cpu, mc_cpu_spread = valid_summary(mc_cpus)
    print(f"hellaswag CPU time (same N/2N difference, all threads, process and children): "
          f"ratio ours/theirs {fmt(mc_cpu, mc_cpu_spread)}")
    emit("mc_scoring_cpu_vs_llama_perplexity", mc_cpu, valid(mc_cpus), mc_cpu_spread,
         f"CPU seconds, robust to machine load{NOISE}")
    emit("mc_accuracy_diff_vs_llama_perplexity", abs(ours_acc - theirs_acc), 1, None,
         f"{n2} items")


def report_ppl(args: argparse.Namespace, ppl_rows: list[Row], last: dict[str, dict]) -> None:
    """Print and emit the perplexity figures (with the agreement of the two perplexities)."""
    ppl_ratios = [ratio(o, t) for o, t, _, _ in ppl_rows]
    ppl_ratio, ppl_spread = valid_summary(ppl_ratios)
    print(f"perplexity (W={args.windows}, 2W windows of {args.ctx}): ours "
          f"{summary([o for o, *_ in ppl_rows])[0]:.3f} s/window, llama-perplexity "
          f"{summary([t for _, t, *_ in ppl_rows])[0]:.3f} s/window; ratio ours/theirs "
          f"{fmt(ppl_ratio, ppl_spread)}; ppl ours "
          f"{last['ppl-ours-2']['ppl']:.6f}, llama-perplexity {last['ppl-theirs-2']['ppl']:.4f}")
    ppl_cpus = [c for _, _, c, _ in ppl_rows]
    ppl_cpu, ppl_cpu_spread = valid_summary(ppl_cpus)
    print(f"perplexity CPU time (same W/2W difference): ratio ours/theirs "
          f"{fmt(ppl_cpu, ppl_cpu_spread)}")
    verdict = crosscheck.compare_ppl(last["ppl-ours-2"]["ppl"], last["ppl-theirs-2"])
    print(f"perplexity agreement (crosscheck.compare_ppl): {verdict}")
    emit("ppl_window_vs_llama_perplexity", ppl_ratio, valid(ppl_ratios), ppl_spread,
         f"W={args.windows}/2W windows of {args.ctx}{NOISE}")


if __name__ == "__main__":
    main()
