"""The host side's exception types, in one place (gpiozero keeps one exc.py the same way).

Every one but `RecordError` is a `epi.core.errors.UserError`: the CLI prints it as one line
and exits with its `exit_code`; none is a bug. `RecordError` is a `ValueError` on purpose: it
names only the field, and the reader that catches it adds the file and row before raising a
`UserError` (a bare record error never reaches the user).
"""

from __future__ import annotations

from epi.core.errors import UserError


class StepFailed(UserError):
    """A campaign step failed (its own error, or its log's last line, says why)."""

    exit_code = 1


class SearchRoundFailed(UserError):
    """A search round's campaign failed; running `epi search` again continues it."""

    exit_code = 1


class RunFailed(UserError):
    """The run started but did not complete; its token log says "failed" with the reason."""

    exit_code = 1


class StoreError(UserError):
    """An accuracy store entry that must not be used: foreign, edited, corrupt or inconsistent."""


class RecordError(ValueError):
    """A record lacks a field or has a bad value; readers add the file and row."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"field {field!r}: {problem}")
        self.field = field
        self.problem = problem
