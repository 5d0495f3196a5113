"""`epi maps check|show`: validate mix maps and show how they expand on a model."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import click

from epi.commands.params import (
    BoundedInt,
    check_output_dir,
)
from epi.core.errors import UserError

if TYPE_CHECKING:
    from host.quant.mixmap import TensorInfo
    from host.quant.quant_types import ModelShape


def _shape_and_tensors(model: Path | None, layers: int | None
                       ) -> tuple[ModelShape | None, list[TensorInfo] | None, str | None]:
    from host.quant.gguf_info import read_model

    if model is not None:
        info = read_model(model)
        return info.shape, info.tensors, f"{model.name} ({info.shape.n_layers} layers)"
    if layers is not None:
        return None, None, f"a {layers}-layer model"
    return None, None, None


@click.group()
def maps() -> None:
    """Check and show quantization mix maps (quantmaps/*.json)."""


@maps.command("check")
@click.argument("paths", nargs=-1, type=click.Path(path_type=Path))
@click.option("--model", type=click.Path(path_type=Path), help="Expand against this GGUF.")
@click.option("--layers", type=BoundedInt(1, 100_000), help="Expand against this many layers.")
def check(paths: tuple[Path, ...], model: Path | None, layers: int | None) -> None:
    """Validate maps (default: ./quantmaps) and show their layer groups on a model's depth."""
    from epi.core.text import ranges_text
    from host.quant.mixmap import assign_layers, expand, load_mixmaps

    items = list(paths) or [Path("quantmaps")]
    mixmaps, notices = load_mixmaps(items)
    shape, tensors, target = _shape_and_tensors(model, layers)
    n_layers = shape.n_layers if shape else layers
    for m in mixmaps:
        if n_layers is None:
            form = " [paper form]" if m.form == "paper" else ""
            click.echo(f"{m.id:24} ok  {m.describe_groups()}{form}")
            continue
        groups = assign_layers(m, n_layers)
        text = " · ".join(
            f"{name} {ranges_text(ls)}: {next(g.type for g in m.groups if g.name == name)}"
            for name, ls in groups
        )
        click.echo(f"{m.id:24} ok  {text}{' [paper form]' if m.form == 'paper' else ''}")
        if shape is not None and tensors is not None:
            for w in expand(m, shape, tensors).warnings:
                click.echo(f"warning: {w}", err=True)
    for note in notices:
        click.echo(f"note: {note}")
    suffix = f" on {target}" if target else ""
    click.echo(f"{len(mixmaps)} map(s) valid{suffix}")


@maps.command("import")
@click.argument("paths", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option(
    "--out", "out_dir", required=True, type=click.Path(path_type=Path), help="Directory for maps."
)
@click.option("--force", is_flag=True, help="Replace maps that exist in --out.")
def import_(paths: tuple[Path, ...], out_dir: Path, force: bool) -> None:
    """Convert maps (the study paper's form or epi's) into epi's form, one ID.json each."""
    from host.quant.mixmap import import_maps

    check_output_dir(out_dir, "--out")
    for target in import_maps(list(paths), out_dir, force=force):
        click.echo(str(target))


@maps.command("show")
@click.argument("path", type=click.Path(path_type=Path))
@click.option(
    "--model",
    required=True,
    type=click.Path(path_type=Path),
    help="GGUF model to expand the map against.",
)
def show(path: Path, model: Path) -> None:
    """Show the tensor type a map requests for every tensor of MODEL."""
    from host.quant.gguf_info import read_model
    from host.quant.mixmap import expand, load_mixmap

    info = read_model(model)
    exp = expand(load_mixmap(path), info.shape, info.tensors)
    if not exp.tensors:
        raise UserError(f"{model}: no quantizable tensors")
    width = max(len(t.name) for t in exp.tensors)
    click.echo(f"{'tensor':{width}}  {'group':8}  {'map':7}  {'requested':9}  expected")
    for t in exp.tensors:
        flag = "" if t.expected == t.requested else "  (fallback)"
        click.echo(
            f"{t.name:{width}}  {t.group:8}  {t.map_type:7}  {t.requested:9}  {t.expected}{flag}"
        )
    for w in exp.warnings:
        click.echo(f"warning: {w}", err=True)
