"""`epi campaign STUDY.toml`: the whole study as one resumable command (docs/campaign.md)."""

from __future__ import annotations

from pathlib import Path

import click

from epi.commands.params import BoundedInt, Duration, check_output_dir
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
@click.option("--accuracy-workers", type=BoundedInt(1, 100_000), default=None,
              help="With --dry-run: also show the time with the accuracy stage on N Dask "
                   "workers (epi accuracy --cluster), beside the metered runs.")
@click.option("--out", type=click.Path(path_type=Path, file_okay=False),
              help="Campaign directory [default: the study file's `out`].")
@click.option("--json", "as_json", is_flag=True,
              help="With --dry-run: print the plan, estimate and preflight as one JSON "
                   "document (docs/campaign.md).")
@click.option("--extend-budget", "extend_by", type=Duration(), default=None,
              metavar="DURATION",
              help="Add measuring time to a campaign whose [decide] time budget ran out "
                   "(10m, 90s, 1h), recorded in its directory, and continue it: the "
                   "undecided comparisons get the rounds that now fit.")
def campaign(study_file: Path, dry_run: bool, probe_accuracy: bool,
             accuracy_workers: int | None, out: Path | None, as_json: bool,
             extend_by: float | None) -> None:
    """Quantize, score, measure (interleaved, resumable), analyse and report a study."""
    study = load_study(study_file)
    if out is not None:
        from dataclasses import replace

        study = replace(study, out=out)
    if probe_accuracy and not dry_run:
        raise click.UsageError("--probe-accuracy goes with --dry-run (a campaign measures the "
                               "accuracy stage's time itself before the stage starts)")
    if accuracy_workers is not None and not dry_run:
        raise click.UsageError("--accuracy-workers goes with --dry-run")
    if as_json and not dry_run:
        raise click.UsageError("--json goes with --dry-run (a campaign reports in its "
                               "directory: report.html, analysis/results.json)")
    if as_json and (probe_accuracy or accuracy_workers is not None):
        raise click.UsageError("--json prints the plan alone: leave out --probe-accuracy "
                               "and --accuracy-workers")
    if extend_by is not None and dry_run:
        raise click.UsageError("--extend-budget continues the campaign; leave out --dry-run "
                               "(the dry-run shows the budget the campaign directory records)")
    if dry_run:
        print_plan(study, click.echo, probe_accuracy=probe_accuracy,
                   accuracy_workers=accuracy_workers, as_json=as_json)
        return
    check_output_dir(study.out, "--out" if out is not None else f"{study_file}: out")
    if extend_by is not None:
        from host.campaign.budget import extend

        for line in extend(study, extend_by):
            click.echo(line)
    report = Campaign(study).run()
    click.echo(f"report: {report}")
