"""Accuracy of a split configuration (host/accuracy/split_scoring.py): the context on the prefill
model, the KV state handed over, the continuation on the decode model.

References, independent of the code under test: the unsplit scorer (one map for both phases
must give its figures bit for bit), and a by-hand handover through llama.cpp's C API — model
A's context decoded alone in a fresh one-sequence context, its state read, loaded into a fresh
context of model B, the ending fed there one token at a time.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner

from epi.commands.accuracy import accuracy
from epi.core.errors import UserError
from host.accuracy import cache, store
from host.accuracy import multiple_choice as mc
from host.accuracy import perplexity as ppl
from host.accuracy.branching import Group
from host.accuracy.evaluate import Settings, benchmark_key, evaluate, load_benchmarks
from host.accuracy.items import Item, mmlu_item, shared_item, winogrande_item
from host.accuracy.join_keys import join_key, run_join_key
from host.accuracy.llama_load import import_llama_cpp
from host.accuracy.results import accuracy_by_sha256, read_results, write_results
from host.accuracy.scorer import Scorer
from host.accuracy.split_scoring import SplitScorer
from host.campaign.study import load_study
from host.errors import StoreError
from host.gguf_io.file import sha256_file
from host.quant.gguf_info import read_model
from host.quant.mixmap import load_mixmap
from host.quant.quantize import quantize_map
from host.quant.tiny_model import write_test_model

REPO = Path(__file__).resolve().parents[3]
N_CTX = 256
# The by-hand reference decodes the context alone with one output row where the scorer may ask
# for two (split_scoring._matrix_path), and llama.cpp's CPU kernels round a one-row product
# differently: measured 6e-7 nats apart on this item (up to 5e-5 on others). The two maps differ
# by 0.07-0.37 nats on it: a wrong handover (the prefill model's cells missing, one model
# scoring everything) fails by far more than the tolerance, asserted below.
TOL_NATS = 1e-4


@pytest.fixture(scope="module")
def q4_model(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A second map of the tiny model: the study's uniform Q4_K_M."""
    out = tmp_path_factory.mktemp("q4")
    return quantize_map(load_mixmap(REPO / "quantmaps" / "uniform_q4km.json"),
                        read_model(tiny_model), sha256_file(tiny_model), out, threads=1).output


def _items() -> list[Item]:
    """Shared contexts with multi-token endings, one-token endings (MMLU's letters), a partial
    item (WinoGrande), and items behind one few-shot prefix (kept resident in the KV cache)."""
    items = [shared_item(f"s{i}", f"Activity: the cat sat on the mat, then walked {i} times.",
                         ["it ran away fast.", "it slept.", "a dog barked at it today.",
                          "nothing"], i % 4) for i in range(3)]
    items.append(mmlu_item({"question": "2+2?", "subject": "math",
                            "choices": ["3", "4", "5", "6"], "answer": "B"}, 0))
    items.append(winogrande_item({"sentence": "The dog chased the cat because _ was fast.",
                                  "option1": "the dog", "option2": "the cat", "answer": "1"}, 0))
    prefix = "Question: what is red?\nAnswer: a rose\n\nQuestion: what is blue?\nAnswer: sky\n\n"
    for i in range(2):
        base = shared_item(f"f{i}", f"{prefix}Question: what is green {i}?\nAnswer:",
                           ["grass in spring", "the sea", "a lemon tree"], 0)
        items.append(Item(base.id, base.contexts, base.continuations, base.gold,
                          shared_prefix=prefix))
    return items


def _text_tokens(scorer: Scorer) -> list[int]:
    words = " ".join(f"word{i % 37} and thing{i % 11}." for i in range(200))
    return scorer.tokenize(words)


