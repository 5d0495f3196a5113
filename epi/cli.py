"""The `epi` command. Sub-commands load lazily: `epi meter ...` imports nothing from host/."""

from __future__ import annotations

import importlib
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import click

from epi import __version__
from epi.core.errors import UserError
from epi.core.paths import epi_home

# name -> "module:attribute", imported only when that command runs (or for --help listings).
COMMANDS: dict[str, str] = {
    "demo": "epi.commands.demo:demo",
    "doctor": "epi.commands.doctor:doctor",
    "model": "epi.commands.model:model",
    "maps": "epi.commands.maps:maps",
    "quantize": "epi.commands.quantize:quantize",
    "run": "epi.commands.run:run",
    "worker": "epi.commands.worker:worker",
    "accuracy": "epi.commands.accuracy:accuracy",
    "data": "epi.commands.data:data",
    "analyze": "epi.commands.analyze:analyze",
    "search": "epi.commands.search:search",
    "meter": "epi.commands.meter_group:meter",
    "campaign": "epi.commands.campaign:campaign",
    "report": "epi.commands.report:report",
    "bundle": "epi.commands.bundle:bundle",
    "compare": "epi.commands.compare:compare",
    "submit": "epi.commands.submit:submit",
    "check-submission": "epi.commands.check_submission:check_submission",
    "site": "epi.commands.site:site",
}

HELP = {
    "demo": "Run the main job end to end on the embedded default.",
    "doctor": "Say what this machine has for epi, with the fix for what is missing.",
    "model": "Prepare base models (offline).",
    "maps": "Check and show quantization mix maps.",
    "quantize": "Quantize a base GGUF with one or more mix maps.",
    "run": "Run inference and log every token's time.",
    "worker": "Start a llama.cpp RPC worker.",
    "accuracy": "Perplexity and multiple-choice accuracy of models.",
    "data": "Prepare evaluation data (offline).",
    "analyze": "Joules per token, EPI and Pareto from traces and token logs.",
    "search": "Search per-layer quantization maps that beat hand-made ones on EPI.",
    "meter": "The meter side: read, calibrate and run the daemon.",
    "campaign": "Run a whole study (STUDY.toml): resumable, interleaved, ends in a report.",
    "report": "HTML + Markdown report with figures from an analysis directory.",
    "bundle": "One archive of an analysis and all behind it, hashed (or --unpack one).",
    "compare": "Bundles side by side; unfair differences (build, power, items) flagged.",
    "submit": "One community submission: the bundle and its checked summary.",
    "check-submission": "Recompute every figure of submissions from their bundles.",
    "site": "Static leaderboard site from data/community submissions.",
}


class LazyGroup(click.Group):
    """A click group whose commands are imported on first use.

    `commands` maps a name to "module:attribute"; `help_lines` gives the one-line help shown
    in listings, so `--help` imports no sub-command.
    """

    def __init__(
        self,
        name: str | None = None,
        *,
        commands: dict[str, str] | None = None,
        help_lines: dict[str, str] | None = None,
        **attrs: Any,  # click.Group's own settings (each typed by click), passed through
    ) -> None:
        super().__init__(name, **attrs)
        self.lazy_commands = commands if commands is not None else COMMANDS
        self.help_lines = help_lines if help_lines is not None else HELP

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(self.lazy_commands)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        target = self.lazy_commands.get(cmd_name)
        if target is None:
            return None
        module_name, attr = target.split(":")
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            missing = exc.name or "?"
            extra = "meter" if module_name.startswith("epi.commands.meter") else "host"
            raise click.ClickException(
                f"`{ctx.command_path} {cmd_name}` needs the Python module {missing!r}: "
                f"install with `pip install -e '.[{extra}]'` (or run `make setup`)"
            ) from exc
        return getattr(module, attr)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        with formatter.section("Commands"):
            formatter.write_dl(
                [(name, self.help_lines.get(name, "")) for name in self.list_commands(ctx)]
            )


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="epi")
def cli() -> None:
    """epi — which per-layer GGUF quantization mix gives the cheapest useful token?"""


def crash_log_path() -> Path:
    """Where an internal error's traceback goes: $EPI_HOME/logs (default ~/.cache/epi/logs)."""
    return epi_home() / "logs" / f"crash-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.log"


def _report_bug(exc: BaseException) -> None:
    """An internal error (a bug): one short line on screen, the traceback in a log file."""
    text = "".join(traceback.format_exception(exc))
    where = crash_log_path()
    try:
        where.parent.mkdir(parents=True, exist_ok=True)
        where.write_text(f"argv: {sys.argv!r}\n{text}")
        saved = f"traceback in {where}"
    except OSError:
        saved = "the traceback could not be saved"
    click.echo(f"epi: internal error ({type(exc).__name__}: {str(exc)[:200]}); this is a bug, "
               f"{saved}", err=True)


def usage_line(exc: click.UsageError) -> str:
    """`--option: problem` for a bad option value; click's own text for other usage errors."""
    param = getattr(exc, "param", None)
    if isinstance(exc, click.BadParameter) and param is not None:
        names = [o for o in getattr(param, "opts", []) if o.startswith("--")]
        hint = names[0] if names else (param.name or "?").upper()
        return f"{hint}: {exc.message}"
    return exc.format_message()


def main() -> None:
    """Console entry point: user errors become one line and exit code 2; a bug exits 1 with
    one line, its traceback written to a log file (`crash_log_path`)."""
    try:
        cli.main(standalone_mode=False)
    except UserError as exc:
        click.echo(f"epi: error: {exc}", err=True)
        sys.exit(exc.exit_code)
    except click.exceptions.Abort:
        click.echo("epi: aborted", err=True)
        sys.exit(130)
    except click.UsageError as exc:  # a bad option value: one line naming the option
        click.echo(f"epi: error: {usage_line(exc)}", err=True)
        sys.exit(exc.exit_code)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        click.echo("epi: interrupted", err=True)
        sys.exit(130)
    except Exception as exc:  # the last line of defence: never a traceback on screen
        _report_bug(exc)
        sys.exit(1)


if __name__ == "__main__":
    main()
