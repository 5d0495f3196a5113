"""Perplexity: window rule, standard error, errors, and agreement with llama-perplexity."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest

from epi.core.errors import UserError
from host.accuracy import crosscheck
from host.accuracy import perplexity as ppl
from host.accuracy.branching import Group
from host.accuracy.scorer import Scorer


class RecordingScorer:
    """Stands in for a model: every token has log-probability -1; records what was scored."""

    path = Path("recording.gguf")
    n_ctx = 4096

    def __init__(self, add_bos: bool) -> None:
        self.add_bos = add_bos
        self.bos = 1
        self.calls: list[tuple[list[int], int]] = []
        self.decodes: list[int] = []  # windows per decode call
        self.n_seq = 0

    def window_context(self, window: int, n_seq: int) -> RecordingScorer:
        self.n_seq = n_seq
        return self

    def close(self) -> None:
        """Nothing to free: a stand-in for the scorer's window context."""

    def score(self, groups: Sequence[Group]) -> list[list[np.ndarray]]:
        assert 1 <= len(groups) <= self.n_seq
        self.decodes.append(len(groups))
        out = []
        for group in groups:  # one sequence per window
            ((seq,), (start,)) = group.seqs, group.starts
            self.calls.append((list(seq), start))
            out.append([-np.ones(len(seq) - start)])
        return out


def test_llama_perplexity_chunk_rule() -> None:
    assert ppl.scored_per_window(512, 512) == 255
    assert ppl.window_starts(2000, 512, 512, None) == [0, 512, 1024]
    assert ppl.window_starts(2000, 512, 512, 2) == [0, 512]
    assert ppl.window_starts(1000, 256, 64, None) == list(range(0, 1000 - 256 + 1, 64))
    tokens = list(range(100, 1100))
    s = RecordingScorer(add_bos=True)
    out = ppl.perplexity_tokens(s, tokens, 256, 256, None, batch_tokens=2048)
    assert out["n_windows"] == 3 and out["n_tokens_scored"] == 3 * 127
    for k, (window, start) in enumerate(s.calls):
        assert window[0] == s.bos and window[1:] == tokens[k * 256 + 1 : (k + 1) * 256]
        assert start == 129  # second half: logits from position 128 predict token 129 on
    assert out["ppl"] == pytest.approx(math.e) and out["ppl_se"] is None  # zero variance
    assert s.decodes == [3]  # 2048 // 256 = 8 windows fit one decode: all three go together


def test_windows_per_decode_follows_llama_perplexity() -> None:
    # llama-perplexity: n_seq = max(1, n_batch / n_ctx)
    assert [ppl.windows_per_decode(c, 2048) for c in (512, 256, 700, 2048, 4096)] == [4, 8, 2,
                                                                                         1, 1]
    s = RecordingScorer(add_bos=False)
    ppl.perplexity_tokens(s, list(range(5000)), 512, 512, None, batch_tokens=1024)
    assert s.decodes == [2, 2, 2, 2, 1]  # 9 windows, two per decode
    for batch in (100, 511, None):  # below one window, or none: one window per decode
        s = RecordingScorer(add_bos=False)
        ppl.perplexity_tokens(s, list(range(5000)), 512, 512, None, batch_tokens=batch)
        assert s.decodes == [1] * 9
    # by default llama-perplexity's own batch of 2048 tokens: 2048 / 512 = 4 windows per call
    s = RecordingScorer(add_bos=False)
    ppl.perplexity_tokens(s, list(range(5000)), 512, 512, None)
    assert s.decodes == [4, 4, 1]


def test_sliding_window_scores_every_token_once() -> None:
    tokens = list(range(1000))
    s = RecordingScorer(add_bos=False)
    ppl.perplexity_tokens(s, tokens, 128, 32, None)
    scored = [w[0] + j for w, start in s.calls for j in range(start, len(w))]
    assert len(scored) == len(set(scored))
    assert scored == list(range(128 - 32, scored[-1] + 1))
    for _w, start in s.calls:  # every scored token has at least n_ctx - stride tokens before it
        assert start >= 128 - 32