def test_one_map_for_both_phases_gives_the_unsplit_figures(tiny_model: Path) -> None:
    """Multiple choice bit for bit; perplexity to flash attention's rounding.

    Perplexity windows run with flash attention on (as llama-perplexity's default), whose CPU
    kernel rounds queries to f16 and so depends on how a window is cut into decode calls: the
    split decodes the unscored half, then the scored half. Measured 1e-5 relative in the mean
    NLL of this tiny model; a lost or misplaced handover moves it by whole nats."""
    items = _items()
    with Scorer(tiny_model, N_CTX, 2) as s:
        want = mc.score_items(s, items)
        tokens = _text_tokens(s)
        want_ppl = ppl.perplexity_tokens(s, tokens, 64, 64, 4)
        want_one = ppl.perplexity_tokens(s, tokens, 64, 64, 2, batch_tokens=None)
    with SplitScorer(tiny_model, tiny_model, N_CTX, 2) as s:
        got = mc.score_items(s, items)
        got_ppl = ppl.perplexity_tokens(s, tokens, 64, 64, 4)
        got_one = ppl.perplexity_tokens(s, tokens, 64, 64, 2, batch_tokens=None)
    assert got == want  # every choice's [logprob sum, tokens, bytes], exactly
    for got_w, want_w in ((got_ppl, want_ppl), (got_one, want_one)):
        assert got_w["n_tokens_scored"] == want_w["n_tokens_scored"]
        assert got_w["nll_mean"] == pytest.approx(want_w["nll_mean"], rel=1e-4)
    assert [mc.predictions(r["scores"]) for r in got] == [mc.predictions(r["scores"])
                                                          for r in want]


def _lc_context(lc: Any, model: object) -> object:
    p = lc.llama_context_default_params()
    p.n_ctx, p.n_batch, p.n_ubatch, p.n_seq_max = N_CTX, N_CTX, N_CTX, 1
    p.n_threads = p.n_threads_batch = 2
    p.flash_attn_type = lc.LLAMA_FLASH_ATTN_TYPE_DISABLED
    return lc.llama_init_from_model(model, p)


def _decode_last_logits(lc: Any, ctx: object, tokens: list[int], n_vocab: int) -> np.ndarray:
    arr = (lc.llama_token * len(tokens))(*tokens)
    assert lc.llama_decode(ctx, lc.llama_batch_get_one(arr, len(tokens))) == 0
    ptr = lc.llama_get_logits_ith(ctx, -1)
    return np.array(ptr[:n_vocab], dtype=np.float64)


def _logp(logits: np.ndarray, token: int) -> float:
    mx = logits.max()
    return float(logits[token] - mx - np.log(np.exp(logits - mx).sum()))


def _by_hand(prefill: Path, decode: Path, context: list[int], ending: list[int]) -> float:
    """log p(ending | context): the context on `prefill` in a fresh context, its state moved
    into a fresh context of `decode` (llama_state_seq_get_data/set_data), the ending there."""
    lc = import_llama_cpp()
    mp = lc.llama_model_default_params()
    a = lc.llama_model_load_from_file(str(prefill).encode(), mp)
    b = lc.llama_model_load_from_file(str(decode).encode(), mp)
    ca, cb = _lc_context(lc, a), _lc_context(lc, b)
    n_vocab = int(lc.llama_vocab_n_tokens(lc.llama_model_get_vocab(a)))
    try:
        total = _logp(_decode_last_logits(lc, ca, context, n_vocab), ending[0])
        size = lc.llama_state_seq_get_size(ca, 0)
        buf = (ctypes.c_uint8 * size)()
        assert lc.llama_state_seq_get_data(ca, buf, size, 0) == size
        assert lc.llama_state_seq_set_data(cb, buf, size, 0) == size
        # the ending in one batch at the positions after the context, a row for each token
        # that predicts another
        batch = lc.llama_batch_init(len(ending), 0, 1)
        for i, tok in enumerate(ending):
            batch.token[i], batch.pos[i], batch.n_seq_id[i] = tok, len(context) + i, 1
            batch.seq_id[i][0] = 0
            batch.logits[i] = i < len(ending) - 1
        batch.n_tokens = len(ending)
        assert lc.llama_decode(cb, batch) == 0
        for i in range(len(ending) - 1):
            row = np.array(lc.llama_get_logits_ith(cb, i)[:n_vocab], dtype=np.float64)
            total += _logp(row, ending[i + 1])
        lc.llama_batch_free(batch)
        return total
    finally:
        lc.llama_free(ca)
        lc.llama_free(cb)
        lc.llama_model_free(a)
        lc.llama_model_free(b)


