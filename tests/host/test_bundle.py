"""`epi bundle` / `epi compare`: a synthetic analysis round-trips, injected differences are
flagged, hostile bundles are one line and never write outside the output."""

from __future__ import annotations

import io
import json
import shutil
import tarfile
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest

from host.analysis.model import Options
from host.analysis.output import analyze_to
from host.bundle import archive
from host.bundle.compare import differences
from host.bundle.facts import facts
from tests.cli_run import run_epi
from tests.host.conftest import LEVELS, Steps, make_schedule, write_run, write_trace

NS = 1_000_000_000
# the `synth_tools` namespace of tests/host/conftest.py (what `_study` uses), for the
# module-scoped fixture
SYNTH = SimpleNamespace(Steps=Steps, make_schedule=make_schedule, write_trace=write_trace,
                        write_run=write_run, LEVELS=LEVELS)
ITEMS = {"arc_challenge": "e" * 64, "hellaswag": "f" * 64}


def _accuracy(path: Path, items: dict[str, str], shots: dict[str, int] | None = None) -> Path:
    models = [{"path": f"{m}.gguf", "sha256": s * 64, "map_id": m,
               "perplexity": None, "benchmarks": {
                   b: {"subset": {"n": 10, "seed": 0, "items_sha256": h},
                       **({"shots": shots[b]} if shots and b in shots else {})}
                   for b, h in items.items()},
               "composite": {"accuracy": a, "ci95": [a - 0.05, a + 0.05],
                             "weights": {"arc_challenge": 1.0}, "metric": "accuracy_norm"}}
              for m, s, a in (("q4", "1", 0.40), ("q8", "2", 0.45))]
    path.write_text(json.dumps({"format": "epi-accuracy", "format_version": 1,
                                "models": models}))
    return path


def _study(root: Path, t: SimpleNamespace, *, build_flags: str = "-DGGML_NATIVE=OFF",
           measured: bool = False, items: dict[str, str] = ITEMS,
           options: Options | None = None, shots: dict[str, int] | None = None) -> Path:
    """Two configurations in one trace (q8 draws 1.5× q4's power), analysed into root/out;
    each model has a quantization manifest beside it (its map's sha256)."""
    s1 = t.make_schedule(500 * NS, seed=1)
    s2 = t.make_schedule(s1.requests[-1]["end"] + 5 * NS, seed=2)
    p1, p2 = s1.profile(**t.LEVELS), s2.profile(idle_w=3.0, prefill_w=12.0, decode_w=9.0)
    import numpy as np

    prof = t.Steps(np.concatenate([p1.t_ns, p2.t_ns[1:]]),
                   np.concatenate([p1.level_w, p2.level_w[1:]]))
    # the trace runs 60 s past the study: the excerpt leaves that out
    tdir = t.write_trace(root / "trace", {0: prof}, 495 * NS, s2.requests[-1]["end"] + 60 * NS)
    if measured:  # a real meter: no emulator, no power model
        for meta in tdir.glob("seg-*.meta.json"):
            doc = json.loads(meta.read_text())
            doc.update(emulated=False, power_model=None)
            meta.write_text(json.dumps(doc))
    models = root / "models"
    models.mkdir()
    runs = []
    for name, sched, sha in (("q4", s1, "1"), ("q8", s2, "2")):
        run = t.write_run(root / f"r_{name}", sched, offset_ns=7 * NS, map_id=name,
                          sha256=sha * 64)
        header = json.loads((run / "run.json").read_text())
        header["model"]["path"] = str(models / f"{name}.gguf")
        header["llama_cpp"]["build_flags"] = build_flags.split()
        header["llama_cpp"]["cpu_features"] = {"build": ["AVX2", "FMA"], "cpu": None,
                                               "missing_in_build": [], "notes": {}}
        (run / "run.json").write_text(json.dumps(header))
        (models / f"{name}.manifest.json").write_text(json.dumps(
            {"format": "epi-quant-manifest", "format_version": 1, "map_id": name,
             "inputs": {"map_sha256": name * 32}}))
        runs.append(run)
    out = root / "out"
    analyze_to(out, runs, tdir, options or Options(),
               _accuracy(root / "acc.json", items, shots))
    return out


