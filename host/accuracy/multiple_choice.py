"""Multiple-choice accuracy from the log-likelihood of each choice.

For each choice the scored tokens are the continuation's: for items that share one context,
the tokens after the longest token prefix common to *all* choices (llama.cpp's rule — shared
tokens add the same amount to every choice, so they cannot change the raw ranking); for
partial items (WinoGrande) the tokens after the choice's own context. Three rankings are
reported, as the field does:

- raw (`accuracy`): sum of the scored tokens' log-probabilities;
- per byte (`accuracy_norm`): that sum divided by the UTF-8 byte length of the scored tokens
  (lm-evaluation-harness's `acc_norm` divides by characters);
- per token (`accuracy_token_norm`): the mean log-probability per scored token, which is what
  llama-perplexity's HellaSwag and multiple-choice scores use.

A tie goes to the first choice (llama.cpp's rule).

Scoring evaluates an item's shared tokens once and branches the KV cache per choice, one
item per llama.cpp batch (packing several is optional, `pack=True`) — see
host/accuracy/branching.py; docs/accuracy.md states the logit differences this causes.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence
from typing import TypedDict

import numpy as np

from epi.core.errors import UserError
from host.accuracy.branching import Group
from host.accuracy.items import Item
from host.accuracy.scorer import Scorer, common_prefix_len
from host.accuracy.stats import wilson_interval

METRICS = {"raw": "accuracy", "norm": "accuracy_norm", "token_norm": "accuracy_token_norm"}


def score_starts(scorer: Scorer, item: Item, seqs: Sequence[Sequence[int]]) -> list[int]:
    """Index of the first scored token of every choice."""
    if item.partial:
        starts = []
        for ctx, seq in zip(item.contexts, seqs, strict=True):
            s = common_prefix_len(scorer.tokenize(ctx), seq)
            starts.append(max(1, min(s, len(seq) - 1)))
        return starts
    shared = len(seqs[0])
    for seq in seqs[1:]:
        shared = min(shared, common_prefix_len(seqs[0], seq))
    s = max(1, min(shared, min(len(q) for q in seqs) - 1))
    return [s] * len(seqs)


#: per scorer and few-shot prefix: its tokens as they start every item's text, and the text
#: they cover (None: the split could not be confirmed, tokenize whole texts)
_HEADS: weakref.WeakKeyDictionary[Scorer, dict[str, tuple[list[int], str] | None]] = (
    weakref.WeakKeyDictionary())


def _head(scorer: Scorer, item: Item) -> tuple[list[int], str] | None:
    heads = _HEADS.setdefault(scorer, {})
    if item.shared_prefix not in heads:
        tokens = prefix_tokens(scorer, item.shared_prefix, item)
        covered = scorer.llm.detokenize(tokens[1:] if tokens[:1] == scorer.tokenize("")[:1]
                                        else tokens).decode("utf-8", "replace")
        head = (tokens, covered) if item.shared_prefix.startswith(covered) else None
        # confirmed on this item's every choice, or not used at all
        if head is not None and any(scorer.tokenize_after(head, t) != scorer.tokenize(t)
                                    for t in item.texts()):
            head = None
        heads[item.shared_prefix] = head
    return heads[item.shared_prefix]


def item_tokens(scorer: Scorer, item: Item) -> list[list[int]]:
    """Token sequence of every choice's full text (a few-shot prefix tokenized once)."""
    if item.shared_prefix:
        head = _head(scorer, item)
        return [scorer.tokenize_after(head, t) for t in item.texts()]
    return [scorer.tokenize(t) for t in item.texts()]


def item_group(scorer: Scorer, item: Item) -> list[tuple[list[int], int]]:
    """(token sequence, first scored index) of every choice."""
    seqs = item_tokens(scorer, item)
    return list(zip(seqs, score_starts(scorer, item, seqs), strict=True))


