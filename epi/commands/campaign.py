"""`epi campaign STUDY.toml`: the whole study as one resumable command (docs/campaign.md)."""

from __future__ import annotations

from pathlib import Path

import click

from epi.commands.params import check_output_dir
from host.campaign.execute import Campaign
from host.campaign.execute import dry_run as print_plan
from host.campaign.study import load_study


@click.command("campaign")
@click.argument("study_file", type=click.Path(path_type=Path, dir_okay=False))
@click.option("--dry-run", is_flag=True,
              help="Print the plan and the time estimate; run nothing.")
@click.option("--probe-accuracy", is_flag=True,
              help="With --dry-run: measure the accuracy stage's time with a short scoring "
                   "probe on this machine (one model load, a few items per benchmark) instead "
                   "of the study file's assumed seconds per item.")
@click.option("--out", type=click.Path(path_type=Path, file_okay=False),
              help="Campaign directory [default: the study file's `out`].")
def campaign(study_file: Path, dry_run: bool, probe_accuracy: bool, out: Path | None) -> None:
    """Quantize, score, measure (interleaved, resumable), analyse and report a study."""
    study = load_study(study_file)
    if out is not None:
        from dataclasses import replace

        study = replace(study, out=out)
    if probe_accuracy and not dry_run:
        raise click.UsageError("--probe-accuracy goes with --dry-run (a campaign measures the "
                               "accuracy stage's time itself before the stage starts)")
    if dry_run:
        print_plan(study, click.echo, probe_accuracy=probe_accuracy)
        return
    check_output_dir(study.out, "--out" if out is not None else f"{study_file}: out")
    report = Campaign(study).run()
    click.echo(f"report: {report}")
