"""The host side's exception types, in one place (gpiozero keeps one exc.py the same way).

Every one is a `epi.core.errors.UserError`: the CLI prints it as one line and exits with its
`exit_code`; none is a bug.
"""

from __future__ import annotations

from epi.core.errors import UserError


class StepFailed(UserError):
    """A campaign step failed (its own error, or its log's last line, says why)."""

    exit_code = 1


class SearchRoundFailed(UserError):
    """A search round's campaign failed; running `epi search` again continues it."""

    exit_code = 1
