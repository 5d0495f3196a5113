"""`epi search BASE.gguf`: per-layer quantization maps that beat the hand-made ones on EPI.

Parses the options into a host.search.app.SearchRequest and calls host.search.app.run."""

from __future__ import annotations

from pathlib import Path

import click

from epi.commands.aliases import prefer_alias, renamed_option
from epi.commands.params import SEED, THREADS, BoundedInt, FiniteFloat, check_output_dir
from host.campaign.analysis_rules import ANALYSIS_REALS
from host.search.app import SearchRequest, check_request, parse_types, result_lines, run
from host.search.optimizer import Budget


@click.command()
@click.argument("base", type=click.Path(path_type=Path))
@click.option("--out", type=click.Path(path_type=Path), default=Path("out/search"),
              show_default=True, help="Search directory (resumable: run again to continue).")
@click.option("--against", "against", multiple=True, type=click.Path(path_type=Path),
              default=[Path("quantmaps/demo")], show_default=True,
              help="Hand-made maps to beat (files or folders); measured in round 0, the best "
                   "of them again beside every candidate.")
@click.option("--types", "types_text", default=None,
              help="Allowed tensor types, comma-separated (default: all that fit every tensor).")
@click.option("--max-bpw", type=FiniteFloat(1.0, 32.0), default=None,
              help="Budget: bits per weight of a candidate at most this.")
@click.option("--max-size-mb", type=FiniteFloat(0.0, 1e9, lo_open=True), default=None,
              help="Budget: file size of a candidate at most this.")
@click.option("--min-accuracy", type=FiniteFloat(0.0, 1.0), default=None,
              help="Budget: predicted composite accuracy at least this.")
@click.option("--candidates", type=BoundedInt(1, 200), default=4, show_default=True,
              help="Budget: search candidates measured in total.")
@click.option("--per-round", type=BoundedInt(1, 50), default=2, show_default=True,
              help="Candidates measured per round before the models are refitted.")
@click.option("--objective", type=click.Choice(["epi", "pareto"]), default="epi",
              show_default=True, help="Lowest predicted EPI, or spread along the front.")
@click.option("--text", default="lambada", show_default=True,
              help="Held-out text for the sensitivity proxy: a prepared text name or a file.")
@click.option("--kl-windows", type=BoundedInt(1, 64), default=2, show_default=True,
              help="Windows of held-out text scored per probe.")
@click.option("--kl-ctx", type=BoundedInt(16, 4096), default=256, show_default=True,
              help="Tokens per held-out window.")
@click.option("--meter", "meter_url", default=None,
              help="A running meter daemon's URL (default: the campaign starts the emulator).")
@click.option("--trace", "meter_trace", type=click.Path(path_type=Path), default=None,
              callback=prefer_alias("--trace"),
              help="With --meter: the directory where this host reads that daemon's trace "
                   "(a copy or a network mount); the campaign needs it to cut the runs.")
@renamed_option("--meter-trace", "--trace")
@click.option("--meter-rate-hz", type=FiniteFloat(0.0, 1000.0, lo_open=True), default=None,
              help="Sample rate of the emulated meter (default: the campaign's, 20 Hz).")
@click.option("--lag", type=click.Choice(["none", "auto"]), default=None,
              help="The analysis' meter-lag handling (`epi analyze --lag`; default: the "
                   "campaign's, none). auto estimates the meter's lag and shifts the windows.")
@click.option("--cv-threshold", type=FiniteFloat.within(ANALYSIS_REALS["cv_threshold"]),
              default=None,
              help="The analysis' repeat-CV limit for a valid run (`epi analyze "
                   "--cv-threshold`; default: the campaign's, 0.03).")
@click.option("--max-resolution-frac",
              type=FiniteFloat.within(ANALYSIS_REALS["max_resolution_frac"]), default=None,
              help="The analysis' limit on the energy counter's step as a fraction of a "
                   "request's energy (`epi analyze --max-resolution-frac`; default 0.005).")
@click.option("--prompts", type=click.Path(path_type=Path, dir_okay=False), default=None,
              help="Prompts file for the measured runs (default: the runner's own prompts).")
@click.option("--tokens", type=BoundedInt(1, 4096), default=256, show_default=True,
              help="Tokens generated per measured request: the decode window must span many "
                   "meter samples (256 at ~100 tok/s is ~2.5 s, ~50 samples at 20 Hz).")
