"""`epi run`: the click command over host.run.runner (options, defaults, the closing summary)."""

from __future__ import annotations

from pathlib import Path

import click

from epi.commands.params import (
    SEED,
    THREADS,
    BoundedInt,
    FiniteFloat,
    SafeId,
    check_output_dir,
)
from host.run.runner import (
    DEFAULT_COOLDOWN_S,
    DEFAULT_IDLE_S,
    DEFAULT_REPEATS,
    DEFAULT_STALL_TIMEOUT_S,
    DEFAULT_TOKENS,
    DEFAULT_WARMUPS,
    RunSettings,
)
from host.run.runner import (
    run as run_model,
)


@click.command("run")
@click.argument("model", type=click.Path(path_type=Path))
@click.option(
    "--out",
    "out",
    required=True,
    type=click.Path(path_type=Path),
    help="New directory for the token log (run.json, events.csv, requests.csv).",
)
@click.option(
    "--prompts",
    type=click.Path(path_type=Path),
    default=None,
    help="Prompt set JSON (default: the shipped epi-default-v1).",
)
@click.option(
    "--tokens",
    type=BoundedInt(1, 1_000_000),
    default=DEFAULT_TOKENS,
    show_default=True,
    help="Tokens generated per request (end-of-sequence suppressed).",
)
@click.option(
    "--repeats",
    type=BoundedInt(1, 10_000),
    default=DEFAULT_REPEATS,
    show_default=True,
    help="Measured passes over the prompt set.",
)
@click.option(
    "--warmups",
    type=BoundedInt(0, 1000),
    default=DEFAULT_WARMUPS,
    show_default=True,
    help="Warm-up passes before them (logged, marked warmup=1).",
)
@click.option(
    "--warmup-tokens",
    type=BoundedInt(1, 1_000_000),
    default=None,
    help="Tokens generated per warm-up request [default: --tokens]. A short warm-up loads "
    "the weights and the compute graphs as well as a full one (llama-bench warms up with "
    "one token).",
)
@click.option(
    "--threads",
    type=THREADS,
    default=None,
    help="llama.cpp threads for prompt and generation [default: usable cores].",
)
@click.option(
    "--workers",
    default=None,
    metavar="[NAME=]HOST:PORT,...",
    help="llama.cpp RPC workers (`epi worker`); layers are split across them.",
)
@click.option(
    "--split",
    default=None,
    metavar="S1,S2,...",
    help="Share of the layers per worker (llama.cpp tensor split) [default: equal].",
)
@click.option(
    "--meter",
    multiple=True,
    metavar="URL",
    help="Meter daemon URL: clock offset estimated at start, each repeat and end. Repeat it "
    "for several daemons: each offset is recorded keyed by its URL, in this order (the order "
    "of `epi analyze --trace`).",
)
@click.option(
    "--idle-s",
    type=FiniteFloat(0.0, 86_400.0),
    default=DEFAULT_IDLE_S,
    show_default=True,
    help="Idle-baseline window before each repeat, seconds.",
)
@click.option(
    "--cooldown-s",
    type=FiniteFloat(0.0, 86_400.0),
    default=DEFAULT_COOLDOWN_S,
    show_default=True,
    help="Cool-down before each idle window, seconds.",
)
@click.option("--seed", type=SEED, default=0, show_default=True, help="llama.cpp seed (recorded).")
@click.option(
    "--map-id",
    type=SafeId(),
    default=None,
    help="Mix-map id to record [default: from MODEL's .manifest.json, else none].",
)
@click.option(
    "--stall-timeout-s",
    type=FiniteFloat(0.0, 86_400.0, lo_open=True),
    default=DEFAULT_STALL_TIMEOUT_S,
    show_default=True,
    help="Fail the run when no request finishes for this long.",
)
@click.option(
    "--node",
    default=None,
    help="This host's node name in the placement (the `node` of its meter channel) "
    "[default: hostname].",
)
@click.option(
    "--power",
    default=None,
    metavar="auto|rapl,hwmon,nvml,pmic",
    help="Record this machine's software power counters into OUT/power while running "
    "(component power, not wall power; no meter daemon needed). See docs/sources.md.",
)
@click.option(
    "--decode-model",
    type=click.Path(path_type=Path),
    default=None,
    help="A split configuration: MODEL prefills, this GGUF (another map of MODEL's base) "
    "decodes after the sequence's state is handed over. One node only. See docs/runner.md.",
)
def run(
    model: Path,
    out: Path,
    prompts: Path | None,
    tokens: int,
    repeats: int,
    warmups: int,
    warmup_tokens: int | None,
    threads: int | None,
    workers: str | None,
    split: str | None,
    meter: tuple[str, ...],
    idle_s: float,
    cooldown_s: float,
    seed: int,
    map_id: str | None,
    stall_timeout_s: float,
    node: str | None,
    power: str | None,
    decode_model: Path | None,
) -> None:
    """Run MODEL.gguf on fixed prompts and log every token's time."""
    check_output_dir(out, "--out")  # before the model loads, not after the runs
    settings = RunSettings(
        model=model,
        out=out,
        prompts=prompts,
        tokens=tokens,
        repeats=repeats,
        warmups=warmups,
        warmup_tokens=warmup_tokens,
        threads=threads,
        workers=workers,
        split=split,
        meters=meter,
        idle_s=idle_s,
        cooldown_s=cooldown_s,
        seed=seed,
        map_id=map_id,
        stall_timeout_s=stall_timeout_s,
        node=node,
        power=power,
        decode_model=decode_model,
    )
    result = run_model(settings)
    prefill = "n/a" if result.prefill_ms_median is None else f"{result.prefill_ms_median:.1f} ms"
    decode = (
        "n/a" if result.decode_tok_s_median is None else f"{result.decode_tok_s_median:.1f} tok/s"
    )
    click.echo(
        f"completed: {result.n_requests} requests ({result.n_measured} measured); "
        f"median prefill {prefill}, "
        f"median decode {decode}; token log in {result.run_dir}"
    )
    if power:
        click.echo(f"power trace in {result.run_dir / 'power'} (component power, not wall "
                   f"power): epi analyze {result.run_dir} --trace {result.run_dir / 'power'}")
