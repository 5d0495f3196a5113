"""Notes that many runs share, said once: "runs a, b, c: NOTE" instead of one line per run
(a study of 12 runs of one build printed the same CPU-feature note 12 times)."""

from __future__ import annotations

from collections.abc import Iterable

#: run names listed in full up to this many; beyond, the first few and a count
MAX_NAMED = 4


def collect(per_run: Iterable[tuple[str, str]]) -> list[str]:
    """(run name, note) pairs → one line per distinct note, in first-seen order, naming the
    runs it applies to."""
    runs_of: dict[str, list[str]] = {}
    for run, note in per_run:
        names = runs_of.setdefault(note, [])
        if run not in names:
            names.append(run)
    out = []
    for note, names in runs_of.items():
        if len(names) == 1:
            out.append(f"{names[0]}: {note}")
            continue
        shown = names if len(names) <= MAX_NAMED else [*names[:MAX_NAMED - 1], "…"]
        out.append(f"{len(names)} runs ({', '.join(shown)}): {note}")
    return out
