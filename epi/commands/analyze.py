"""`epi analyze RUN_DIR... --trace TRACE_DIR [--trace TRACE_DIR...]`: joules per token, EPI
and verdicts (several traces: one per meter daemon, host.analysis.multi_trace).

A thin layer over host.analysis: parse the flags into Options, call
host.analysis.output.analyze_to (analyse, write every file atomically; the format is
epi.formats.analysis) and print host.analysis.summary's tables.
"""

from __future__ import annotations

from pathlib import Path

import click

from epi.commands.params import (
    BoundedInt,
    FiniteFloat,
    check_output_dir,
)
from epi.core.errors import UserError
from epi.formats.analysis import RESULT_FILES
from host.analysis.model import Options
from host.analysis.output import analyze_to
from host.analysis.summary import summary_text
from host.analysis.vocabulary import (
    COMPOSITE_METRIC,
    EdgeModel,
    EnergyBasis,
    EnergyMethod,
    LagMode,
)
from host.campaign.analysis_rules import ANALYSIS_REALS, GUIDANCE_REALS, MIN_SAMPLES


def parse_channels(spec: str | None) -> dict[str, list[int]] | None:
    """`node=ch[+ch],node=ch` → {node: [channels]}."""
    if not spec:
        return None
    out: dict[str, list[int]] = {}
    for item in spec.split(","):
        node, sep, chans = item.partition("=")
        if not sep or not node.strip() or not chans.strip():
            raise UserError(f"--channels: {item!r} is not NODE=CHANNEL[+CHANNEL]")
        try:
            numbers = [int(c) for c in chans.split("+")]
        except ValueError:
            raise UserError(f"--channels: {item!r}: channels must be integers") from None
        if any(not 0 <= c <= 255 for c in numbers):
            raise UserError(f"--channels: {item!r}: channels must be in [0, 255]")
        out.setdefault(node.strip(), []).extend(numbers)
    return out


def parse_accuracy_values(items: tuple[str, ...]) -> dict[str, float]:
    out: dict[str, float] = {}
    for item in items:
        cfg, sep, val = item.rpartition("=")
        try:
            out[cfg] = float(val)
        except ValueError:
            cfg = ""
        if not sep or not cfg:
            raise UserError(f"--accuracy-value: {item!r} is not CONFIG=ACCURACY (0..1)")
        if not 0.0 < out[cfg] <= 1.0:  # NaN fails too
            raise UserError(f"--accuracy-value: {item!r}: accuracy must be in (0, 1]")
    return out


MAX_TRACES = 64


def trace_list(given: tuple[Path, ...]) -> list[Path]:
    """`--trace` values → trace directories: each a directory, or a file listing them one a
    line (blank lines and lines starting with '#' skipped; relative paths from the file's
    folder)."""
    out: list[Path] = []
    for item in given:
        if item.is_file():
            try:
                text = item.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError) as exc:
                raise UserError(f"--trace {item}: cannot read the list of traces ({exc})"
                                ) from None
            lines = [ln.strip() for ln in text.splitlines()]
            listed = [ln for ln in lines if ln and not ln.startswith("#")]
            if not listed:
                raise UserError(f"--trace {item}: the list of traces is empty")
            out += [p if p.is_absolute() else item.parent / p for p in map(Path, listed)]
        else:
            out.append(item)
    if len(out) > MAX_TRACES:
        raise UserError(f"--trace: {len(out)} traces, at most {MAX_TRACES}")
    if len(set(out)) != len(out):
        raise UserError("--trace: a trace directory is given twice")
    return out




def _within(key: str) -> FiniteFloat:
    """`--KEY`'s type: the range `[analysis] KEY` of a study enforces too."""
    return FiniteFloat.within({**ANALYSIS_REALS, **GUIDANCE_REALS}[key])


@click.command("analyze")
@click.argument("run_dirs", nargs=-1, required=True,
                type=click.Path(path_type=Path, file_okay=False))
@click.option("--trace", "trace_dirs", required=True, multiple=True,
              type=click.Path(path_type=Path),
              help="Meter trace directory (epi meter run --out); repeat it, one per meter "
              "daemon in the order `epi run --meter` gave them, or give a file listing them "
              "one a line.")
@click.option("--accuracy", "accuracy_file", type=click.Path(path_type=Path),
              help="Accuracy results file (epi accuracy), joined on model sha256.")
@click.option("--accuracy-value", multiple=True, metavar="CONFIG=ACC",
              help="Accuracy in (0, 1] for a configuration, given by hand (repeatable).")
@click.option("--accuracy-metric", default=COMPOSITE_METRIC, show_default=True,
              help="'composite' or a benchmark name from the accuracy file.")
@click.option("--baseline", help="Configuration the savings table compares against.")
@click.option("--channels", help="Node → meter channels, e.g. node0=0,node1=1+2 "
              "(default: the trace's channel map).")
@click.option("--out", "out_dir", type=click.Path(path_type=Path), default=Path("analysis"),
              show_default=True, help="Output directory (results.csv/json, runs, windows).")
@click.option("--energy-basis", type=click.Choice(EnergyBasis.values()),
              default=EnergyBasis.GROSS.value,
              show_default=True, help="Energy basis of EPI, Pareto and savings.")