def group_cells(scorer: Scorer, item: Item) -> int:
    """KV cells the item takes scored as one group: its shared tokens once, every tail."""
    pairs = item_group(scorer, item)
    return Group(tuple(tuple(q) for q, _ in pairs), tuple(s for _, s in pairs)).n_tokens


#: contexts are opened in whole steps of this many cells, so one context (one allocation)
#: serves items of similar size
CONTEXT_STEP_CELLS = 256


def context_cells(cells: int) -> int:
    """The context size that holds `cells` KV cells: `cells` rounded up to a whole step."""
    return -(-cells // CONTEXT_STEP_CELLS) * CONTEXT_STEP_CELLS


def item_groups(scorer: Scorer, item: Item) -> list[Group]:
    """The item as one prefix-sharing group, or one group per choice when it does not fit."""
    pairs = item_group(scorer, item)
    for seq, _ in pairs:
        if len(seq) > scorer.n_ctx:
            raise UserError(f"{scorer.path}: a sequence of {len(seq)} tokens does not fit the "
                            f"context of {scorer.n_ctx}")
    whole = Group(tuple(tuple(q) for q, _ in pairs), tuple(s for _, s in pairs))
    if whole.n_tokens <= scorer.n_ctx and len(pairs) <= scorer.branching().n_seq_max:
        return [whole]
    return [Group((tuple(q),), (s,)) for q, s in pairs]


class ItemRecord(TypedDict):
    """One scored item: the cacheable raw material of every metric."""

    id: str
    gold: int
    scores: list[list[float]]  # per choice: [logprob_sum, n_tokens, n_bytes]


def _choice_scores(scorer: Scorer, groups: Sequence[Group],
                   logprobs: Sequence[Sequence[np.ndarray]]) -> list[list[float]]:
    out = []
    for group, lps in zip(groups, logprobs, strict=True):
        for seq, start, lp in zip(group.seqs, group.starts, lps, strict=True):
            n_bytes = sum(scorer.piece_bytes(t) for t in seq[start:])
            out.append([float(lp.sum()), len(lp), n_bytes])
    return out


def score_item(scorer: Scorer, item: Item) -> list[list[float]]:
    """[[logprob_sum, n_tokens, n_bytes], ...] for every choice of `item`, scored alone."""
    groups = item_groups(scorer, item)
    ctx = scorer.branching()
    lps: list[list[np.ndarray]] = []
    for g in groups:
        lps.extend(ctx.score([g]))
    return _choice_scores(scorer, groups, lps)


def score_items(
    scorer: Scorer,
    items: Sequence[Item],
    progress: Callable[[int], None] | None = None,
    pack: bool = False,
) -> list[ItemRecord]:
    """Per-item records {id, gold, scores} (the cacheable raw material of every metric).

    Every item is one llama.cpp batch (its context once, the KV cache branched per choice),
    as llama-perplexity does with 4 parallel sequences; with `pack`, consecutive items share
    one batch while their tokens and choices fit the context (measured slower on the CPU, and
    an item's figures then depend slightly on its neighbours: off by default).
    """
    if any(it.shared_prefix for it in items):
        return _score_by_prefix(scorer, items, progress, pack)
    return _score_in_order(scorer, items, progress, pack)


def _score_by_prefix(scorer: Scorer, items: Sequence[Item],
                     progress: Callable[[int], None] | None, pack: bool) -> list[ItemRecord]:
    """Items grouped by their few-shot prefix: each prefix decoded once into the KV cache
    and shared by every item of its group; the records come back in the items' order."""
    ctx = scorer.branching()
    by_prefix: dict[str, list[int]] = {}
    for i, it in enumerate(items):
        by_prefix.setdefault(it.shared_prefix, []).append(i)
    records: dict[int, ItemRecord] = {}

    def score(idx: list[int]) -> None:
        for i, rec in zip(idx, _score_in_order(scorer, [items[i] for i in idx], progress,
                                               pack), strict=True):
            records[i] = rec

    try:
        for prefix, idx in by_prefix.items():
            tokens = prefix_tokens(scorer, prefix, items[idx[0]]) if prefix else []
            sharing = [i for i in idx if tokens and all(
                seq[:len(tokens)] == tokens for seq in item_tokens(scorer, items[i]))]
            ctx.load_prefix(tokens if sharing else [])
            score(sharing)
            rest = [i for i in idx if i not in set(sharing)]
            if rest:  # a tokenizer boundary that differs: these items decode in full
                ctx.load_prefix([])
                score(rest)
    finally:
        ctx.load_prefix([])
    return [records[i] for i in range(len(items))]


def prefix_tokens(scorer: Scorer, prefix: str, item: Item) -> list[int]:
    """The tokens of `prefix` as they appear inside an item's text: a tokenizer may split the
    prefix's end differently when text follows it (GPT-2-style pre-tokenizers turn a final
    "\n\n" into "\n" + "\n" before a word), so the shared tokens are the common part of
    the prefix alone and of the prefix followed by the item."""
    alone = scorer.tokenize(prefix)
    return alone[:common_prefix_len(alone, scorer.tokenize(item.texts()[0]))]


def _score_in_order(scorer: Scorer, items: Sequence[Item],
                    progress: Callable[[int], None] | None, pack: bool) -> list[ItemRecord]:
    records: list[ItemRecord] = []
    if not pack:
        for item in items:
            records.append({"id": item.id, "gold": item.gold,
                            "scores": score_item(scorer, item)})
            if progress is not None:
                progress(1)
        return records
    ctx = scorer.branching()
    pending: list[tuple[Item, list[Group]]] = []

    def flush() -> None:
        groups = [g for _, gs in pending for g in gs]
        lps = ctx.score(groups) if groups else []
        i = 0
        for item, gs in pending:
            scores = _choice_scores(scorer, gs, lps[i:i + len(gs)])
            i += len(gs)
            records.append({"id": item.id, "gold": item.gold, "scores": scores})
            if progress is not None:
                progress(1)
        pending.clear()

    for item in items:
        gs = item_groups(scorer, item)
        if len(gs) > 1:  # too long to share the cache: alone, one choice at a time
            flush()
            lps = [lp for g in gs for lp in ctx.score([g])]
            records.append({"id": item.id, "gold": item.gold,
                            "scores": _choice_scores(scorer, gs, lps)})
            if progress is not None:
                progress(1)
            continue
        if pending and not ctx.fits([g for _, p in pending for g in p] + gs):
            flush()
        pending.append((item, gs))
    flush()
    return records


def _argmax(values: Sequence[float]) -> int:
    best = 0
    for i in range(1, len(values)):
        if values[i] > values[best]:
            best = i
    return best


def predictions(scores: Sequence[Sequence[float]]) -> dict[str, int]:
    """The chosen index under each ranking."""
    return {
        "raw": _argmax([s[0] for s in scores]),
        "norm": _argmax([s[0] / max(s[2], 1) for s in scores]),
        "token_norm": _argmax([s[0] / max(s[1], 1) for s in scores]),
    }


def summarize(records: Sequence[ItemRecord]) -> dict[str, object]:
    """Accuracies, correct counts and Wilson 95 % intervals under the three rankings."""
    n = len(records)
    if n == 0:
        raise ValueError("no items to summarize")
    correct = dict.fromkeys(METRICS, 0)
    for rec in records:
        for metric, choice in predictions(rec["scores"]).items():
            correct[metric] += int(choice == rec["gold"])
    out: dict[str, object] = {"n": n}
    for metric, key in METRICS.items():
        suffix = "" if metric == "raw" else "_" + metric
        out[key] = correct[metric] / n
        out["ci95" + suffix] = list(wilson_interval(correct[metric], n))
        out["n_correct" + suffix] = correct[metric]
    out["chance_accuracy"] = sum(1 / len(r["scores"]) for r in records) / n
    return out
