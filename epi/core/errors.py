"""The one exception type for user mistakes: the CLI prints it as one line and exits 2.

Standard library only, so the meter side (and nothing of host/) can raise it.
"""


def one_line(text: str) -> str:
    """`text` with every character a terminal would not print as itself (a newline, a tab, a
    NUL, an escape) written as its Python escape, so a message that quotes hostile input
    (a field name from a file, a value) stays one line."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


class UserError(Exception):
    """A problem with the user's input (file, field, value) — never a bug.

    The message should name the file, the field and the problem in one line; whatever it
    quotes, it is kept to one (`one_line`).
    """

    exit_code = 2

    def __init__(self, message: object = "", *args: object) -> None:
        super().__init__(one_line(str(message)), *args)
