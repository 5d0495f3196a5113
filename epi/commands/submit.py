"""`epi submit ANALYSIS_DIR --out data/community/LAB/STUDY/`: one community submission,
the bundle and its summary (docs/community.md)."""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

import click

from epi import __version__
from epi.commands.params import check_output_dir
from epi.core.errors import UserError


def _g(v: float | None) -> str:
    return "—" if v is None else f"{v:.4g}"




@click.command("submit")
@click.argument("analysis", type=click.Path(path_type=Path))
@click.option("--out", required=True, type=click.Path(path_type=Path),
              help="Submission directory, data/community/LAB/STUDY/ (new or empty).")
@click.option("--hardware", "hardware_file", required=True, type=click.Path(path_type=Path),
              help="JSON file: board, cpu, memory_gb, os, thermal (nodes and llama.cpp build "
                   "flags come from the runs unless given).")
@click.option("--lab", default=None, help="Lab name [default: the parent of --out].")
@click.option("--study", default=None, help="Study name [default: the name of --out].")
def submit(analysis: Path, out: Path, hardware_file: Path, lab: str | None,
           study: str | None) -> None:
    """Bundle an analysis and write its summary (hardware, model and map sha256, protocol,
    per-configuration J/token, accuracy and EPI with intervals, validity, qualification)."""
    from host.bundle import archive
    from host.bundle.collect import collect, manifest_note
    from host.community.check import SUMMARY
    from host.community.make import read_hardware, summarize
    from host.community.record import NAME

    out = Path(out)
    lab = lab or out.resolve().parent.name
    study = study or out.resolve().name
    for option, value in (("--lab", lab), ("--study", study)):
        if not NAME.fullmatch(value):
            raise UserError(f"{option}: {value[:80]!r}: use letters, digits, '.', '_', '-'")
    check_output_dir(out, "--out")
    if out.exists() and any(out.iterdir()):
        raise UserError(f"--out {out}: not empty (a submission directory holds one study)")
    if not analysis.is_dir():
        raise UserError(f"{analysis}: not a directory (an analysis directory is expected)")
    collected = collect(analysis)
    name = f"{study}.epi-bundle.tar.gz"
    manifest = {"epi_version": __version__, "created_real_ns": time.time_ns(),
                "host": socket.gethostname(), "analysis_dir": str(analysis),
                **manifest_note(collected)}
    try:
        out.mkdir(parents=True, exist_ok=True)
        target = archive.write(out / name, collected.files, manifest)
        bundle = archive.read(target)
        hardware = read_hardware(hardware_file, bundle)
        summary = summarize(bundle, target.read_bytes(), hardware, lab, study)
        tmp = out / f".{SUMMARY}.tmp-{os.getpid()}"
        tmp.write_text(summary.to_json(), encoding="utf-8")
        os.replace(tmp, out / SUMMARY)
    except OSError as exc:
        raise UserError(f"--out {out}: cannot write ({exc.strerror})") from None
    except UserError:
        for leftover in (out / name, out / SUMMARY):
            leftover.unlink(missing_ok=True)
        raise
    for c in summary.configs:
        click.echo(f"{c.config}: {_g(c.j_per_token)} J/token, EPI {_g(c.epi)} ({c.power_source}; "
                   f"{c.n_runs_valid} of {c.n_runs} runs valid)")
    click.echo(f"board: {summary.board}")
    click.echo(f"wrote {out / name} and {out / SUMMARY}")
