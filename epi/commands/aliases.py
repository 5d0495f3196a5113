"""One name per concept on the command line, with the old spellings kept for one release.

epi's options say `--out` for every output and `--trace` for every trace directory. A
renamed option keeps its old spelling as a hidden alias (`renamed_option`): it still works,
says on stderr which name to use, and giving both is a usage error. `SYNONYMS` lists the
spellings that must not come back as visible options; tests/test_cli_vocabulary.py walks
the whole click tree (lazy groups included) against it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import click
from click.core import ParameterSource

F = TypeVar("F", bound=Callable[..., object])

#: the one name of each concept → spellings that mean the same and must stay hidden
SYNONYMS: dict[str, tuple[str, ...]] = {
    "--out": ("--output", "--out-dir", "--outdir", "--output-dir", "--out-file"),
    "--trace": ("--meter-trace", "--trace-dir"),
    "--json": ("--as-json", "--json-out"),
    "--threads": ("--n-threads", "--nthreads"),
    "--meter": ("--meter-url",),
    "--seed": ("--random-seed",),
}


def _meta_key(new: str) -> str:
    return f"epi.alias{new}"


def renamed_option(old: str, new: str) -> Callable[[F], F]:
    """A hidden `old` spelling of the option `new` (declared on the same command, with
    `prefer_alias` as its callback): it warns and hands its value to `new`."""

    def remember(ctx: click.Context, param: click.Parameter, value: object) -> object:
        if value is not None:
            click.echo(f"epi: warning: {old} is now {new}; {old} goes in the next release",
                       err=True)
            ctx.meta[_meta_key(new)] = (old, value)
        return value

    # its own parameter name: `--output` would otherwise share `--out`'s name `output`
    ident = "alias_" + old.lstrip("-").replace("-", "_")
    return click.option(old, ident, default=None, hidden=True, expose_value=False,
                        callback=remember, type=click.UNPROCESSED,
                        help=f"The old spelling of {new}.")


def prefer_alias(new: str) -> Callable[[click.Context, click.Parameter, object], object]:
    """The callback of `new`: its value, or the hidden alias's when only that was given."""

    def pick(ctx: click.Context, param: click.Parameter, value: object) -> object:
        given = ctx.meta.get(_meta_key(new))
        if given is None:
            return value
        old, alias_value = given
        source = ctx.get_parameter_source(param.name) if param.name else None
        if source in (ParameterSource.COMMANDLINE, ParameterSource.ENVIRONMENT):
            raise click.UsageError(f"give {new} only ({old} is its old spelling)")
        return param.type_cast_value(ctx, alias_value)

    return pick
