"""More measuring time for a campaign whose budget ran out (`--extend-budget 10m`).

A study's `[decide] time_budget_min` stops the adaptive rounds; comparisons still undecided
then end "undecided after the budget". Extending the budget is a record in the campaign
directory (`budget.json`: every extension with its time), so the plan stays a function of the
study file and of what the campaign recorded: the decision that ended the rounds for lack of
time is set aside (kept as `decisions.before-extension-N.json`), and the resumed campaign
decides again after that round with the larger budget, measures the rounds that now fit,
and analyses and reports again.

An extension cannot lift `decide.max_rounds`: a campaign stopped by its round limit says so.
"""

from __future__ import annotations

import json
import math
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path

from epi.core.errors import UserError
from epi.core.files import write_json_atomic
from host.analysis.vocabulary import VerdictState
from host.campaign.adaptive_round import DECISIONS_JSON, assess_dir, decided_rounds
from host.campaign.study import Study

BUDGET_JSON = "budget.json"
BUDGET_FORMAT = "epi-budget-extensions"
_DURATION = re.compile(r"(\d+(?:\.\d+)?)\s*(s|m|min|h)?\Z")
_UNIT_S = {"s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0}
MAX_EXTENSION_S = 7 * 24 * 3600.0


@dataclass(frozen=True)
class Extension:
    """One `--extend-budget`: seconds of measuring added, and when."""

    seconds: float
    t_real_ns: int


def parse_duration(text: str) -> float:
    """'10m', '90s', '1.5h', '600' (seconds) → seconds; ValueError with the reason."""
    m = _DURATION.match(text.strip())
    if not m:
        raise ValueError(f"{text!r} is not a duration such as 10m, 90s or 1h")
    seconds = float(m.group(1)) * _UNIT_S[m.group(2) or "s"]
    if not 0 < seconds <= MAX_EXTENSION_S:
        raise ValueError(f"{text!r} must be above 0 and at most 7 days")
    return seconds


def read_extensions(root: Path) -> list[Extension]:
    """The extensions recorded in campaign directory `root` ([] when none)."""
    path = root / BUDGET_JSON
    if not path.is_file():
        return []
    try:
        doc = json.loads(path.read_text())
        if doc.get("format") != BUDGET_FORMAT:
            raise ValueError(f"not an {BUDGET_FORMAT} document")
        return [Extension(float(e["seconds"]), int(e["t_real_ns"])) for e in doc["extensions"]]
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise UserError(f"{path}: unreadable budget record ({exc}); remove it to measure "
                        "within the study file's budget") from None


def with_extensions(study: Study) -> Study:
    """`study` with its time budget raised by every extension its campaign recorded."""
    dec = study.decide
    if dec is None or dec.rules.time_budget_s is None:
        return study
    extra = sum(e.seconds for e in read_extensions(study.out))
    if not extra:
        return study
    rules = replace(dec.rules, time_budget_s=dec.rules.time_budget_s + extra)
    return replace(study, decide=replace(dec, rules=rules))


def extend(study: Study, seconds: float) -> list[str]:
    """Record an extension of `seconds` and reopen the decision that the budget ended.

    Refused (one line) when the study has no time budget, when nothing has been measured
    yet, or when the rounds ended for another reason (every comparison settled, or
    decide.max_rounds reached)."""
    dec = study.decide
    where = f"{study.path}: --extend-budget"
    budget_s = dec.rules.time_budget_s if dec is not None else None
    if dec is None or budget_s is None:
        raise UserError(f"{where}: the study has no [decide] time_budget_min to extend")
    rules = dec.rules
    added = decided_rounds(study.out, rules.min_rounds)
    last = added[-1][0] if added else rules.min_rounds
    saved = assess_dir(study.out, last) / DECISIONS_JSON
    lines: list[str] = []
    if saved.is_file():
        try:
            doc = json.loads(saved.read_text())
            spent, nxt = bool(doc["budget_spent"]), list(doc["next_configs"])
        except (OSError, ValueError, KeyError, TypeError):
            raise UserError(f"{saved}: unreadable decision; remove it and run the campaign "
                            "again") from None
        if not nxt:
            if last >= rules.max_rounds:
                raise UserError(f"{where}: the rounds stopped at decide.max_rounds ({last}), "
                                "not at the time budget: raise max_rounds in the study file")
            if not spent:
                raise UserError(f"{where}: every named comparison is already settled; "
                                "there is nothing more to measure")
            olds = sorted(saved.parent.glob("decisions.before-extension-*.json"))
            kept = saved.parent / f"decisions.before-extension-{len(olds) + 1}.json"
            saved.replace(kept)
            lines.append(f"the decision after round {last} (budget spent) is kept as {kept}; "
                         "the campaign decides again with the larger budget")
    elif not (study.out / "journal.jsonl").is_file():
        raise UserError(f"{where}: {study.out} holds no campaign yet; run it first (the "
                        "study file's budget applies)")
    old = read_extensions(study.out)
    new = [*old, Extension(seconds, time.time_ns())]
    write_json_atomic(study.out / BUDGET_JSON, {
        "format": BUDGET_FORMAT, "format_version": 1,
        "extensions": [{"seconds": e.seconds, "t_real_ns": e.t_real_ns} for e in new]})
    total_min = (budget_s + sum(e.seconds for e in new)) / 60
    lines.insert(0, f"measuring budget extended by {seconds / 60:g} min: "
                    f"{total_min:g} min in all (study file {budget_s / 60:g} min, "
                    f"{len(new)} extension(s); {study.out / BUDGET_JSON})")
    return lines


def settle_line(decision: Mapping[str, object], study_path: Path, root: Path,
                per_run_s: float | None, max_rounds: int) -> str | None:
    """The one command that would settle what the budget left undecided, from the campaign's
    final decision (decisions.json): how many more rounds the slowest undecided comparison
    that decide.max_rounds can still settle needs at the spread measured, of how many
    configurations, at the measured time per run; comparisons beyond the round limit are
    named apart. None when the budget did not end the rounds."""
    try:
        spent, done = bool(decision["budget_spent"]), int(str(decision["rounds_done"]))
        records = decision.get("comparisons", [])
        assert isinstance(records, list)
        comps = [c for c in records
                 if isinstance(c, dict) and c.get("state") == VerdictState.UNDECIDED]
    except (KeyError, TypeError, ValueError, AssertionError):
        return None
    if not spent or not comps:
        return None
    needs = {id(c): int(c["rounds_needed"]) for c in comps
             if isinstance(c.get("rounds_needed"), int)}
    # aim at the comparisons the study's round limit can still settle; one that needs far
    # more rounds would make the command absurd for all the others: it is named instead
    within = [c for c in comps if needs.get(id(c), max_rounds + 1) <= max_rounds]
    aim = within or comps
    left = [c for c in comps if c not in aim]
    configs = {str(c["a"]) for c in aim} | {str(c["b"]) for c in aim}
    more = [max(needs[id(c)] - done, 1) for c in aim if id(c) in needs]
    if more and per_run_s:
        minutes = max(1, math.ceil(max(more) * len(configs) * per_run_s / 60))
        why = (f"about {max(more)} more round(s) of {len(configs)} configuration(s) at "
               f"~{per_run_s:.0f} s a run, at the spread measured")
        if done + max(more) > max_rounds:
            why += f"; it also needs decide.max_rounds >= {done + max(more)} in the study file"
    else:
        minutes = 10
        why = "how many rounds is not known yet: too few paired rounds to measure the spread"
    if left:
        why += "; not " + ", ".join(
            f"{c['a']} → {c['b']} (about {needs[id(c)]} rounds)" if id(c) in needs
            else f"{c['a']} → {c['b']}" for c in left)
    what = (f"the {len(comps)} comparison(s)" if not left
            else f"{len(aim)} of the {len(comps)} comparison(s)")
    return (f"to settle {what} the budget left undecided: "
            f"epi campaign {study_path} --out {root} --extend-budget {minutes}m ({why})")
