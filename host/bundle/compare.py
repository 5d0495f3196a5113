"""Bundles side by side: configurations joined on model and map hashes, and every
difference that makes the comparison unfair, flagged with what it means.

A configuration is the same across bundles when its GGUF's sha256 and its mix map's sha256
are the same (the name may differ between labs; a name shared by different files is not
joined). A fact that differs between bundles (host/bundle/facts.py: build flags, llama.cpp
version, the build's CPU features, power source, calibration, accuracy item sets and metric)
is listed as UNFAIR with each bundle's value; the figures are still shown, so a reader sees
what the difference applies to.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from epi.core.errors import UserError
from epi.core.text import DASH, format_number
from epi.formats.json_types import JSON
from host.bundle.facts import ASPECTS, FLAG_ASPECTS, Config, Facts

#: `epi compare`'s exit status when a difference makes the comparison unfair (the report
#: is still printed and written): 1 is an internal error and 2 a usage error in epi
EXIT_UNFAIR = 3
#: the JSON document's format name and version (`epi compare --json`)
COMPARE_FORMAT, COMPARE_VERSION = "epi-compare", 1


@dataclass(frozen=True)
class Difference:
    aspect: str
    meaning: str
    values: tuple[str, ...]  # one per bundle, in order


def differences(all_facts: Sequence[Facts]) -> list[Difference]:
    """Every fairness aspect whose value is not the same in all bundles."""
    out = []
    for aspect, meaning in ASPECTS.items():
        values = tuple(f.aspects.get(aspect, "(not recorded)") for f in all_facts)
        if len(set(values)) > 1:
            out.append(Difference(aspect, meaning, values))
    return out


def shown_values(d: Difference) -> tuple[str, ...]:
    """Each bundle's value as the report prints it: for flag lists only the flags that not
    every bundle has, with the number of shared ones."""
    if d.aspect not in FLAG_ASPECTS:
        return d.values
    shared = set.intersection(*(set(v.split()) for v in d.values))
    more = f"  (+{len(shared)} shared)" if shared else ""
    return tuple((" ".join(t for t in v.split() if t not in shared) or "(no flag of its own)")
                 + more for v in d.values)


def check_bases(all_facts: Sequence[Facts], labels: Sequence[str], mixed: bool) -> None:
    """Refuse to set gross figures beside net ones unless told: the two differ by the idle
    draw, so a table of both reads as a difference in the configurations."""
    bases = {f.energy_basis for f in all_facts}
    if len(bases) > 1 and not mixed:
        shown = ", ".join(f"{label}: {f.energy_basis}"
                          for label, f in zip(labels, all_facts, strict=True))
        raise UserError(f"the bundles report different energy bases ({shown}); compare "
                        "analyses on one basis (epi analyze --energy-basis), or pass "
                        "--mixed-basis to show each on its own, flagged")


def _keys(all_facts: Sequence[Facts]) -> list[tuple[str | None, str | None]]:
    keys: list[tuple[str | None, str | None]] = []
    for f in all_facts:
        keys += [k for k in f.configs if k not in keys]
    return keys


def document(all_facts: Sequence[Facts]) -> dict[str, JSON]:
    """The comparison as one JSON document (`epi compare --json`; docs/bundle.md)."""
    keys = _keys(all_facts)
    diffs = differences(all_facts)
    return {
        "format": COMPARE_FORMAT, "format_version": COMPARE_VERSION,
        "bundles": [{"label": f.label, "energy_basis": f.energy_basis} for f in all_facts],
        "configurations": [
            {"model_sha256": k[0], "map_sha256": k[1],
             "figures": [None if (c := f.configs.get(k)) is None else {
                 "config": c.config, "j_per_token": c.j_per_token, "accuracy": c.accuracy,
                 "epi": c.epi, "power_source": c.power_source, "reason": c.reason}
                 for f in all_facts]}
            for k in keys],
        "unfair": [{"aspect": d.aspect, "meaning": d.meaning, "values": list(d.values)}
                   for d in diffs],
        "fair": not diffs,
    }


def _fmt(v: float | None, digits: int = 4) -> str:
    return format_number(v, f".{digits}g", missing=DASH)


def _short(sha: str | None) -> str:
    return sha[:12] if sha else "(none)"


def report(all_facts: Sequence[Facts]) -> list[str]:
    """The comparison as Markdown lines (a table per figure, then the differences)."""
    letters = [chr(ord("A") + i) if i < 26 else f"B{i}" for i in range(len(all_facts))]
    lines = ["# Comparison of bundles", ""]
    lines += [f"- {k}: {f.label}" for k, f in zip(letters, all_facts, strict=True)]
    keys = _keys(all_facts)
    shared = [k for k in keys if all(k in f.configs for f in all_facts)]
    lines += ["", f"Joined on model sha256 + map sha256: {len(shared)} configuration(s) in "
              f"every bundle, {len(keys) - len(shared)} in some only.", ""]
    head = ["config", "model sha256", "map sha256"]
    bases = sorted({f.energy_basis for f in all_facts})
    energy_title = (f"{bases[0]} J per generated token" if len(bases) == 1 else
                    "J per generated token, each bundle on its own basis ("
                    + ", ".join(f"{k}: {f.energy_basis}"
                                for k, f in zip(letters, all_facts, strict=True)) + ")")
    for title, attr in ((energy_title, "j_per_token"),
                        ("accuracy", "accuracy"), ("EPI", "epi")):
        lines += [f"## {title}", "", "| " + " | ".join(head + letters) + " |",
                  "|" + "---|" * (len(head) + len(letters))]
        for k in keys:
            present: list[Config | None] = [f.configs.get(k) for f in all_facts]
            name = next(c.config for c in present if c is not None)
            cells = [_fmt(getattr(c, attr)) if c is not None else "absent" for c in present]
            lines.append("| " + " | ".join([name, _short(k[0]), _short(k[1]), *cells]) + " |")
        lines.append("")
        if attr == "j_per_token":
            notes = [f"- {letter} {c.config}: null: {c.reason[:160]}"
                     for k in keys for letter, f in zip(letters, all_facts, strict=True)
                     if (c := f.configs.get(k)) is not None and c.j_per_token is None
                     and c.reason]
            lines += [*notes, ""] if notes else []
    diffs = differences(all_facts)
    lines += ["## Fairness", ""]
    if not diffs:
        lines.append("No difference found in: " + ", ".join(ASPECTS) + ".")
    for d in diffs:
        lines.append(f"- **UNFAIR: {d.aspect} differ** ({d.meaning}):")
        lines += [f"  - {k}: {v}" for k, v in zip(letters, shown_values(d), strict=True)]
    return lines
