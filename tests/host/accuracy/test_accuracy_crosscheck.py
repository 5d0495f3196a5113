"""The CI cross-check: epi's multiple-choice scores against llama-perplexity's on the tiny model."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from epi.commands.accuracy import accuracy
from host.accuracy import crosscheck
from host.accuracy import multiple_choice as mc
from host.accuracy.items import shared_item
from host.accuracy.results import read_results
from host.accuracy.scorer import Scorer


def _items(synth: type, n: int, n_choices: int) -> list:
    w = synth.Words(11)
    return [
        shared_item(f"t{i}", "Activity: " + w.sentence(12).capitalize() + ".",
                    [w.sentence(w.integer(3, 9)) + "." for _ in range(n_choices)],
                    w.integer(0, n_choices))
        for i in range(n)
    ]


@pytest.mark.slow
@pytest.mark.shares_cpu  # no timing of it is checked: it may run beside another test
def test_hellaswag_agrees_with_llama_perplexity(tiny_model: Path, synth: type) -> None:
    items = _items(synth, 30, 4)
    with Scorer(tiny_model, 128, 2) as scorer:
        ours = mc.summarize(mc.score_items(scorer, items))
    theirs = crosscheck.hellaswag(tiny_model, items, 128, 2)
    assert theirs["ok"] and theirs["n"] == 30, theirs
    verdict = crosscheck.compare_accuracy(ours["accuracy_token_norm"], theirs)
    assert verdict["agree"], verdict


@pytest.mark.slow
@pytest.mark.shares_cpu  # no timing of it is checked: it may run beside another test
def test_multiple_choice_agrees_with_llama_perplexity(tiny_model: Path, synth: type) -> None:
    items = _items(synth, 20, 5)  # 5 choices: needs more parallel sequences than the default 4
    with Scorer(tiny_model, 128, 2) as scorer:
        ours = mc.summarize(mc.score_items(scorer, items))
    theirs = crosscheck.multiple_choice(tiny_model, items, 128, 2)
    assert theirs["ok"] and theirs["n"] == 20, theirs
    assert crosscheck.compare_accuracy(ours["accuracy_token_norm"], theirs)["agree"]


@pytest.mark.slow
@pytest.mark.shares_cpu  # no timing of it is checked: it may run beside another test
def test_accuracy_command_records_the_crosscheck(tiny_model: Path, prepared: Path,
                                                 ppl_text: Path, tmp_path: Path) -> None:
    out = tmp_path / "acc.json"
    res = CliRunner().invoke(accuracy, [
        str(tiny_model), "--n", "0", "--bench", "hellaswag,arc_challenge,mmlu,winogrande",
        "--ppl", str(ppl_text), "--ctx", "128", "--ppl-windows", "0", "--threads", "2",
        "--crosscheck", "--out", str(out)])
    assert res.exit_code == 0, res.output
    x = read_results(out)["models"][0]["crosscheck"]
    assert x["tool"] == "llama-perplexity"
    for name in ("perplexity", "hellaswag", "arc_challenge", "mmlu"):
        assert x[name]["agree"] is True, (name, x[name])
    assert "winogrande" not in x and x["agree"] is True
    assert "llama-perplexity hellaswag: ours" in res.output


def test_a_run_that_lost_its_final_lines_is_repeated(monkeypatch: pytest.MonkeyPatch) -> None:
    """llama.cpp's async logger can lose the last lines at exit (rc 0): repeat, up to a limit;
    never repeat a failed run."""
    full = "[1]41.2,[2]40.9,\nFinal estimate: PPL = 40.9000 +/- 1.20000\n"
    lost = "[1]41.2,[2]40."  # the same run with its tail never printed
    outputs = [(lost, 1.0, 0), (full, 1.0, 0)]
    calls: list[list[str]] = []

    def fake(args, model, threads, flash_attn):
        calls.append([*args, "-fa", str(flash_attn)])
        return outputs.pop(0)

    monkeypatch.setattr(crosscheck, "_run_once", fake)
    got = crosscheck.perplexity(Path("m.gguf"), Path("t.txt"), 128, None, 2)
    assert got["ok"] and got["ppl"] == 40.9 and got["attempts"] == 2 and len(calls) == 2
    # every attempt with flash attention as epi's perplexity windows run it: on
    assert all(c[-2:] == ["-fa", "on"] for c in calls)

    calls.clear()
    outputs[:] = [(lost, 1.0, 0)] * crosscheck.ATTEMPTS + [(full, 1.0, 0)]
    got = crosscheck.perplexity(Path("m.gguf"), Path("t.txt"), 128, None, 2)
    assert not got["ok"] and len(calls) == crosscheck.ATTEMPTS
    assert "exit 0, no final figure" in got["reason"] and "40." in got["reason"]

    calls.clear()
    outputs[:] = [("error: failed to load model", 1.0, 1), (full, 1.0, 0)]
    got = crosscheck.perplexity(Path("m.gguf"), Path("t.txt"), 128, None, 2)
    assert not got["ok"] and len(calls) == 1 and "exit 1" in got["reason"]

    calls.clear()  # multiple choice: complete only when the last row counts every item
    outputs[:] = [("1\t100.0\n", 1.0, 0), ("1\t100.0\n2\t50.0\n", 1.0, 0)]
    monkeypatch.setattr(crosscheck, "write_multiple_choice_bin", lambda items, path: path)
    items = [shared_item(f"q{i}", "Q?", ["a", "b"], 0) for i in range(2)]
    got = crosscheck.multiple_choice(Path("m.gguf"), items, 128, 2)
    assert got["ok"] and got["accuracy"] == 0.5 and got["attempts"] == 2
