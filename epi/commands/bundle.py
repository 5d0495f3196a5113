"""`epi bundle ANALYSIS_DIR`: one archive of an analysis and everything behind it;
`epi bundle --unpack BUNDLE`: its verified files into a new directory (docs/bundle.md)."""

from __future__ import annotations

import socket
import time
from pathlib import Path

import click

from epi import __version__
from epi.commands.params import check_output_dir, check_output_file
from epi.core.errors import UserError


@click.command("bundle")
@click.argument("source", type=click.Path(path_type=Path))
@click.option("--out", default=None, type=click.Path(path_type=Path),
              help="Bundle file to write [default: ANALYSIS_DIR.epi-bundle.tar.gz]; with "
                   "--unpack, the (new or empty) directory to unpack into.")
@click.option("--unpack", is_flag=True,
              help="SOURCE is a bundle: verify it and write its files below --out.")
def bundle(source: Path, out: Path | None, unpack: bool) -> None:
    """Bundle an analysis directory (results, windows, token logs, manifests, trace excerpt,
    calibration, build flags, CPU features, power source; sha256 of every file)."""
    from host.bundle import archive

    if unpack:
        if out is None:
            raise UserError("--unpack needs --out DIR (a new or empty directory)")
        check_output_dir(out, "--out")
        written = archive.unpack(archive.read(source), out)
        click.echo(f"unpacked {len(written)} verified files into {out}")
        return
    from host.bundle.collect import collect, manifest_note

    target = out or source.with_name(source.name + ".epi-bundle.tar.gz")
    if target.exists() and target.is_dir():
        raise UserError(f"--out: {target} is a directory")
    check_output_file(target, "--out")
    if not source.is_dir():
        raise UserError(f"{source}: not a directory (an analysis directory is expected)")
    collected = collect(source)
    manifest = {"epi_version": __version__, "created_real_ns": time.time_ns(),
                "host": socket.gethostname(), "analysis_dir": str(source),
                **manifest_note(collected)}
    archive.write(target, collected.files, manifest)
    size = sum(len(b) for b in collected.files.values())
    click.echo(f"{len(collected.files)} files ({size / 1e6:.2f} MB before compression), "
               f"trace excerpt {collected.excerpt.get('rows_kept')} of "
               f"{collected.excerpt.get('rows_in_trace')} sample rows")
    for note in collected.missing:
        click.echo(f"not included: {note}")
    click.echo(f"wrote {target}")
