"""Write docs/commands.md: every `epi` command and option with its help, from the click tree
itself (the lazy `epi meter` group included). `tests/test_commands_doc.py` fails when the
committed page differs from what this prints, so the reference cannot go stale.

usage: python scripts/gen_commands_doc.py [--check]
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import click

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

PAGE = REPO / "docs" / "commands.md"


def _walk() -> list[tuple[str, click.Command]]:
    from epi import cli as cli_mod

    out = []
    for name, target in cli_mod.COMMANDS.items():
        module, attr = target.split(":")
        stack = [(name, getattr(importlib.import_module(module), attr))]
        while stack:
            path, c = stack.pop(0)
            out.append((path, c))
            if isinstance(c, click.Group):
                ctx = click.Context(c, info_name=path)
                stack += [(f"{path} {n}", c.get_command(ctx, n)) for n in c.list_commands(ctx)]
    return out


def _option_line(p: click.Parameter) -> str:
    names = ", ".join(f"`{o}`" for o in (*p.opts, *p.secondary_opts))
    help_text = " ".join((getattr(p, "help", None) or "").split())
    return f"| {names} | {help_text.replace('|', '/')} |"


def render() -> str:
    lines = ["# Every `epi` command and option", "",
             "Generated from the command line itself by `scripts/gen_commands_doc.py` "
             "(`tests/test_commands_doc.py` keeps it current). The guides that explain each "
             "command are listed in the README's command table.", ""]
    for path, cmd in _walk():
        ctx = click.Context(cmd, info_name=f"epi {path}")
        lines += [f"## `epi {path}`", ""]
        first = (cmd.help or cmd.short_help or "").strip().split("\n\n")[0]
        lines += [" ".join(first.split()), ""] if first else []
        lines += ["```", cmd.get_usage(ctx).strip(), "```", ""]
        opts = [p for p in cmd.params if isinstance(p, click.Option) and not p.hidden]
        if opts:
            lines += ["| option | what |", "|---|---|", *(_option_line(p) for p in opts), ""]
    return "\n".join(lines).rstrip() + "\n"


def main() -> int:
    text = render()
    if "--check" in sys.argv:
        return 0 if PAGE.read_text() == text else 1
    PAGE.write_text(text)
    print(f"wrote {PAGE}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
