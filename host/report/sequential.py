"""The campaign's sequential verdicts in the report.

An adaptive campaign (`[decide]` in the study file) decides its comparisons with an
anytime-valid confidence sequence after each round and writes the last decision to
`analysis/decisions.json` (host.campaign.adaptive_round). The report's own paired intervals
are fixed-sample intervals over the final data: they do not account for the campaign's
repeated looks. So when the file is there the answer block states the sequential verdicts
beside them and says which to trust; a damaged file is refused in one line, never ignored.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from epi.core.errors import UserError
from epi.formats.fields import read_json_object

DECISIONS_FILE = "decisions.json"


@dataclass(frozen=True)
class SequentialDecisions:
    """What decisions.json says: rounds done, one line per comparison, counts per state
    (decided / equivalent / undecided), whether the budget ran out, the method and alpha."""

    rounds_done: int
    lines: list[str]
    states: dict[str, int]
    budget_spent: bool
    method: str
    alpha: float
    # (config a, config b) → (state, line): the one verdict of each comparison, either order
    by_pair: dict[tuple[str, str], tuple[str, str]] = field(default_factory=dict)
    # the command that would settle what the budget left undecided (`--extend-budget`)
    settle_command: str | None = None

    def verdict(self, a: str, b: str) -> tuple[str, str] | None:
        """The sequential (state, line) of the comparison of `a` and `b`, in either order."""
        return self.by_pair.get((a, b)) or self.by_pair.get((b, a))


def load_decisions(analysis_dir: Path) -> SequentialDecisions | None:
    """decisions.json of an adaptive campaign's analysis, or None when there is none."""
    path = analysis_dir / DECISIONS_FILE
    if not path.exists():
        return None
    doc = read_json_object(path, "sequential decisions")

    def bad(field: str, want: str) -> UserError:
        return UserError(f"{path}: field {field!r} must be {want}")

    rounds, lines, states = doc.get("rounds_done"), doc.get("lines"), doc.get("states")
    spent, method, alpha = doc.get("budget_spent"), doc.get("method"), doc.get("alpha")
    if not isinstance(rounds, int) or isinstance(rounds, bool) or rounds < 0:
        raise bad("rounds_done", "a whole number ≥ 0")
    if not isinstance(lines, list) or not all(isinstance(x, str) for x in lines):
        raise bad("lines", "a list of strings")
    if not isinstance(states, dict) or not all(
            isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool) and v >= 0
            for k, v in states.items()):
        raise bad("states", "an object of whole counts ≥ 0")
    if not isinstance(spent, bool):
        raise bad("budget_spent", "true or false")
    if not isinstance(method, str) or not method:
        raise bad("method", "a non-empty string")
    if (not isinstance(alpha, int | float) or isinstance(alpha, bool)
            or not 0.0 < float(alpha) < 1.0):
        raise bad("alpha", "a number in (0, 1)")
    notes = doc.get("notes", [])
    if not isinstance(notes, list) or not all(isinstance(x, str) for x in notes):
        raise bad("notes", "a list of strings")
    if sum(states.values()) != len(lines):
        raise UserError(f"{path}: states count {sum(states.values())} comparisons but "
                        f"lines hold {len(lines)}")
    by_pair: dict[tuple[str, str], tuple[str, str]] = {}
    records = doc.get("comparisons", [])  # absent in decisions written before it existed
    if not isinstance(records, list):
        raise bad("comparisons", "a list of records")
    for i, r in enumerate(records):
        if not (isinstance(r, dict) and all(isinstance(r.get(k), str) and r.get(k)
                                            for k in ("a", "b", "state", "text"))):
            raise bad(f"comparisons[{i}]", "a record with a, b, state and text")
        by_pair[(str(r["a"]), str(r["b"]))] = (str(r["state"]), str(r["text"]))
    settle = doc.get("settle_command")
    if settle is not None and not isinstance(settle, str):
        raise bad("settle_command", "a string or null")
    return SequentialDecisions(rounds, list(lines), dict(states), spent, method, float(alpha),
                               by_pair, settle or None)


def limit_line(dec: SequentialDecisions) -> str:
    """One plain sentence for the answer block's limits."""
    n = len(dec.lines)
    states = ", ".join(f"{v} {k}" for k, v in sorted(dec.states.items())) or "none"
    spent = "; the budget is spent" if dec.budget_spent else ""
    return (f"The campaign's sequential verdicts ({dec.method}; {1 - dec.alpha:.0%} coverage "
            f"at every look) on {n} comparison(s) after {dec.rounds_done} round(s): "
            f"{states}{spent}. "
            "The fixed-sample intervals in this report do not account for the campaign's "
            "repeated looks: where the two disagree, trust the sequential verdict, listed "
            "here: " + " | ".join(dec.lines)) + _settle(dec.settle_command)


def _settle(line: str | None) -> str:
    """'. What would settle the undecided ones: `COMMAND` (why)' from the campaign's line."""
    if not line or ": " not in line:
        return ""
    command, _, why = line.split(": ", 1)[1].partition(" (")
    return f". What would settle the undecided ones: `{command}`" + (f" ({why}" if why else "")
