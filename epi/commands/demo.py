"""`epi demo`: the main job end to end on the embedded default (no Pi, no board needed).

A small campaign (examples/study-demo.toml): prepare the real SmolLM2-135M model, quantize it
with four mix maps, start the meter daemon on the ATM90E26 emulator (channel 0 follows the CPU
time of the campaign's own processes, modelled as the wall power of a Pi 5 that runs only the
inference), score accuracy, run every configuration with token logs (interleaved rounds: 3 of
every map, then adaptive rounds for the maps of undecided comparisons within the study's
budget; thermal settle before each run), analyse, and write the HTML report, whose path it
prints last. Interrupted, the same command continues where it stopped.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import click

from epi.commands.params import check_output_dir
from host.campaign.execute import Campaign
from host.campaign.meter import ACTIVITY_TEXT
from host.campaign.study import load_study

REPO = Path(__file__).resolve().parents[2]
DEMO_STUDY = REPO / "examples" / "study-demo.toml"


@click.command()
@click.option("--out", type=click.Path(path_type=Path, file_okay=False), default=None,
              help="Campaign directory [default: the study's, out/demo].")
@click.option("--study", "study_file", type=click.Path(path_type=Path, dir_okay=False),
              default=DEMO_STUDY, show_default=True, help="The demo's study file.")
def demo(out: Path | None, study_file: Path) -> None:
    """Run the demo campaign on the embedded default and print the report's path."""
    study = load_study(study_file)
    if out is not None:
        study = replace(study, out=check_output_dir(out, "--out"))
    report = Campaign(study).run()
    click.secho(f"\nThe figures are MODELLED power (emulated meter; "
                f"{ACTIVITY_TEXT[study.meter.activity]}), not a hardware measurement.", bold=True)
    click.secho(f"report: {report.resolve()}", bold=True)