@click.option("--edge", type=click.Choice(EdgeModel.values()), default=EdgeModel.STEP.value,
              show_default=True, help="Window-edge model (see docs/analysis.md).")
@click.option("--energy-method", type=click.Choice(EnergyMethod.values()),
              default=EnergyMethod.COUNTER.value,
              show_default=True, help="Primary energy: the chip's energy counter (trapezoid "
              "where the counter does not cover a window) or the integral of power readings.")
@click.option("--max-resolution-frac", type=_within("max_resolution_frac"), default=0.005,
              show_default=True,
              help="Largest energy-counter resolution as a fraction of a repeat's phase energy.")
@click.option("--cv-threshold", type=_within("cv_threshold"), default=0.03, show_default=True,
              help="Largest repeat CV of a valid run.")
@click.option("--max-offset-frac", type=_within("max_offset_frac"), default=0.01, show_default=True,
              help="Largest clock-offset uncertainty as a fraction of the median phase.")
@click.option("--min-samples", type=BoundedInt.within(MIN_SAMPLES), default=2, show_default=True,
              help="Fewest meter samples inside a measured window.")
@click.option("--ppl-tolerance", type=_within("ppl_tolerance"), default=0.01, show_default=True,
              help="Relative perplexity tolerance of matched pairs.")
@click.option("--time-share", is_flag=True,
              help="Also split node energy over its layer groups by weight bytes (estimate).")
@click.option("--lag", type=click.Choice(LagMode.values()), default=LagMode.NONE.value,
              show_default=True,
              help="auto: shift each channel's windows by the load lag estimated from the "
              "trace (labelled in the output); none: report the lag and flag it only.")
@click.option("--max-lag-error-frac", type=_within("max_lag_error_frac"), default=0.01,
              show_default=True,
              help="Largest energy a resolved load lag may move across a phase's edges, as a "
              "fraction of its median window energy.")
@click.option("--max-instrument-u-pct", type=FiniteFloat(0.0, 100.0), default=2.0,
              show_default=True, help="Largest instrument uncertainty (%) of a measured "
              "J/token figure; above it the figure's reason says so (docs/analysis.md).")
@click.option("--manifest-dir", type=click.Path(path_type=Path),
              help="Where the quantization manifests are (default: next to the model).")
@click.option("--guidance-accuracy-loss", type=_within("guidance_accuracy_loss"), default=0.02,
              show_default=True,
              help="The report's guidance by use: the accuracy (absolute) the latency and "
              "energy picks may give up against the most accurate configuration.")
@click.option("--guidance-j-budget", type=_within("guidance_j_budget"), default=1.10,
              show_default=True, help="The report's guidance by use: the quality pick's "
              "J/token budget, as a multiple of the lowest J/token.")
@click.option("--reference-map", default=None, metavar="CONFIG",
              help="The report's size reference for the EPI-optimal configuration when the "
                   "study has no uniform_q4km (RQ4, docs/report.md).")
@click.option("--json", "as_json", is_flag=True,
              help="Print the summary as one JSON document instead of tables (the files in "
                   "--out are the same).")
def analyze(run_dirs: tuple[Path, ...], trace_dirs: tuple[Path, ...], accuracy_file: Path | None,
            accuracy_value: tuple[str, ...], accuracy_metric: str, baseline: str | None,
            channels: str | None, out_dir: Path, energy_basis: str, edge: str,
            energy_method: str, max_resolution_frac: float,
            cv_threshold: float, max_offset_frac: float, min_samples: int, ppl_tolerance: float,
            time_share: bool, lag: str, max_lag_error_frac: float,
            max_instrument_u_pct: float, manifest_dir: Path | None, reference_map: str | None,
            guidance_accuracy_loss: float, guidance_j_budget: float,
            as_json: bool) -> None:
    """Joules per token by phase and node, EPI with CIs, and validity verdicts."""
    check_output_dir(out_dir, "--out")
    opts = Options(edge=EdgeModel(edge), energy_method=EnergyMethod(energy_method),
                   max_resolution_frac=max_resolution_frac,
                   min_samples=min_samples, cv_threshold=cv_threshold,
                   max_offset_frac=max_offset_frac,
                   channels=parse_channels(channels),
                   energy_basis=EnergyBasis(energy_basis),
                   accuracy_metric=accuracy_metric,
                   accuracy_values=parse_accuracy_values(accuracy_value),
                   ppl_tolerance=ppl_tolerance, baseline=baseline, time_share=time_share,
                   lag=LagMode(lag), max_lag_error_frac=max_lag_error_frac,
                   max_instrument_u_pct=max_instrument_u_pct, manifest_dir=manifest_dir,
                   reference_map=reference_map,
                   guidance_accuracy_loss=guidance_accuracy_loss,
                   guidance_j_budget=guidance_j_budget)
    traces = trace_list(trace_dirs)
    a = analyze_to(out_dir, list(run_dirs), traces if len(traces) > 1 else traces[0], opts,
                   accuracy_file)
    if as_json:
        import json

        from host.analysis.summary_json import summary_document

        click.echo(json.dumps(summary_document(a, str(out_dir)), indent=1))
        return
    click.echo(summary_text(a))
    click.echo(f"\nwrote {out_dir}/" + ", ".join(RESULT_FILES))