@pytest.mark.slow
@pytest.mark.shares_cpu
def test_two_maps_score_as_a_by_hand_handover(tiny_model: Path, q4_model: Path) -> None:
    # a shared context, and a partial item (each choice its own context, one continuation);
    # every choice is scored as its own sequence, the batch shape the by-hand reference has
    # (on Q4_K weights llama.cpp's CPU kernels round a row differently with the rows beside
    # it: 3e-3 nats between one choice alone and both choices in one batch, unsplit)
    items = [shared_item("x", "Activity: the cat sat on the mat, then walked twice.",
                         ["it ran away fast.", "a dog barked at it today."], 0),
             winogrande_item({"sentence": "The dog chased the cat because _ was very fast.",
                              "option1": "the dog", "option2": "the cat", "answer": "1"}, 0)]

    def per_choice(scorer: Scorer) -> list[float]:
        return [float(scorer.branching().score([Group((tuple(seq),), (start,))])[0][0].sum())
                for it in items for seq, start in mc.item_group(scorer, it)]

    with SplitScorer(tiny_model, q4_model, N_CTX, 2) as s:
        got = per_choice(s)
        pairs = [p for it in items for p in mc.item_group(s, it)]
    with Scorer(tiny_model, N_CTX, 2) as s:
        pre_only = per_choice(s)
    with Scorer(q4_model, N_CTX, 2) as s:
        dec_only = per_choice(s)
    for k, (seq, start) in enumerate(pairs):
        want = _by_hand(tiny_model, q4_model, seq[:start], seq[start:])
        assert got[k] == pytest.approx(want, abs=TOL_NATS), k
        # neither map alone: the figure is the split's (the maps differ by more than the
        # tolerance here, so a scorer that ignored one of them fails)
        assert abs(pre_only[k] - got[k]) > 100 * TOL_NATS, k
        assert abs(dec_only[k] - got[k]) > 100 * TOL_NATS, k


def _settings(**kw: object) -> Settings:
    return Settings(benches=["hellaswag", "mmlu"], n=3, ctx=128, threads=2,
                    weights={"hellaswag": 1.0, "mmlu": 1.0}, **kw)


def test_the_store_keeps_split_and_unsplit_results_apart(tiny_model: Path, prepared: Path,
                                                          ppl_text: Path) -> None:
    s = _settings(ppl_file=ppl_text, ppl_windows=2)
    unsplit = evaluate([tiny_model], s)["models"][0]
    split = evaluate([tiny_model], s, decode_model=tiny_model)["models"][0]
    # the unsplit results were in the store; the split request computed its own
    assert not any(b["cached"] for b in split["benchmarks"].values())
    assert not split["perplexity"]["cached"]
    sha = cache.model_sha256(tiny_model)
    assert split["split"]["prefill"]["sha256"] == split["split"]["decode"]["sha256"] == sha
    assert "split" not in unsplit and split["map_id"] is None
    # one map for both phases: the same figures (scored twice, never read across)
    for name, b in unsplit["benchmarks"].items():
        assert split["benchmarks"][name]["items"] == b["items"], name
    # (perplexity to flash attention's rounding: see the one-map test above)
    assert split["perplexity"]["ppl"] == pytest.approx(unsplit["perplexity"]["ppl"], rel=1e-3)
    again = evaluate([tiny_model], s, decode_model=tiny_model)["models"][0]
    assert all(b["cached"] for b in again["benchmarks"].values())
    # an unsplit entry put where the split's would be is refused, never read as the split's
    bd = load_benchmarks(s)["mmlu"]
    key_u = store.full_key(benchmark_key(sha, bd, s))
    key_s = store.full_key(benchmark_key(sha, bd, s, decode_sha=sha))
    assert store.entry_path(key_u) != store.entry_path(key_s)
    shutil.copy(store.entry_path(key_u), store.entry_path(key_s))
    with pytest.raises(StoreError, match="decode_model_sha256"):
        store.load(key_s)
    # one accuracy file holds both, each found by its own join key
    doc = evaluate([tiny_model], _settings())
    doc["models"] = [unsplit, split]
    by = accuracy_by_sha256(doc)
    assert by[sha] is unsplit and by[join_key(sha, sha)] is split
    run = {"model": {"sha256": sha}, "split": {"decode": {"sha256": sha}}}
    assert run_join_key(run) == join_key(sha, sha) and run_join_key({"model": {"sha256": sha}}) \
        == sha


