"""Community replication: two emulated labs submit, the checker accepts both and refuses a
hand-edited figure, a missing hardware field, modelled power on the measured board and a
bundle whose trace no longer matches its hash; the site renders both labs in Chromium with
working filters and sorting."""

from __future__ import annotations

import gzip
import io
import json
import shutil
import tarfile
from pathlib import Path

import pandas as pd
import pytest

from host.community.check import check
from tests.cli_run import run_epi
from tests.host.community_fixtures import hardware_file, lab_study


@pytest.fixture(scope="module")
def labs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Two labs' analyses: A modelled power (seed 11, board 'pi5-cluster'), B a real meter
    (seed 23, board 'x86-tower')."""
    root = tmp_path_factory.mktemp("labs")
    return {"A": lab_study(root / "a", seed=11, board="pi5-cluster", measured=False),
            "B": lab_study(root / "b", seed=23, board="x86-tower", measured=True)}


@pytest.fixture(scope="module")
def community(labs: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """data/community with both labs' submissions, made by `epi submit`."""
    from click.testing import CliRunner

    from epi.commands.submit import submit

    root = tmp_path_factory.mktemp("community")
    for lab, board in (("A", "pi5-cluster"), ("B", "x86-tower")):
        hw = hardware_file(root / f"hw-{lab}.json", board)
        res = CliRunner().invoke(submit, [str(labs[lab]), "--out",
                                          str(root / "data" / f"lab{lab}" / "s1"),
                                          "--hardware", str(hw)])
        assert res.exit_code == 0, res.output
    return root / "data"


def _copy(community: Path, lab: str, tmp_path: Path) -> Path:
    d = tmp_path / lab
    shutil.copytree(community / f"lab{lab}" / "s1", d)
    return d


def test_submit_records_the_analysis_figures_and_the_protocol(
        labs: dict[str, Path], community: Path) -> None:
    for lab in ("A", "B"):
        doc = json.loads((community / f"lab{lab}" / "s1" / "summary.json").read_text())
        res = pd.read_csv(labs[lab] / "results.csv")
        head = res[(res["scope"] == "all") & (res["phase"] == "request")
                   & (res["unit"] == "generated") & (res["basis"] == "gross")]
        for c in doc["configs"]:
            row = head[head["config"] == c["config"]].iloc[0]
            assert c["j_per_token"] == pytest.approx(row["j_per_token_median"], rel=1e-12)
            assert c["epi"] == pytest.approx(row["epi"], rel=1e-12)
            assert c["j_per_token_ci"] == pytest.approx(
                [row["j_per_token_ci_lo"], row["j_per_token_ci_hi"]], rel=1e-12)
            assert c["model_sha256"] == {"q4": "1", "q8": "2"}[c["config"]] * 64
            assert c["map_sha256"] == c["config"] * 32
            assert c["n_runs_valid"] == 1
        # the test study's runs: 16 tokens, 3 repeats; 10 items per benchmark; no shots
        assert doc["protocol"]["tokens_per_request"] == [16]
        assert doc["protocol"]["repeats"] == [3]
        assert doc["protocol"]["items"] == {"arc_challenge": 10, "hellaswag": 10}
        assert doc["protocol"]["shots"] == "zero-shot"
        assert doc["hardware"]["nodes"] == ["n0"]
        assert doc["hardware"]["llama_cpp_build_flags"] == ["-DGGML_NATIVE=OFF"]
    a = json.loads((community / "labA" / "s1" / "summary.json").read_text())
    b = json.loads((community / "labB" / "s1" / "summary.json").read_text())
    assert (a["board"], b["board"]) == ("modelled", "measured")
    assert a["configs"][0]["j_per_token"] != b["configs"][0]["j_per_token"]  # other seeds


