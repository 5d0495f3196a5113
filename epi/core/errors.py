"""The one exception type for user mistakes: the CLI prints it as one line and exits 2.

Standard library only, so the meter side (and nothing of host/) can raise it.
"""


class UserError(Exception):
    """A problem with the user's input (file, field, value) — never a bug.

    The message should name the file, the field and the problem in one line.
    """

    exit_code = 2