def test_the_split_is_recorded_in_the_file(tiny_model: Path, q4_model: Path, prepared: Path,
                                           tmp_path: Path) -> None:
    out = tmp_path / "acc.json"
    res = CliRunner().invoke(accuracy, [str(tiny_model), "--decode-model", str(q4_model),
                                        "--bench", "mmlu", "--n", "3", "--ctx", "128",
                                        "--threads", "2", "--out", str(out)])
    assert res.exit_code == 0, res.output
    (m,) = read_results(out)["models"]
    assert m["split"]["prefill"]["sha256"] == m["sha256"] == sha256_file(tiny_model)
    assert m["split"]["decode"]["sha256"] == sha256_file(q4_model)
    assert m["split"]["decode"]["path"] == str(q4_model)
    assert "split: prefill" in res.output
    # a split block that contradicts the entry is refused in one line
    m["split"]["prefill"]["sha256"] = "0" * 64
    with pytest.raises(UserError, match=r"split\.prefill\.sha256"):
        write_results(tmp_path / "bad.json", {**read_results(out), "models": [m]})


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "epi.cli", "accuracy", *args],
                          capture_output=True, text=True, check=False, env={**os.environ})


@pytest.mark.slow
@pytest.mark.shares_cpu
def test_a_bad_decode_model_is_one_line_exit_2(tiny_model: Path, prepared: Path,
                                               tmp_path: Path) -> None:
    other = write_test_model(tmp_path / "other.gguf", n_layers=2)
    (tmp_path / "junk.gguf").write_bytes(b"not a gguf at all")
    out = str(tmp_path / "o.json")
    cases = [
        ([str(tiny_model), "--decode-model", str(tmp_path / "none.gguf")], "file not found"),
        ([str(tiny_model), "--decode-model", str(tmp_path / "junk.gguf")], "junk.gguf"),
        ([str(tiny_model), "--decode-model", str(other)], "not quantizations of one base"),
        ([str(tiny_model), str(tiny_model), "--decode-model", str(tiny_model)],
         "one prefill MODEL"),
        ([str(tiny_model), "--decode-model", str(tiny_model), "--crosscheck"], "--crosscheck"),
        ([str(tiny_model), "--decode-model", str(tiny_model), "--cluster", "local:1"],
         "--cluster"),
    ]
    for args, problem in cases:
        proc = _cli(*args, "--bench", "mmlu", "--n", "2", "--out", out)
        assert proc.returncode == 2, (args, proc.stderr)
        assert proc.stderr.count("\n") == 1 and problem in proc.stderr, (args, proc.stderr)
        assert "--decode-model" in proc.stderr, proc.stderr
    assert not Path(out).exists()


SPLIT_ID = "q8_prefill_q4_decode"


def _split_study(tmp_path: Path, model: Path, ppl_text: Path) -> Path:
    maps = REPO / "quantmaps"
    p = tmp_path / "study.toml"
    p.write_text(f"""
[study]
name = "split-acc"
out = "camp"

[[models]]
name = "tiny"
path = "{model}"
maps = ["{maps}/uniform_q8.json", "{maps}/uniform_q4km.json"]
splits = [{{ id = "{SPLIT_ID}", prefill = "uniform_q8", decode = "uniform_q4km" }}]

[run]
prompts = "{REPO / 'examples' / 'prompts-demo-long.json'}"

[meter]
emulate = true

[accuracy]
benchmarks = {{ mmlu = 10 }}
shots = {{}}
ppl = "{ppl_text}"
ppl_windows = 2
threads = 2
""")
    return p


