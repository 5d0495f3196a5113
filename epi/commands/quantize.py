"""`epi quantize MAP... --model BASE.gguf --out DIR`."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click

from epi.commands.params import THREADS, check_output_dir
from epi.core.errors import UserError
from epi.core.text import format_table

if TYPE_CHECKING:
    from epi.formats.manifests import QuantManifest
    from host.quant.mixmap import Expansion


def verification_table(rows: list[dict[str, str]]) -> str:
    """A compact verification table: one line per map."""
    header = ("map", "groups (layers: type)", "bpw", "MiB", "s", "verified")
    keys = ("map", "groups", "bpw", "mib", "seconds", "verified")
    return format_table(header, [[r[k] for k in keys] for r in rows])


def _map_label(exp: Expansion | None) -> str:
    return exp.mixmap.id if exp else ""


def manifest_row(manifest: QuantManifest, skipped: bool) -> dict[str, str]:
    """Table row of one quantization manifest."""
    from host.quant.quantize import fallback_summary

    groups = " ".join(
        f"{g.layers_text}:{g.map_type}" for g in manifest.layer_groups if g.layers_text
    )
    fb = fallback_summary(manifest)
    if manifest.unpredicted:
        verified = f"UNEXPECTED types in {len(manifest.unpredicted)} tensors"
    elif fb:
        verified = f"DIFFERS from request: {fb}"
    else:
        verified = "as requested"
    bpw, size, seconds = (manifest.total.bits_per_weight, manifest.output.size_bytes,
                          manifest.quantize_seconds)
    return {
        "map": manifest.map_id,
        "groups": groups,
        "bpw": "?" if bpw is None else f"{bpw:.3f}",
        "mib": "?" if size is None else f"{size / 2**20:.1f}",
        "seconds": "cached" if skipped or seconds is None else f"{seconds:.1f}",
        "verified": verified,
    }


@click.command()
@click.argument("maps", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option(
    "--model",
    "model_path",
    required=True,
    type=click.Path(path_type=Path),
    help="Base GGUF (F16/BF16/F32 recommended) to quantize.",
)
@click.option(
    "--out",
    "out_dir",
    required=True,
    type=click.Path(path_type=Path),
    help="Directory for MAP_ID.gguf, MAP_ID.manifest.json and MAP_ID.quantize.log.",
)
@click.option("--threads", type=THREADS, default=None, help="Quantization threads.")
@click.option("--force", is_flag=True, help="Redo outputs that are already up to date.")
def quantize(
    maps: tuple[Path, ...], model_path: Path, out_dir: Path, threads: int | None, force: bool
) -> None:
    """Quantize MODEL with each mix map (files or directories of *.json), verify, and manifest.

    Outputs up to date with their map, base model and llama.cpp build are skipped.
    """
    check_output_dir(out_dir, "--out")
    from host.gguf_io.file import sha256_file
    from host.quant.gguf_info import read_model
    from host.quant.mixmap import load_mixmaps
    from host.quant.quantize import quantize_expansion

    mixmaps, notices = load_mixmaps(list(maps))
    base = read_model(model_path)
    for note in notices:
        click.echo(f"note: {note}", err=True)
    from host.quant.mixmap import expand

    # every map is applied to the model once, before any work starts (its warnings first)
    plans = [expand(m, base.shape, base.tensors) for m in mixmaps]
    for exp in plans:
        for w in exp.warnings:
            click.echo(f"warning: {w}", err=True)
    base_sha = sha256_file(base.path)
    rows = []
    label = f"quantizing {len(plans)} map(s)"
    with click.progressbar(
        plans,
        label=label,
        file=sys.stderr,  # click.get_text_stream is deprecated (gone in Click 9)
        item_show_func=_map_label,
    ) as bar:
        for exp in bar:
            result = quantize_expansion(exp, base, base_sha, out_dir, threads=threads,
                                        force=force)
            rows.append(manifest_row(result.manifest, result.skipped))
    click.echo(verification_table(rows))
    differing = [r["map"] for r in rows if r["verified"] != "as requested"]
    if differing:
        click.echo(
            f"{len(differing)} map(s) differ from their request: see the manifests' "
            "'fallbacks' in " + str(out_dir)
        )
    if any(r["verified"].startswith("UNEXPECTED") for r in rows):
        raise UserError("llama.cpp wrote types epi did not predict: see 'unpredicted' in manifests")