def test_checker_accepts_both_labs(community: Path, monkeypatch: pytest.MonkeyPatch,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_epi(monkeypatch, capsys, "check-submission",
                             str(community / "labA" / "s1"), str(community / "labB" / "s1"))
    assert code == 0, out + err
    assert out.count(": ok") == 2
    code, out, _ = run_epi(monkeypatch, capsys, "check-submission", "--board", "measured",
                           str(community / "labB" / "s1"))
    assert code == 0, out


def _edit(d: Path, change) -> None:  # type: ignore[no-untyped-def]
    doc = json.loads((d / "summary.json").read_text())
    change(doc)
    (d / "summary.json").write_text(json.dumps(doc))


def test_checker_refuses_a_hand_edited_j_per_token(community: Path, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    d = _copy(community, "B", tmp_path)
    _edit(d, lambda doc: doc["configs"][0].update(j_per_token=doc["configs"][0]["j_per_token"]
                                                  * 0.9))
    code, out, _ = run_epi(monkeypatch, capsys, "check-submission", str(d))
    assert code == 1
    assert "configs[q4].j_per_token: summary says" in out
    assert "REFUSED, 1 problem(s)" in out


def test_checker_refuses_a_missing_hardware_field(community: Path, tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    d = _copy(community, "A", tmp_path)
    _edit(d, lambda doc: doc["hardware"].pop("thermal"))
    code, out, _ = run_epi(monkeypatch, capsys, "check-submission", str(d))
    assert code == 1
    assert "hardware.thermal: missing" in out


def test_checker_refuses_modelled_power_on_the_measured_board(
        community: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_epi(monkeypatch, capsys, "check-submission", "--board", "measured",
                           str(community / "labA" / "s1"))
    assert code == 1
    assert "modelled power is refused for the measured board" in out
    # claiming the measured board in the summary does not help: the power source is
    # recomputed from the trace
    d = _copy(community, "A", tmp_path)
    _edit(d, lambda doc: doc.update(board="measured"))
    code, out, _ = run_epi(monkeypatch, capsys, "check-submission", str(d))
    assert code == 1
    assert "board: says 'measured', the recomputed power source is 'modelled'" in out


def test_checker_refuses_a_trace_that_no_longer_matches_its_hash(
        community: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    d = _copy(community, "B", tmp_path)
    bundle = d / "s1.epi-bundle.tar.gz"
    with tarfile.open(bundle, "r:gz") as tar:
        members = [(i, tar.extractfile(i).read()) for i in tar]  # type: ignore[union-attr]
    raw = io.BytesIO()
    changed = False
    with tarfile.open(fileobj=raw, mode="w") as tar:
        for info, data in members:
            if info.name.endswith(".samples.csv") and not changed:
                lines = data.decode().splitlines()
                lines.pop(len(lines) // 2)  # one sample row gone
                data = ("\n".join(lines) + "\n").encode()
                info.size = len(data)
                changed = True
            tar.addfile(info, io.BytesIO(data))
    assert changed
    bundle.write_bytes(gzip.compress(raw.getvalue()))
    problems = check(d)
    assert any("trace/" in p and "sha256 does not match" in p for p in problems), problems
    assert any("bundle_sha256" in p for p in problems), problems
    code, out, _ = run_epi(monkeypatch, capsys, "check-submission", str(d))
    assert code == 1 and "REFUSED" in out


def test_submit_refuses_a_hardware_file_without_a_field(
        labs: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    hw = tmp_path / "hw.json"
    hw.write_text(json.dumps({"board": "b", "cpu": "c", "memory_gb": 4, "os": "Linux"}))
    code, _, err = run_epi(monkeypatch, capsys, "submit", str(labs["A"]), "--out",
                           str(tmp_path / "sub"), "--hardware", str(hw))
    assert code == 2
    assert err.strip().count("\n") == 0 and "'thermal' missing" in err
    assert not any((tmp_path / "sub").glob("*"))  # nothing half-written stays


@pytest.mark.parametrize("command", ["submit", "site"])
def test_an_unwritable_out_is_one_line_and_exit_2(
        command: str, community: Path, labs: dict[str, Path], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    hw = hardware_file(tmp_path / "hw.json", "b")
    args = ([str(labs["A"]), "--hardware", str(hw)] if command == "submit"
            else [str(community)])
    code, _, err = run_epi(monkeypatch, capsys, command, *args, "--out",
                           str(blocker / "sub"))
    assert code == 2
    assert err.strip().count("\n") == 0 and "--out" in err


@pytest.mark.serial  # Chromium uses both cores
@pytest.mark.long
def test_site_renders_both_labs_and_its_filters_work_in_chromium(
        community: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    from host.report.browser import Browser

    bad = community.parent / "data-with-bad"
    shutil.copytree(community, bad)
    _edit(bad / "labA" / "s1", lambda doc: doc["configs"][1].update(epi=1.0))
    shutil.copytree(community / "labA" / "s1", bad / "labC" / "s1")
    _edit(bad / "labC" / "s1", lambda doc: doc["hardware"].pop("os"))
    code, out, err = run_epi(monkeypatch, capsys, "site", str(community), "--out",
                             str(tmp_path / "site"))
    assert code == 0, err
    assert "2 submission(s)" in out
    index = tmp_path / "site" / "index.html"

    def js(b: Browser, expr: str) -> object:
        res = b.pipe.send("Runtime.evaluate", {"expression": expr, "returnByValue": True},
                          session=b.sid)
        return res["result"].get("value")  # type: ignore[union-attr]

    visible = ("JSON.stringify(Array.from(document.querySelectorAll('#board tbody tr'))"
               ".filter(r => r.style.display !== 'none').map(r => r.cells[0].innerText + ' '"
               " + r.cells[1].innerText))")
    with Browser() as b:
        page = b.check(index)
        assert page.console_errors == []
        rows = json.loads(str(js(b, visible)))
        assert sorted(rows) == ["labA/s1 q4", "labA/s1 q8", "labB/s1 q4", "labB/s1 q8"]
        assert js(b, "document.getElementById('shown').textContent") == "4"
        # the power filter: only lab B's measured rows
        js(b, "var s=document.getElementById('f-power'); s.value='measured';"
              "s.dispatchEvent(new Event('change'))")
        assert sorted(json.loads(str(js(b, visible)))) == ["labB/s1 q4", "labB/s1 q8"]
        # the model filter on top of it, then cleared: one model in both labs
        js(b, "var s=document.getElementById('f-power'); s.value='';"
              "s.dispatchEvent(new Event('change'));"
              "var m=document.getElementById('f-model'); m.value='222222222222';"
              "m.dispatchEvent(new Event('change'))")
        assert sorted(json.loads(str(js(b, visible)))) == ["labA/s1 q8", "labB/s1 q8"]
        js(b, "var m=document.getElementById('f-model'); m.value='';"
              "m.dispatchEvent(new Event('change'));"
              "var q=document.getElementById('q'); q.value='x86';"
              "q.dispatchEvent(new Event('input'))")
        assert sorted(json.loads(str(js(b, visible)))) == ["labB/s1 q4", "labB/s1 q8"]
        js(b, "var q=document.getElementById('q'); q.value='';"
              "q.dispatchEvent(new Event('input'));"
              "document.querySelectorAll('#board th')[6].click()")
        # sorted by J/token, ascending: the order of the summaries' own figures
        order = json.loads(str(js(b, "JSON.stringify(Array.from(document.querySelectorAll("
                                     "'#board tbody tr')).map(r => r.cells[6].dataset.v))")))
        figures = sorted(
            c["j_per_token"] for lab in ("A", "B") for c in json.loads(
                (community / f"lab{lab}" / "s1" / "summary.json").read_text())["configs"])
        assert [float(v) for v in order] == pytest.approx(figures, rel=1e-12)
        # every row links to its submission's report page, which opens
        links = json.loads(str(js(b, "JSON.stringify(Array.from(document.querySelectorAll("
                                     "'#board tbody a')).map(a => a.getAttribute('href')))")))
        assert set(links) == {"submissions/labA--s1.html", "submissions/labB--s1.html"}
        sub = b.check(tmp_path / "site" / "submissions" / "labB--s1.html")
        assert sub.console_errors == [] and sub.title == "labB/s1"
        # the cross-lab comparison: same model and map, power source flagged unfair
        text = str(js(b, "document.body.innerText"))
    html_text = index.read_text()
    assert "UNFAIR: power source differ" in html_text
    assert "labB/s1" in text

    # a refused submission is left out and named
    code, out, err = run_epi(monkeypatch, capsys, "site", str(bad), "--out",
                             str(tmp_path / "site2"))
    assert code == 0, err
    assert "1 submission(s)" in out and out.count("left out:") == 2


def test_checker_recomputes_from_the_trace_even_when_every_hash_is_redone(
        community: Path, tmp_path: Path) -> None:
    """A trace with its energies scaled by 1.1 and the bundle re-hashed throughout (members,
    bundle.json, the summary's bundle_sha256): only the recomputation can tell, and it does,
    for every configuration."""
    from host.bundle import archive

    d = _copy(community, "B", tmp_path)
    path = d / "s1.epi-bundle.tar.gz"
    b = archive.read(path)
    files = dict(b.members)
    for name in [n for n in files if n.endswith(".samples.csv")]:
        frame = pd.read_csv(io.BytesIO(files[name]))
        frame["energy_j"] *= 1.1
        frame["power_w"] *= 1.1
        files[name] = frame.to_csv(index=False).encode()
    manifest = {k: v for k, v in b.manifest.items()
                if k not in ("format", "format_version", "members")}
    archive.write(path, files, manifest)
    _edit(d, lambda doc: doc.update(bundle_sha256=archive.sha256_bytes(path.read_bytes())))
    problems = check(d)
    assert any("configs[q4].j_per_token: summary says" in p for p in problems), problems
    assert any("configs[q8].j_per_token: summary says" in p for p in problems), problems
    assert not any("sha256" in p for p in problems), problems


@pytest.mark.long  # a third lab's study, submitted and built into a site
def test_an_invalid_run_is_not_counted_and_cannot_be_claimed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """q8's only run failed: the submission carries no q8 figure (0 of 1 runs valid, the
    reason given), the checker accepts that, refuses a summary that claims the run, and the
    site ranks q4 only."""
    analysis = lab_study(tmp_path / "c", seed=31, board="pi5-cluster", measured=False,
                         q8_status="failed")
    hw = hardware_file(tmp_path / "hw.json", "pi5-cluster")
    sub = tmp_path / "data" / "labC" / "s1"
    code, _, err = run_epi(monkeypatch, capsys, "submit", str(analysis), "--out", str(sub),
                           "--hardware", str(hw))
    assert code == 0, err
    doc = json.loads((sub / "summary.json").read_text())
    q8 = next(c for c in doc["configs"] if c["config"] == "q8")
    assert (q8["n_runs"], q8["n_runs_valid"], q8["j_per_token"], q8["epi"]) == (1, 0, None,
                                                                                  None)
    assert "no valid runs" in q8["reason"]
    assert check(sub) == []
    code, _, err = run_epi(monkeypatch, capsys, "site", str(tmp_path / "data"), "--out",
                           str(tmp_path / "site"))
    assert code == 0, err
    page = (tmp_path / "site" / "index.html").read_text()
    assert page.count("<tr data-model=") == 1 and "not ranked" in page
    claimed = tmp_path / "claimed"
    shutil.copytree(sub, claimed)
    _edit(claimed, lambda d: next(c for c in d["configs"] if c["config"] == "q8").update(
        n_runs_valid=1, j_per_token=1.3, reason=None))
    problems = check(claimed)
    assert any("configs[q8].n_runs_valid: summary says 1" in p for p in problems), problems
    assert any("configs[q8].j_per_token: summary says 1.3" in p for p in problems), problems


def test_checker_refuses_hardware_the_runs_contradict(
        community: Path, tmp_path: Path) -> None:
    """Build flags and nodes are what the bundle's runs record, not what a summary says."""
    d = _copy(community, "A", tmp_path)
    _edit(d, lambda doc: doc["hardware"].update(llama_cpp_build_flags=["-DGGML_NATIVE=ON"],
                                                nodes=["n0", "n1"]))
    problems = check(d)
    assert any("hardware.llama_cpp_build_flags: says ['-DGGML_NATIVE=ON'], the bundle's runs "
               "record ['-DGGML_NATIVE=OFF']" in p for p in problems), problems
    assert any("hardware.nodes: says ['n0', 'n1']" in p for p in problems), problems