@pytest.mark.slow
@pytest.mark.shares_cpu
def test_a_campaign_scores_the_split_and_the_analysis_joins_it(
        tiny_model: Path, prepared: Path, ppl_text: Path, tmp_path: Path) -> None:
    import io
    from types import SimpleNamespace

    from host.analysis.accuracy_file import load_accuracy
    from host.analysis.model import Options
    from host.campaign.execute import Campaign
    from host.campaign.journal import JournalState
    from host.campaign.step import do_accuracy, do_quantize

    c = Campaign(load_study(_split_study(tmp_path, tiny_model, ppl_text)),
                 stream=io.StringIO())
    steps = {s.step_id: s for s in c.plan.steps}
    for s in c.plan.steps:
        if s.kind == "quantize":
            do_quantize(c._args(s, JournalState())[0])  # type: ignore[arg-type]
    args = {cid: dict(c._args(steps[f"accuracy:{cid}"], JournalState())[0])
            for cid in ("uniform_q8", "uniform_q4km", SPLIT_ID)}
    split_cfg = c.plan.config(SPLIT_ID)
    assert args[SPLIT_ID]["model"] == str(split_cfg.gguf)
    assert args[SPLIT_ID]["decode_model"] == str(split_cfg.decode_gguf)
    assert "decode_model" not in args["uniform_q8"]  # an unsplit step's spec is as it was
    docs = []
    for a in args.values():
        do_accuracy(a)  # type: ignore[arg-type]
        docs.append(read_results(Path(str(a["out"]))))
    merged = {**docs[0], "models": [m for d in docs for m in d["models"]]}
    acc_file = write_results(tmp_path / "accuracy.json", merged)  # consistent: 3 entries
    read_results(acc_file)
    sha = {cid: sha256_file(Path(str(a["model"]))) for cid, a in args.items()}
    q4_sha = sha256_file(split_cfg.decode_gguf)  # type: ignore[arg-type]

    def run(cid: str, header: dict[str, object]) -> SimpleNamespace:
        return SimpleNamespace(config=cid, run=SimpleNamespace(header=header))

    runs = [run("uniform_q8", {"model": {"sha256": sha["uniform_q8"]}}),
            run("uniform_q4km", {"model": {"sha256": q4_sha}}),
            run(SPLIT_ID, {"model": {"sha256": sha["uniform_q8"]},
                           "split": {"decode": {"sha256": q4_sha}}})]
    accs, ppls, notes = load_accuracy(acc_file, runs, Options())  # type: ignore[arg-type]
    assert set(accs) == set(ppls) == {"uniform_q8", "uniform_q4km", SPLIT_ID}, notes
    # each configuration has its own entry's perplexity: the split's is not its prefill
    # parent's (same prefill sha256) nor its decode parent's
    split_entry = next(m for m in merged["models"] if "split" in m)
    assert ppls[SPLIT_ID] == split_entry["perplexity"]["ppl"]
    assert len({ppls["uniform_q8"], ppls["uniform_q4km"], ppls[SPLIT_ID]}) == 3


def test_the_report_says_null_only_for_a_split_without_accuracy() -> None:
    from types import SimpleNamespace

    import pandas as pd

    from host.analysis.split_compare import SplitParents
    from host.report.split_table import _accuracy_sentence

    splits = [SplitParents("s1", "a", "b"), SplitParents("s2", "a", "c")]
    scored = SimpleNamespace(results=pd.DataFrame(
        {"config": ["s1", "s2", "a"], "accuracy": [0.4, 0.5, float("nan")]}))
    text = _accuracy_sentence(scored, splits)  # type: ignore[arg-type]
    assert "null" not in text and "EPI table" in text
    one = SimpleNamespace(results=pd.DataFrame(
        {"config": ["s1", "s2"], "accuracy": [0.4, float("nan")]}))
    text = _accuracy_sentence(one, splits)  # type: ignore[arg-type]
    assert "No accuracy for s2 " in text and "null" in text and "s1" not in text


@pytest.mark.slow
@pytest.mark.shares_cpu
def test_a_campaign_split_step_with_a_cluster_is_scored_here_as_a_split(
        tiny_model: Path, prepared: Path, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    from host.campaign.step import do_accuracy

    out = tmp_path / "split.json"
    do_accuracy({"model": str(tiny_model), "decode_model": str(tiny_model),
                 "benchmarks": {"mmlu": 10}, "ppl": None, "ppl_windows": None, "threads": 2,
                 "seed": 0, "out": str(out), "cluster": "local:1"})
    (m,) = read_results(out)["models"]
    assert m["split"]["decode"]["sha256"] == m["sha256"]  # scored as a split, not unsplit
    assert "a split configuration is scored on this host, not on local:1" in capsys.readouterr().out