@click.option("--repeats", type=BoundedInt(1, 20), default=3, show_default=True,
              help="Round 0's campaign rounds of the hand-made maps (fixed).")
@click.option("--cooldown-s", type=FiniteFloat(0.0, 86_400.0), default=None,
              help="Cool-down before each metered repeat's idle window, seconds (the round "
                   "studies' [run] cooldown_s; default: the campaign's, 1).")
@click.option("--idle-s", type=FiniteFloat(0.0, 86_400.0), default=None,
              help="Idle-baseline window before each metered repeat, seconds ([run] idle_s; "
                   "default: the campaign's, 3): the net figures subtract its power.")
@click.option("--min-rounds", type=BoundedInt(3, 1000), default=3, show_default=True,
              help="A candidate round's campaign: rounds before its first decision.")
@click.option("--max-rounds", type=BoundedInt(3, 1000), default=8, show_default=True,
              help="A candidate's budget: rounds after which its comparison with the best "
                   "hand-made map is reported undecided if not settled.")
@click.option("--margin-pct", type=FiniteFloat(0.0, 100.0), default=2.0, show_default=True,
              help="Smallest J/token difference worth resolving, %: a comparison inside "
                   "± this is 'equivalent'.")
@click.option("--items", type=BoundedInt(10, 100_000), default=50, show_default=True,
              help="Items per benchmark (MMLU, ARC-Challenge, HellaSwag).")
@click.option("--threads", type=THREADS, default=None,
              help="Threads for the sensitivity probes and scoring (default: every core).")
@click.option("--run-threads", type=THREADS, default=None,
              help="Threads of the metered runs (default: 1 with the emulated meter, leaving a "
                   "core to its daemon as the demo does; else --threads).")
@click.option("--phase-split", is_flag=True,
              help="The phase split as a dimension: also measure each pick as two split "
                   "configurations with the best hand-made map (prefill on one, decode on the "
                   "other; both models resident in the runs). docs/search.md.")
@click.option("--seed", type=SEED, default=0, show_default=True)
def search(base: Path, out: Path, against: tuple[Path, ...], types_text: str | None,
           max_bpw: float | None, max_size_mb: float | None, min_accuracy: float | None,
           candidates: int, per_round: int, objective: str, text: str, kl_windows: int,
           kl_ctx: int, meter_url: str | None, meter_trace: Path | None,
           meter_rate_hz: float | None,
           lag: str | None, cv_threshold: float | None, max_resolution_frac: float | None,
           prompts: Path | None, tokens: int,
           repeats: int, cooldown_s: float | None, idle_s: float | None, min_rounds: int,
           max_rounds: int, margin_pct: float, items: int,
           threads: int | None, run_threads: int | None, phase_split: bool, seed: int) -> None:
    """Search per-layer quantization maps of BASE (an F16 GGUF) that beat hand-made ones.

    Round 0 measures the hand-made maps; proxies (per-layer KL sensitivity, a fitted energy
    model) then propose candidates, each measured through `epi campaign` beside the best
    hand-made map until their comparison is decided or --max-rounds is spent; the models are
    refitted and the loop repeats until --candidates are measured. Only measured figures
    count.
    """
    check_output_dir(out, "--out")
    req = SearchRequest(
        base=base, out=out, against=against, types=parse_types(types_text),
        budget=Budget(max_bpw, max_size_mb, min_accuracy), candidates=candidates,
        per_round=per_round, objective=objective, text=text, kl_windows=kl_windows,
        kl_ctx=kl_ctx, meter_url=meter_url, meter_trace=meter_trace,
        meter_rate_hz=meter_rate_hz, lag=lag, cv_threshold=cv_threshold,
        max_resolution_frac=max_resolution_frac, prompts=prompts,
        tokens=tokens, repeats=repeats, cooldown_s=cooldown_s, idle_s=idle_s,
        min_rounds=min_rounds, max_rounds=max_rounds,
        margin_pct=margin_pct, items=items, threads=threads,
        run_threads=run_threads, seed=seed, phase_split=phase_split)
    check_request(req)
    outcome = run(req, click.echo)
    for line in result_lines(outcome, out):
        click.echo(line)
