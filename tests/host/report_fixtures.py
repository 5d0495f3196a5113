"""The analyses the report tests read, each analysed (and, where a test only reads it, rendered)
once per test process instead of once per test (the report tests used to re-run the same
synthetic analysis 34 times and render the same report several times).

The fixtures ask only for pytest's own `tmp_path_factory` / `tmp_path`, so a test module
imports just the ones it names. Each analysis is built from the synthetic runs and traces of
tests/host/conftest.py with exact ground truth, as the fixtures in the test modules did
before. The shared copy is made
read-only (files 0444, directories 0555) and its digest kept, so that a test that writes into
it by mistake fails (at once, or at its teardown when it runs as root) instead of changing what
the next test reads; a test that changes its analysis takes the fixture that hands it its own
copy in `tmp_path`.

A fixture imported into several test modules is a separate fixture in each (pytest registers
it per module), so the built results are memoised here, per process: with pytest-xdist each
worker builds what its files need, once.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import stat
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace
from typing import BinaryIO, TypeVar

import numpy as np
import pytest

from host.analysis.model import Options
from host.analysis.output import analyze_to
from host.report.build import Report, write_report
from tests.host.conftest import (
    HOST_BOOT,
    LEVELS,
    METER_BOOT,
    NS,
    Schedule,
    Steps,
    make_schedule,
    write_run,
    write_trace,
)
from tests.host.test_analyze_validity import _accuracy_with_items, _interleaved_campaign

# the `synth_tools` namespace of tests/host/conftest.py, for builders outside a test
SYNTH = SimpleNamespace(NS=NS, Steps=Steps, Schedule=Schedule, make_schedule=make_schedule,
                        write_trace=write_trace, write_run=write_run, LEVELS=LEVELS,
                        METER_BOOT=METER_BOOT, HOST_BOOT=HOST_BOOT)
STUDY_LEVELS = {"q4": (3.0, 8.0, 6.0), "q8": (3.0, 12.0, 9.0), "q2": (3.0, 6.0, 4.0)}
# the quantization manifests of the `answered` study: the maps differ only in the late group
N_LAYERS = 8
GROUPS = {"early": [0, 1], "middle": [2, 3, 4, 5], "late": [6, 7]}
LATE = {"q4": "Q4_0", "q8": "Q8_0"}

T = TypeVar("T")
_BUILT: dict[str, object] = {}
_DIGESTS: dict[Path, str] = {}


def once(key: str, factory: pytest.TempPathFactory, build: Callable[[Path], T]) -> T:
    """`build(a fresh directory)`, the first time `key` is asked for in this process."""
    if key not in _BUILT:
        _BUILT[key] = build(factory.mktemp(key))
    return _BUILT[key]  # type: ignore[return-value]


def _digest(tree: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(tree.rglob("*")):
        h.update(p.relative_to(tree).as_posix().encode() + b"\0")
        if p.is_file():
            h.update(p.read_bytes())
    return h.hexdigest()


def _read_only(tree: Path) -> None:
    """Seal a shared tree: read-only for a test run as a user (root writes anyway, so its
    digest is kept too and `_unchanged` compares it after each test that reads the tree)."""
    for p in [*tree.rglob("*"), tree]:
        p.chmod(stat.S_IMODE(p.stat().st_mode) & ~0o222)
    _DIGESTS[tree] = _digest(tree)


@contextmanager
def _unchanged(tree: Path) -> Iterator[None]:
    """Fail the test (at its teardown) that changed the shared `tree`."""
    yield
    assert _digest(tree) == _DIGESTS[tree], (
        f"a test changed the shared {tree}: take the fixture that hands out its own copy")


def own_copy(src: Path, dst: Path) -> Path:
    """A writable copy of the analysis directory `src` at `dst`."""
    shutil.copytree(src, dst, copy_function=shutil.copyfile)
    for p in [dst, *dst.rglob("*")]:
        p.chmod(0o755 if p.is_dir() else 0o644)
    return dst


# --------------------------------------------------------------------------- the study
def _study_accuracy(path: Path) -> Path:
    models = []
    for i, (cfg, acc, ppl) in enumerate((("q4", 0.40, 20.0), ("q8", 0.42, 20.1),
                                         ("q2", 0.30, 30.0))):
        models.append({"path": f"{cfg}.gguf", "sha256": str(i + 1) * 64, "map_id": cfg,
                       "perplexity": {"ppl": ppl, "ppl_se": 0.1}, "benchmarks": {},
                       "composite": {"accuracy": acc, "ci95": [acc - 0.02, acc + 0.02],
                                     "weights": {"hellaswag": 1.0},
                                     "metric": "accuracy_norm"}})
    path.write_text(json.dumps({"format": "epi-accuracy", "format_version": 1,
                                "models": models}))
    return path


def build_study(root: Path) -> tuple[Path, dict[str, float]]:
    """Three configurations in one trace: q4 and q8 valid, q2's run failed (invalid).
    The analysis directory and the ground truth J per generated token per config."""
    scheds, profs = {}, []
    t0 = 500 * NS
    for i, cfg in enumerate(STUDY_LEVELS):
        s = make_schedule(t0, seed=i + 1)
        idle, pre, dec = STUDY_LEVELS[cfg]
        profs.append(s.profile(idle_w=idle, prefill_w=pre, decode_w=dec))
        scheds[cfg] = s
        t0 = s.requests[-1]["end"] + 5 * NS
    t = np.concatenate([profs[0].t_ns] + [p.t_ns[1:] for p in profs[1:]])
    lv = np.concatenate([profs[0].level_w] + [p.level_w[1:] for p in profs[1:]])
    prof = Steps(t, lv)
    tdir = write_trace(root / "trace", {0: prof}, 495 * NS, t0)
    runs = []
    truth = {}
    for i, cfg in enumerate(STUDY_LEVELS):
        kw = {"status": "failed", "error": "out of memory"} if cfg == "q2" else {}
        runs.append(write_run(root / f"r_{cfg}", scheds[cfg], offset_ns=7 * NS, map_id=cfg,
                              sha256=str(i + 1) * 64, **kw))
        reqs = [r for r in scheds[cfg].requests if not r["warmup"]]
        truth[cfg] = (sum(prof.energy(r["start"], r["end"]) for r in reqs)
                      / sum(r["n_gen"] for r in reqs))
    out = root / "analysis"
    analyze_to(out, runs, tdir, Options(baseline="q8"), _study_accuracy(root / "acc.json"))
    _read_only(out)
    return out, truth


@pytest.fixture
def study_analysis_shared(tmp_path_factory: pytest.TempPathFactory
                          ) -> Iterator[tuple[Path, dict[str, float]]]:
    """The study, analysed once per process; read-only (take `study_analysis` to change it)."""
    built = once("study", tmp_path_factory, build_study)
    with _unchanged(built[0]):
        yield built


@pytest.fixture
def study_analysis(tmp_path_factory: pytest.TempPathFactory, tmp_path: Path
                   ) -> tuple[Path, dict[str, float]]:
    """The study's analysis directory, this test's own copy, and the ground truth J per
    generated token per config."""
    src, truth = once("study", tmp_path_factory, build_study)
    return own_copy(src, tmp_path / "analysis"), truth


def cli_report(src: Path, out: Path) -> Report:
    """`epi report SRC --out OUT` through the click command, as a user runs it; it must exit 0
    (its output is the failure message otherwise)."""
    from click.testing import CliRunner

    from epi.cli import cli

    r = CliRunner().invoke(cli, ["report", str(src), "--out", str(out)])
    assert r.exit_code == 0, r.output
    _read_only(out)
    return Report(out, out / "report.html", out / "report.md",
                  sorted(p for p in (out / "figures").iterdir()))


@pytest.fixture
def study_report(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Report]:
    """The study's report, written once per process by `epi report` (`cli_report`); read it,
    do not change it."""
    src, _ = once("study", tmp_path_factory, build_study)
    rep = once("study-report", tmp_path_factory, lambda d: cli_report(src, d / "rep"))
    with _unchanged(rep.out_dir):
        yield rep


@pytest.fixture
def figures_unsaved(monkeypatch: pytest.MonkeyPatch) -> None:
    """For tests of the report's words (captions, tables, the measurement block): every
    figure is built as in a real report, so its caption and alt text are the real ones, but
    not drawn into PNG and SVG bytes (most of a report's rendering time); each figure file
    holds a placeholder instead. The drawn figures are the subject of test_report.py's tests
    (every figure as PNG and SVG, and the page in Chromium)."""
    from matplotlib.figure import Figure

    monkeypatch.setattr(Figure, "savefig", unsaved_figure)


def unsaved_figure(self: object, fname: BinaryIO, *_a: object, **_k: object) -> None:
    """Stands in for `Figure.savefig` (see `figures_unsaved`): a placeholder, not a drawing."""
    fname.write(b"not drawn: a test of the report's words")


# --------------------------------------------------------------------------- the answered study
def _manifest(cfg: str) -> dict[str, object]:
    groups = [{"name": name, "layers": layers, "n_weights": 1000 * len(layers),
               "bits_per_weight": 4.5 if cfg == "q4" or name != "late" else 8.5,
               "map_type": LATE[cfg] if name == "late" else "Q4_0",
               "effective_types": {LATE[cfg] if name == "late" else "Q4_0": 7 * len(layers)}}
              for name, layers in GROUPS.items()]
    return {"format": "epi-quant-manifest", "format_version": 1, "map_id": cfg,
            "map_form": "epi", "output": {"size_bytes": 1_000_000 if cfg == "q4" else 1_200_000,
                                          "sha256": None},
            "total": {"bits_per_weight": 4.5 if cfg == "q4" else 5.5}, "inputs": {},
            "file_type": "Q4_0", "layer_groups": groups}


def build_answered(root: Path) -> Path:
    """3 interleaved rounds of q4 and q8 (tests/host/test_analyze_validity.py), q8 drawing 3 %
    more, scored on 200 items with q8 right on 10 more, perplexity 20.0 / 20.1, and manifests
    in which the maps differ only in their late group."""
    tdir, runs = _interleaved_campaign(root, SYNTH)
    acc = _accuracy_with_items(root / "acc.json")
    doc = json.loads(acc.read_text())
    for model, ppl in zip(doc["models"], (20.0, 20.1), strict=True):
        model["perplexity"] = {"ppl": ppl, "ppl_se": 0.1}
    acc.write_text(json.dumps(doc))
    mdir = root / "manifests"
    mdir.mkdir()
    for cfg in LATE:
        (mdir / f"{cfg}.manifest.json").write_text(json.dumps(_manifest(cfg)))
    out = root / "analysis"
    analyze_to(out, runs, tdir, Options(baseline="q4", manifest_dir=mdir), acc)
    _read_only(out)
    return out


@pytest.fixture
def answered_shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The answered study, analysed once per process; read-only (take `answered` to change
    it)."""
    tree = once("answered", tmp_path_factory, build_answered)
    with _unchanged(tree):
        yield tree


@pytest.fixture
def answered(tmp_path_factory: pytest.TempPathFactory, tmp_path: Path) -> Path:
    """The answered study's analysis directory, this test's own copy."""
    return own_copy(once("answered", tmp_path_factory, build_answered), tmp_path / "analysis")


@pytest.fixture
def answered_report(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Report]:
    """`write_report` of the answered study, once per process (read it, do not change it)."""
    src = once("answered", tmp_path_factory, build_answered)
    rep = once("answered-report", tmp_path_factory, lambda d: _sealed_report(src, d / "rep"))
    with _unchanged(rep.out_dir):
        yield rep


def _sealed_report(src: Path, out: Path) -> Report:
    rep = write_report(src, out)
    _read_only(out)
    return rep


def report_files(rep: Report) -> dict[str, bytes]:
    """Relative path → content of a written report: what `render_files` returned for it."""
    return {p.relative_to(rep.out_dir).as_posix(): p.read_bytes()
            for p in rep.out_dir.rglob("*") if p.is_file()}


# --------------------------------------------------------------------------- paired campaigns
def build_interleaved(root: Path, flips: int) -> Path:
    """The interleaved campaign with q8 right on `flips` more of 200 items, baseline q4."""
    tdir, runs = _interleaved_campaign(root, SYNTH)
    acc = _accuracy_with_items(root / "acc.json", flips=flips)
    out = root / "analysis"
    analyze_to(out, runs, tdir, Options(baseline="q4"), acc)
    _read_only(out)
    return out


@pytest.fixture
def interleaved_flips10(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The interleaved campaign, q8 right on 10 more items: analysed once per process,
    read-only."""
    tree = once("interleaved-10", tmp_path_factory, lambda d: build_interleaved(d, 10))
    with _unchanged(tree):
        yield tree


@pytest.fixture
def interleaved_flips0(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The interleaved campaign, both right on the same items: analysed once per process,
    read-only."""
    tree = once("interleaved-0", tmp_path_factory, lambda d: build_interleaved(d, 0))
    with _unchanged(tree):
        yield tree


# --------------------------------------------------------------------------- mixed repeat counts
def _mixed_accuracy(path: Path) -> Path:
    models = [{"path": f"{cfg}.gguf", "sha256": sha, "map_id": cfg,
               "perplexity": {"ppl": 20.0, "ppl_se": 0.1}, "benchmarks": {},
               "composite": {"accuracy": acc, "ci95": [acc - 0.02, acc + 0.02],
                             "weights": {"hellaswag": 1.0}, "metric": "accuracy_norm"}}
              for cfg, sha, acc in (("q4", "1" * 64, 0.40), ("q8", "2" * 64, 0.42))]
    path.write_text(json.dumps({"format": "epi-accuracy", "format_version": 1,
                                "models": models}))
    return path


def build_mixed_n(root: Path) -> Path:
    """q4 measured with 6 repeats, q8 with 3, in one trace (one after the other)."""
    profs, runs = [], []
    t0 = 500 * NS
    for cfg, sha, n_rep, levels in (("q4", "1" * 64, 6, (3.0, 8.0, 6.0)),
                                    ("q8", "2" * 64, 3, (3.0, 12.0, 9.0))):
        s = make_schedule(t0, n_repeats=n_rep, seed=n_rep)
        profs.append(s.profile(*levels))
        runs.append(write_run(root / f"r_{cfg}", s, map_id=cfg, sha256=sha))
        t0 = s.requests[-1]["end"] + 5 * NS
    prof = Steps(np.concatenate([profs[0].t_ns, profs[1].t_ns[1:]]),
                 np.concatenate([profs[0].level_w, profs[1].level_w[1:]]))
    tdir = write_trace(root / "trace", {0: prof}, 495 * NS, t0)
    out = root / "analysis"
    analyze_to(out, runs, tdir, Options(baseline="q8"), _mixed_accuracy(root / "a.json"))
    _read_only(out)
    return out


@pytest.fixture
def mixed_n_shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The mixed-repeat-count analysis, once per process; read-only."""
    tree = once("mixed-n", tmp_path_factory, build_mixed_n)
    with _unchanged(tree):
        yield tree


@pytest.fixture
def mixed_n(tmp_path_factory: pytest.TempPathFactory, tmp_path: Path) -> Path:
    """The mixed-repeat-count analysis, this test's own copy."""
    return own_copy(once("mixed-n", tmp_path_factory, build_mixed_n), tmp_path / "analysis")