@pytest.mark.parametrize(
    ("n_tokens", "n_ctx", "stride", "message"),
    [(100, 128, 128, "fewer than one window"), (1000, 128, 129, "--stride"),
     (1000, 2, 2, "too small")],
)
def test_window_errors(n_tokens: int, n_ctx: int, stride: int, message: str) -> None:
    with pytest.raises(UserError, match=message):
        ppl.window_starts(n_tokens, n_ctx, stride, None)


def test_text_errors(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="not found"):
        ppl.read_text(tmp_path / "none.txt")
    (tmp_path / "e.txt").write_text("\n")
    with pytest.raises(UserError, match="empty"):
        ppl.read_text(tmp_path / "e.txt")
    (tmp_path / "b.txt").write_bytes(b"abc\xff\xfe")
    with pytest.raises(UserError, match="not UTF-8"):
        ppl.read_text(tmp_path / "b.txt")
    (tmp_path / "t.txt").write_text("one\ntwo\n\n")
    assert ppl.read_text(tmp_path / "t.txt") == "one\ntwo\n"  # one newline dropped, as -f


def test_perplexity_matches_an_independent_computation(tiny_model: Path, ppl_text: Path) -> None:
    import llama_cpp


    # two windows: the first and one at an offset (every later window is scored as the second
    # is; four cost twice the CPU and proved nothing more)
    n_windows = 2
    with Scorer(tiny_model, 128, 2) as scorer:
        tokens = scorer.tokenize(ppl.read_text(ppl_text))
        out = ppl.perplexity_tokens(scorer, tokens, 128, 128, n_windows, batch_tokens=None)
        # both windows in one decode, separate sequence ids and KV streams (llama-perplexity's
        # n_batch / n_ctx rule): checked against the same independent reference below
        packed = ppl.perplexity_tokens(scorer, tokens, 128, 128, n_windows, batch_tokens=256)
        assert scorer.add_bos
    # flash attention on, as epi's window contexts and llama-perplexity's default run it: with
    # it off the attention rounds differently (~2e-5 relative in perplexity), far above 1e-7
    llm = llama_cpp.Llama(str(tiny_model), n_ctx=128, logits_all=True, n_threads=2,
                          flash_attn=True, verbose=False)
    nll = []
    for k in range(n_windows):
        window = [llm.token_bos(), *tokens[k * 128 + 1 : (k + 1) * 128]]
        llm.reset()
        llm.eval(window)
        x = np.array(llm.scores[64:127], dtype=np.float64)
        lse = x.max(1) + np.log(np.exp(x - x.max(1, keepdims=True)).sum(1))
        nll.extend(lse - x[np.arange(63), window[65:128]])
    llm.close()
    assert out["n_windows"] == n_windows and out["n_tokens_scored"] == len(nll) == n_windows * 63
    # epi asks llama.cpp for the scored rows' logits only (as llama-perplexity does), this
    # reference for every row: the output matmul over other row counts rounds differently in
    # float32, ~1e-8 relative (measured 3.5e-9 on this model); a real change is far larger.
    assert out["nll_mean"] == pytest.approx(float(np.mean(nll)), rel=1e-7)
    assert out["ppl"] == pytest.approx(math.exp(np.mean(nll)), rel=1e-7)
    assert packed["n_tokens_scored"] == len(nll)
    assert packed["ppl"] == pytest.approx(math.exp(np.mean(nll)), rel=1e-7)


@pytest.mark.slow
@pytest.mark.shares_cpu  # no timing of it is checked: it may run beside another test
def test_perplexity_agrees_with_llama_perplexity(tiny_model: Path, ppl_text: Path) -> None:
    """The CI cross-check: same model, text, context and chunks as llama-perplexity."""
    with Scorer(tiny_model, 128, 2) as scorer:
        tokens = scorer.tokenize(ppl.read_text(ppl_text))
        ours = ppl.perplexity_tokens(scorer, tokens, 128, 128, None)
    theirs = crosscheck.perplexity(tiny_model, ppl_text, 128, None, 2)
    assert theirs["ok"], theirs
    assert ours["n_windows"] == len(tokens) // 128
    verdict = crosscheck.compare_ppl(ours["ppl"], theirs)
    assert verdict["agree"] and verdict["rel_diff"] <= 0.005
    assert ours["ppl_se"] == pytest.approx(theirs["ppl_se"], rel=0.01)