@pytest.fixture(scope="module")
def study(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, SimpleNamespace]:
    """The study, analysed once for the tests that only read it (each used to build
    and analyse its own); a test that changes its study's files builds its own with `_study`."""
    return _study(tmp_path_factory.mktemp("study") / "a", SYNTH), SYNTH


def _bundle(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
            analysis: Path, out: Path) -> Path:
    code, stdout, err = run_epi(monkeypatch, capsys, "bundle", str(analysis), "--out", str(out))
    assert code == 0, err
    assert f"wrote {out}" in stdout
    return out


def test_bundle_round_trips_and_reanalyses_to_the_same_figures(
        study: tuple[Path, SimpleNamespace], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    analysis, _ = study
    b = _bundle(monkeypatch, capsys, analysis, tmp_path / "a.tar.gz")
    code, stdout, err = run_epi(monkeypatch, capsys, "bundle", "--unpack", str(b), "--out",
                                str(tmp_path / "x"))
    assert code == 0, err
    assert "verified files into" in stdout
    x = tmp_path / "x"
    for f in analysis.iterdir():
        if f.is_file():
            assert (x / "analysis" / f.name).read_bytes() == f.read_bytes(), f.name
    for name in ("r_q4", "r_q8"):
        (d,) = x.glob(f"runs/*-{name}")
        for f in (analysis.parent / name).iterdir():
            assert (d / f.name).read_bytes() == f.read_bytes()
    assert (x / "manifests" / "q8.manifest.json").is_file()
    assert (x / "accuracy" / "accuracy.json").read_bytes() == (
        analysis.parent / "acc.json").read_bytes()
    manifest = json.loads((x / "bundle.json").read_text())
    assert {m["path"] for m in manifest["members"]} == {
        str(p.relative_to(x)) for p in x.rglob("*") if p.is_file() and p.name != "bundle.json"}
    ex = manifest["trace_excerpt"]
    assert 0 < ex["rows_kept"] < ex["rows_in_trace"]  # the 60 s after the study left out

    # the excerpt holds every sample the windows used: analysing the unpacked files again
    # gives the same results table, figure for figure
    runs = sorted(x.glob("runs/*"))
    analyze_to(tmp_path / "again", runs, x / "trace", Options(),
               x / "accuracy" / "accuracy.json")
    again = pd.read_csv(tmp_path / "again" / "results.csv")
    again["accuracy_basis"] = again["accuracy_basis"].str.replace(
        str(x / "accuracy" / "accuracy.json"), str(analysis.parent / "acc.json"))
    pd.testing.assert_frame_equal(again, pd.read_csv(analysis / "results.csv"))


def test_compare_joins_on_hashes_and_flags_injected_differences(
        study: tuple[Path, SimpleNamespace], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    analysis, t = study
    a = _bundle(monkeypatch, capsys, analysis, tmp_path / "a.tar.gz")
    same = _bundle(monkeypatch, capsys, analysis, tmp_path / "same.tar.gz")
    code, stdout, err = run_epi(monkeypatch, capsys, "compare", str(a), str(same))
    assert code == 0, err
    assert "No difference found" in stdout and "UNFAIR" not in stdout
    assert "2 configuration(s) in every bundle" in stdout

    other = _study(tmp_path / "b", t, build_flags="-DGGML_NATIVE=ON", measured=True)
    b = _bundle(monkeypatch, capsys, other, tmp_path / "b.tar.gz")
    code, stdout, err = run_epi(monkeypatch, capsys, "compare", str(a), str(b), "--out",
                                str(tmp_path / "cmp.md"))
    assert code == 3, err  # unfair: the documented exit status
    flagged = {d.aspect for d in differences([facts(archive.read(p)) for p in (a, b)])}
    assert flagged == {"llama.cpp build flags", "power source"}
    assert "UNFAIR: llama.cpp build flags differ" in stdout
    assert "-DGGML_NATIVE=OFF" in stdout and "-DGGML_NATIVE=ON" in stdout
    assert "UNFAIR: power source differ" in stdout and "measured" in stdout
    assert "2 configuration(s) in every bundle" in stdout  # same models and maps: joined
    assert (tmp_path / "cmp.md").read_text().startswith("# Comparison of bundles")

    items = _study(tmp_path / "c", t, items={**ITEMS, "hellaswag": "0" * 64})
    c = _bundle(monkeypatch, capsys, items, tmp_path / "c.tar.gz")
    flagged = {d.aspect for d in differences([facts(archive.read(p)) for p in (a, c)])}
    assert flagged == {"accuracy item sets"}


def _tar(path: Path, members: list[tuple[tarfile.TarInfo, bytes]]) -> Path:
    with tarfile.open(path, "w:gz") as tar:
        for info, data in members:
            tar.addfile(info, io.BytesIO(data) if info.isreg() else None)
    return path


def _file(name: str, data: bytes) -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    return info, data


def _manifest(files: dict[str, bytes]) -> bytes:
    return json.dumps({"format": "epi-bundle", "format_version": 1, "members": [
        {"path": n, "sha256": archive.sha256_bytes(d), "bytes": len(d)}
        for n, d in files.items()]}).encode()


def _hostile(tmp_path: Path, kind: str) -> Path:
    good = {"analysis/results.json": b"{}"}
    path = tmp_path / f"{kind}.tar.gz"
    if kind == "traversal":
        files = {"../evil.txt": b"x"}
        return _tar(path, [_file("bundle.json", _manifest(files)), _file("../evil.txt", b"x")])
    if kind == "absolute":
        return _tar(path, [_file("bundle.json", _manifest(good)),
                           _file(str(tmp_path / "abs.txt"), b"x")])
    if kind == "symlink":
        link = tarfile.TarInfo("analysis/results.json")
        link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
        return _tar(path, [_file("bundle.json", _manifest(good)), (link, b"")])
    if kind == "bad_json":
        return _tar(path, [_file("bundle.json", b"{not json"), _file(*next(iter(good.items())))])
    if kind == "hash_mismatch":
        return _tar(path, [_file("bundle.json", _manifest(good)),
                           _file("analysis/results.json", b'{"edited": 1}')])
    if kind == "unlisted":
        return _tar(path, [_file("bundle.json", _manifest(good)), _file(*next(iter(good.items()))),
                           _file("analysis/extra.csv", b"a\n")])
    if kind == "huge":
        big = {"analysis/results.json": b"x" * 5000}
        return _tar(path, [_file("bundle.json", _manifest(big)), _file(*next(iter(big.items())))])
    if kind == "not_a_bundle":
        path.write_bytes(b"\x1f\x8b garbage that is no gzip stream")
        return path
    raise AssertionError(kind)


@pytest.mark.parametrize(("kind", "message"), [
    ("traversal", "not a plain relative path"),
    ("absolute", "not a plain relative path"),
    ("symlink", "not a regular file"),
    ("bad_json", "not valid JSON"),
    ("hash_mismatch", "sha256 does not match"),
    ("unlisted", "not listed in bundle.json"),
    ("huge", "more than the limit of 1000"),
    ("not_a_bundle", "not a readable bundle"),
])
def test_hostile_bundles_are_one_line_and_write_nothing(
        kind: str, message: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(archive, "MAX_MEMBER_BYTES", 1000)
    work = tmp_path / "work"
    work.mkdir()
    bad = _hostile(work, kind)
    monkeypatch.chdir(work)
    before = sorted(p.name for p in tmp_path.rglob("*"))
    for args in (["bundle", "--unpack", str(bad), "--out", str(work / "out")],
                 ["compare", str(bad), str(bad)]):
        code, stdout, err = run_epi(monkeypatch, capsys, *args)
        lines = err.strip().splitlines()
        assert code == 2, (args, stdout, err)
        assert len(lines) == 1 and lines[0].startswith("epi: error: ") and message in lines[0], err
        assert str(bad) in lines[0] and "Traceback" not in stdout + err
    assert sorted(p.name for p in tmp_path.rglob("*")) == before  # nothing written anywhere
    shutil.rmtree(work)


def test_unpack_refuses_a_non_empty_target(study: tuple[Path, SimpleNamespace], tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    b = _bundle(monkeypatch, capsys, study[0], tmp_path / "a.tar.gz")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "keep.txt").write_text("mine")
    code, _, err = run_epi(monkeypatch, capsys, "bundle", "--unpack", str(b), "--out",
                           str(tmp_path / "full"))
    assert code == 2 and "not an empty directory" in err
    assert [p.name for p in (tmp_path / "full").iterdir()] == ["keep.txt"]


def test_bundle_of_a_bad_analysis_directory_is_one_line(
        synth_tools: SimpleNamespace, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """No results.json, a missing token-log directory: one line, no bundle written."""
    empty = tmp_path / "empty"
    empty.mkdir()
    analysis = _study(tmp_path / "a", synth_tools)  # its own: a run directory is removed
    shutil.rmtree(analysis.parent / "r_q8")
    for target, message in ((empty, "no results.json: not an analysis directory"),
                            (analysis, "run directory")):
        out = tmp_path / f"{target.name}.tar.gz"
        code, _, err = run_epi(monkeypatch, capsys, "bundle", str(target), "--out", str(out))
        lines = err.strip().splitlines()
        assert code == 2 and len(lines) == 1 and message in lines[0], err
        assert not out.exists()


def _compare(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
             *args: str) -> tuple[int, str, str]:
    return run_epi(monkeypatch, capsys, "compare", *args)


def test_compare_refuses_a_net_and_a_gross_analysis_unless_told(
        study: tuple[Path, SimpleNamespace], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    analysis, t = study
    a = _bundle(monkeypatch, capsys, analysis, tmp_path / "a.tar.gz")
    net = _study(tmp_path / "n", t, options=Options(energy_basis="net"))
    b = _bundle(monkeypatch, capsys, net, tmp_path / "n.tar.gz")
    code, stdout, err = _compare(monkeypatch, capsys, str(a), str(b))
    assert code == 2 and stdout == ""
    assert "different energy bases" in err and "gross" in err and "net" in err
    assert len(err.strip().splitlines()) == 1

    code, stdout, err = _compare(monkeypatch, capsys, str(a), str(b), "--mixed-basis", "--json")
    assert code == 3, err
    doc = json.loads(stdout)
    from tests.test_json_outputs import validate

    validate(doc, "epi-compare")
    assert {u["aspect"] for u in doc["unfair"]} == {"energy basis"}
    assert [x["energy_basis"] for x in doc["bundles"]] == ["gross", "net"]
    # each bundle's figure is its own analysis's headline row on its own basis, read here
    # independently from results.csv
    for col, out_dir in ((0, analysis), (1, net)):
        rows = pd.read_csv(out_dir / "results.csv")
        basis = ("gross", "net")[col]
        want = rows[(rows["scope"] == "all") & (rows["phase"] == "request")
                    & (rows["unit"] == "generated") & (rows["basis"] == basis)]
        got = {c["figures"][col]["config"]: c["figures"][col]["j_per_token"]
               for c in doc["configurations"]}
        assert got == pytest.approx(dict(zip(want["config"], want["j_per_token_median"],
                                             strict=True)))
    # net is below gross by the idle draw: the two figures are not the same number
    first = doc["configurations"][0]["figures"]
    assert first[1]["j_per_token"] < first[0]["j_per_token"]


@pytest.mark.parametrize(("kind", "aspect"), [
    ("thresholds", "validity thresholds"), ("shots", "accuracy protocol"),
    ("lag", "analysis method")])
def test_compare_flags_a_differing_protocol_with_a_non_zero_exit(
        study: tuple[Path, SimpleNamespace], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str], kind: str, aspect: str) -> None:
    analysis, t = study
    a = _bundle(monkeypatch, capsys, analysis, tmp_path / "a.tar.gz")
    other = {"thresholds": lambda: _study(tmp_path / "o", t, options=Options(cv_threshold=0.5)),
             "shots": lambda: _study(tmp_path / "o", t,
                                     shots={"arc_challenge": 25, "hellaswag": 10}),
             "lag": lambda: _study(tmp_path / "o", t, options=Options(edge="linear"))}[kind]()
    b = _bundle(monkeypatch, capsys, other, tmp_path / "o.tar.gz")
    code, stdout, err = _compare(monkeypatch, capsys, str(a), str(b), "--json")
    assert code == 3, err
    doc = json.loads(stdout)
    assert doc["fair"] is False
    assert aspect in {u["aspect"] for u in doc["unfair"]}
    code, stdout, _ = _compare(monkeypatch, capsys, str(a), str(b))
    assert code == 3 and f"UNFAIR: {aspect} differ" in stdout
