"""Cross-field consistency of an accuracy results file.

Each field of a model entry can be well-formed while the entry contradicts itself, and the EPI
analysis would then use whichever figure it reads first: a composite that is not the weighted
mean of its benchmarks changed an EPI of 0.612 into 0.185, the second of two entries for one
model silently replaced the first, and per-item outcomes that contradict the stated accuracy
drove the paired comparisons. These checks refuse each case in one line naming the file, the
entry and the field.

A composite whose entry holds none of the benchmarks it weighs (a summary file written by
hand) cannot be checked and is taken as stated; one holding some of them must hold all.
Tolerances: a composite may differ from the weighted mean of its benchmarks by COMPOSITE_TOL
(files rounded by hand to three decimals still pass; `epi accuracy` writes the exact mean); a
benchmark's stated accuracy must imply the count of correct items its per-item outcomes hold
(|accuracy × items − correct| < 0.5), so only a rounding of the same count passes.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from epi.core.errors import UserError
from host.accuracy.join_keys import entry_join_key

COMPOSITE_TOL = 1e-3
OUTCOME_KEYS = ("accuracy", "accuracy_norm", "accuracy_token_norm")


def _number(v: object) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def check_composite(entry: Mapping[str, object], where: str) -> None:
    """A non-null composite is the weighted mean of its benchmarks under its metric."""
    comp, benches = entry.get("composite"), entry.get("benchmarks")
    if not isinstance(comp, Mapping) or not isinstance(benches, Mapping):
        return
    stated = _number(comp.get("accuracy"))
    if stated is None:
        return
    w = f"{where}: field composite"
    metric = comp.get("metric")
    if metric not in OUTCOME_KEYS:
        raise UserError(f"{w}.metric: expected one of {', '.join(OUTCOME_KEYS)}, got "
                        f"{metric!r:.40}")
    weights = comp.get("weights")
    if not isinstance(weights, Mapping) or not weights:
        raise UserError(f"{w}.weights: a composite accuracy needs the benchmark weights it "
                        "was averaged with")
    if not any(isinstance(benches.get(b), Mapping) and _number(benches[b].get(metric))
               is not None for b in weights):
        return  # a composite-only entry (no benchmark figures to check it by): as stated
    total = 0.0
    mean = 0.0
    for bench, weight in weights.items():
        block = benches.get(bench)
        value = _number(block.get(metric)) if isinstance(block, Mapping) else None
        wt = _number(weight)
        if value is None or wt is None:
            raise UserError(f"{w}: weighs benchmark {bench!r}, whose {metric} is not in the "
                            "entry")
        total += wt
        mean += wt * value
    if total <= 0:
        raise UserError(f"{w}.weights: sum to zero")
    mean /= total
    if not math.isclose(stated, mean, abs_tol=COMPOSITE_TOL, rel_tol=0.0):
        raise UserError(f"{w}.accuracy: {stated:.4f} is not the weighted mean of its "
                        f"benchmarks' {metric} ({mean:.4f})")


def check_items_agree(entry: Mapping[str, object], where: str) -> None:
    """Per-item outcomes, where stored, hold the stated accuracy and count of every ranking."""
    benches = entry.get("benchmarks")
    if not isinstance(benches, Mapping):
        return
    for name, block in benches.items():
        if not isinstance(block, Mapping) or not isinstance(block.get("items"), Mapping):
            continue
        items = block["items"]
        w = f"{where}: field benchmarks.{name}"
        ids = items.get("ids")
        n_items = len(ids) if isinstance(ids, list) else 0
        n = block.get("n")
        if isinstance(n, int) and not isinstance(n, bool) and n != n_items:
            raise UserError(f"{w}.n: {n} items stated, {n_items} per-item outcomes stored")
        for key in OUTCOME_KEYS:
            outcomes, stated = items.get(key), _number(block.get(key))
            if not isinstance(outcomes, list) or stated is None or not n_items:
                continue
            correct = sum(1 for v in outcomes if v == 1)
            if abs(stated * n_items - correct) >= 0.5:
                raise UserError(f"{w}.{key}: {stated:.4f} contradicts its per-item outcomes "
                                f"({correct} of {n_items} right = {correct / n_items:.4f})")


def check_one_entry_per_model(models: Sequence[object], where: str) -> None:
    """Two different entries for one model (sha256) are refused: which one counts?"""
    seen: dict[object, int] = {}
    for i, m in enumerate(models):
        if not isinstance(m, Mapping):
            continue

        sha = entry_join_key(m)  # a split is its own configuration beside its prefill model
        j = seen.setdefault(sha, i)
        if j != i and m != models[j]:
            raise UserError(f"{where}: models[{j}] and models[{i}] are two different entries "
                            f"for one model (sha256 {str(sha)[:12]}…); keep one")


def check_consistency(doc: Mapping[str, object], where: str) -> None:
    """Every cross-field check over a document whose fields are already checked one by one."""
    models = doc.get("models")
    if not isinstance(models, list):
        return
    for i, m in enumerate(models):
        if isinstance(m, Mapping):
            check_composite(m, f"{where}: models[{i}]")
            check_items_agree(m, f"{where}: models[{i}]")
    check_one_entry_per_model(models, where)
