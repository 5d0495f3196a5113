"""A paper-form study's report: 24 maps, 3 campaign rounds, accuracy per item and manifests.

The study is synthetic (tests/host/conftest.py's traces and token logs; power by construction:
each map draws its own level, every round drifts) and shaped like the paper's: many maps, one
of them `uniform_q4km`. The report must put the five questions at the top, each with a status,
and call no comparison decided in one place and undecided in another.
"""

from __future__ import annotations

import itertools
import json
import re
from pathlib import Path

import numpy as np
import pytest

from host.analysis.model import Options
from host.analysis.output import analyze_to
from host.report.build import write_report
from tests.host.conftest import NS, Steps, make_schedule, write_run, write_trace
from tests.host.test_report_one_verdict import verdict_words

# synthetic runs and one report: no timing is checked, so it may run beside another test
pytestmark = [pytest.mark.slow, pytest.mark.shares_cpu]

N_MAPS = 24
MAPS = ["uniform_q4km"] + [f"mix{k:02d}" for k in range(1, N_MAPS)]
QUESTIONS = ("perplexity-only evaluation miss", "accuracy–J/token frontier",
             "most sensitive to quantization depth", "smaller or larger than uniform Q4_K_M",
             "memory bandwidth, reduced compute, or both")


def _build(root: Path) -> Path:
    rng = np.random.default_rng(24)
    power = {m: 1.0 + 0.4 * k / N_MAPS for k, m in enumerate(MAPS)}  # q4km cheapest
    sizes = {m: 1_000_000 + 40_000 * k for k, m in enumerate(MAPS)}
    cursor = 500 * NS
    times, levels, runs = [cursor - 60 * NS], [3.0], []
    for r, drift in enumerate((1.00, 1.04, 0.97)):
        for k, m in enumerate(MAPS):
            sched = make_schedule(cursor, n_repeats=2, prompts=2, seed=100 * r + k)
            prof = sched.profile(idle_w=3.0 * drift, prefill_w=8.0 * drift * power[m],
                                 decode_w=6.0 * drift * power[m])
            times += list(prof.t_ns[1:])
            levels += list(prof.level_w[1:])
            sha = f"{k:02d}" * 32
            runs.append(write_run(root / "runs" / m / f"round{r + 1}-attempt1", sched,
                                  map_id=m, sha256=sha, run_id=f"{m}-{r}"))
            cursor = sched.requests[-1]["end"] + 5 * NS
    trace = write_trace(root / "trace", {0: Steps(np.array(times, np.int64),
                                                  np.array(levels))}, 495 * NS, cursor)
    n_items = 200
    ids = [f"hs{i}" for i in range(n_items)]
    models = []
    for k, m in enumerate(MAPS):
        correct = (rng.random(n_items) < 0.55 - 0.004 * k).astype(int)
        acc = float(correct.mean())
        models.append({"path": f"{m}.gguf", "sha256": f"{k:02d}" * 32, "map_id": m,
                       "perplexity": {"ppl": 20.0 + 0.05 * k, "ppl_se": 0.1},
                       "benchmarks": {"hellaswag": {
                           "n": n_items, "accuracy_norm": acc,
                           "ci95_norm": [acc - 0.07, acc + 0.07],
                           "items": {"ids": ids, "accuracy": correct.tolist(),
                                     "accuracy_norm": correct.tolist(),
                                     "accuracy_token_norm": correct.tolist()}}},
                       "composite": {"accuracy": acc, "ci95": [acc - 0.07, acc + 0.07],
                                     "weights": {"hellaswag": 1.0},
                                     "metric": "accuracy_norm"}})
    acc_file = root / "accuracy.json"
    acc_file.write_text(json.dumps({"format": "epi-accuracy", "format_version": 1,
                                    "models": models}))
    mdir = root / "manifests"
    mdir.mkdir()
    for m in MAPS:
        (mdir / f"{m}.manifest.json").write_text(json.dumps({
            "format": "epi-quant-manifest", "format_version": 1, "map_id": m,
            "output": {"size_bytes": sizes[m], "sha256": None}, "total": {}, "inputs": {}}))
    out = root / "analysis"
    analyze_to(out, runs, trace, Options(baseline="uniform_q4km", manifest_dir=mdir), acc_file)
    return out


@pytest.fixture(scope="module")
def paper_report(tmp_path_factory: pytest.TempPathFactory) -> str:
    root = tmp_path_factory.mktemp("paper")
    analysis = _build(root)
    write_report(analysis, root / "report")
    return (root / "report" / "report.md").read_text(encoding="utf-8")


def test_the_five_questions_open_the_report_each_with_a_status(paper_report: str) -> None:
    answers = paper_report.split("## Answers", 1)[1].split("\n## ", 1)[0]
    assert paper_report.index("## Answers") == paper_report.index("\n## ") + 1  # the first
    found = re.findall(r"^\*\*(.+?)\*\* \*(.+?)\.\*", answers, re.M)
    assert len(found) >= 5
    for question in QUESTIONS:
        hits = [status for q, status in found if question in q]
        assert len(hits) == 1, question
        assert hits[0] in ("decided", "undecided", "partly decided",
                           "cannot be answered from this study")


GUIDANCE_ROW = re.compile(r"^\| (latency|energy|quality)-sensitive \|")


def test_no_comparison_is_decided_in_one_place_and_undecided_in_another(
        paper_report: str) -> None:
    # a line that names exactly two configurations speaks of their comparison; lines that list
    # more (captions, the EPI optimum's set, the frontier) speak of sets, and the guidance rows
    # of a pick against its rivals on one quantity (checked below)
    def names(line: str) -> int:
        return sum(bool(re.search(rf"\b{m}\b", line)) for m in MAPS)

    # an answer's status (`*undecided.*`) is the question's; the pair's own verdicts are the
    # words after it ("told apart on energy; not told apart on accuracy")
    text = "\n".join(re.sub(r"^\*\*.+?\*\* \*[a-z ]+\.\*", "", ln)
                     for ln in paper_report.splitlines()
                     if names(ln) == 2 and not GUIDANCE_ROW.match(ln))
    assert text.count("\n") > 50  # the comparison tables are there
    contradictions = [(a, b) for a, b in itertools.combinations(MAPS, 2)
                      if verdict_words(text, a, b) == {"decided", "undecided"}]
    assert contradictions == []


def test_the_guidance_agrees_with_every_paired_comparison_it_names(paper_report: str) -> None:
    rows = [ln.split(" | ") for ln in paper_report.splitlines() if GUIDANCE_ROW.match(ln)]
    assert len(rows) == 3
    comparisons = [ln for ln in paper_report.splitlines()
                   if ln.startswith("| savings vs baseline |") or
                   ln.startswith("| frontier neighbours |") or
                   ln.startswith("| perplexity-matched pair |")]
    checked = 0
    for row in rows:
        pick, status, rivals = row[2], row[4], row[5].rstrip(" |")
        quantity = status.split(" on ", 1)[1]
        if quantity == "decode time":
            continue  # no paired comparison of time exists to contradict
        named = [] if rivals in ("—", "no interval") else rivals.split(", ")
        for line in comparisons:
            cells = line.split(" | ")
            pair = {cells[1], cells[2]}
            if pick not in pair:
                continue
            other = (pair - {pick}).pop()
            told = (("uses more" in cells[5] or "uses less" in cells[5]) if quantity == "energy"
                    else "cannot be told apart" not in cells[6])
            # a rival the guidance names must be one the comparison could not tell apart,
            # and an eligible configuration it leaves out must be one it could
            if other in named:
                assert not told, (row, line)
                checked += 1
    assert checked > 0
