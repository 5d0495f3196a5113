"""`epi report` against hostile output directories and corrupted analysis files:
the user's other files in `--out` are never touched, and an analysis whose files disagree
(negative joules, duplicated rows, a newer format, a configuration without runs, a windows.csv
cut short, verdicts that contradict the figures) is refused in one line, never rendered into a
report that contradicts itself, never a traceback. HTML in a title or a name is escaped.
"""

# ruff: noqa: F811  (test functions take the imported fixtures)
from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from matplotlib.figure import Figure

from epi.core.errors import UserError
from host.report import build as report_build
from host.report import data as report_data
from host.report import tables as report_tables
from host.report.build import write_report
from tests.cli_run import run_epi
from tests.host.report_fixtures import (  # noqa: F401  (fixtures)
    figures_unsaved,
    once,
    study_analysis,
    study_analysis_shared,
    unsaved_figure,
)

Runner = Callable[..., tuple[int, str]]


@pytest.fixture
def rendered_once(study_analysis_shared, tmp_path_factory: pytest.TempPathFactory,
                  monkeypatch: pytest.MonkeyPatch) -> Callable[[], None]:
    """Makes `render_files` hand back the study's report files as rendered once per process
    (report.html, report.md and the figure files, these as placeholders: see
    `figures_unsaved`), for tests of where the files go, not of what they say. Call it (again
    after `monkeypatch.undo()`) to put it in place."""
    def render(_root: Path) -> dict[str, bytes]:
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(Figure, "savefig", unsaved_figure)
            return report_build.render_files(study_analysis_shared[0])
    files = once("study-files", tmp_path_factory, render)

    def patch() -> None:
        monkeypatch.setattr(report_build, "render_files", lambda *_a, **_k: dict(files))
    patch()
    return patch


@pytest.fixture
def cli(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> Runner:
    """`epi report ADIR --out OUT ...` through the real entry point: (exit code, output)."""
    def run(adir: Path, out: Path, *extra: str) -> tuple[int, str]:
        code, stdout, stderr = run_epi(monkeypatch, capsys, "report", str(adir), "--out",
                                       str(out), *extra)
        return code, stdout + stderr
    return run


def _one_line_refusal(cli: Runner, adir: Path, out: Path, *needles: str) -> str:
    code, text = cli(adir, out)
    assert code != 0, text
    lines = [ln for ln in text.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in text, text
    for n in needles:
        assert n in lines[0], lines[0]
    assert not (out / "report.html").exists()
    return lines[0]


# --------------------------------------------------------------------------- --out
def test_out_keeps_the_users_other_files(cli: Runner, study_analysis_shared, rendered_once,
                                         tmp_path: Path) -> None:
    adir, _ = study_analysis_shared
    out = tmp_path / "mine"
    (out / "notes").mkdir(parents=True)
    (out / "thesis.tex").write_text("my work")
    (out / "notes" / "a.txt").write_text("keep")
    (out / "figures").mkdir()
    (out / "figures" / "my-plot.png").write_bytes(b"mine")
    (out / "report.md").write_text("an older report")
    code, text = cli(adir, out)
    assert code == 0, text
    assert (out / "thesis.tex").read_text() == "my work"
    assert (out / "notes" / "a.txt").read_text() == "keep"
    assert (out / "figures" / "my-plot.png").read_bytes() == b"mine"
    assert (out / "report.md").read_text().startswith("# ")  # the report's own file: replaced
    assert (out / "report.html").is_file()
    assert not [p for p in out.iterdir() if p.name.startswith(".epi-report-tmp")]
    # nothing staged beside the output directory either
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_a_failed_render_leaves_out_as_it_was(study_analysis_shared, rendered_once,
                                              tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    adir, _ = study_analysis_shared
    out = tmp_path / "rep"
    write_report(adir, out)
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}

    def boom(*_a: object, **_k: object) -> dict[str, bytes]:
        raise UserError("render failed")

    monkeypatch.setattr(report_build, "render_files", boom)
    with pytest.raises(UserError):
        write_report(adir, out)
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before


def test_an_unwritable_out_is_one_line_before_any_rendering(
        cli: Runner, study_analysis_shared, rendered_once, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    adir, _ = study_analysis_shared
    called = []
    monkeypatch.setattr(report_build, "render_files",
                        lambda *a, **k: called.append(1) or {})
    blocker = tmp_path / "file"
    blocker.write_text("x")
    for out in (blocker, blocker / "sub"):
        code, text = cli(adir, out)
        assert code != 0 and len(text.strip().splitlines()) == 1, text
        assert "--out" in text and "Traceback" not in text
    if os.geteuid() != 0:  # root can write anywhere
        ro = tmp_path / "ro"
        ro.mkdir()
        ro.chmod(0o500)
        code, text = cli(adir, ro / "rep")
        assert code != 0 and "not a writable directory" in text
    # a report file's place taken by a directory: refused, the directory kept
    out = tmp_path / "taken"
    (out / "report.html").mkdir(parents=True)
    monkeypatch.undo()
    rendered_once()  # renders (the study's report), then refuses to write over the directory
    code, text = cli(adir, out)
    assert code != 0 and "report.html exists and is not a file" in text
    assert (out / "report.html").is_dir()
    assert called == []


# --------------------------------------------------------------------------- corrupted inputs
def _csv(adir: Path, name: str) -> pd.DataFrame:
    return pd.read_csv(adir / name)


def test_negative_joules_in_results_csv_are_refused(cli: Runner, study_analysis,
                                                     tmp_path: Path) -> None:
    adir, _ = study_analysis
    res = _csv(adir, "results.csv")
    i = res.index[(res["config"] == "q4") & (res["basis"] == "gross")][0]
    res.loc[i, "j_per_token_median"] = -0.5
    res.to_csv(adir / "results.csv", index=False)
    _one_line_refusal(cli, adir, tmp_path / "r", "results.csv", "j_per_token_median", "negative")


def test_duplicated_rows_in_results_csv_are_refused(cli: Runner, study_analysis,
                                                     tmp_path: Path) -> None:
    adir, _ = study_analysis
    res = _csv(adir, "results.csv")
    pd.concat([res, res.iloc[[3]]]).to_csv(adir / "results.csv", index=False)
    _one_line_refusal(cli, adir, tmp_path / "r", "results.csv", "duplicated row")


def test_a_newer_format_version_is_refused(cli: Runner, study_analysis, tmp_path: Path) -> None:
    adir, _ = study_analysis
    doc = json.loads((adir / "results.json").read_text())
    doc["format_version"] = 99
    (adir / "results.json").write_text(json.dumps(doc))
    _one_line_refusal(cli, adir, tmp_path / "r", "results.json", "newer")


def test_a_configuration_missing_from_results_json_is_refused(cli: Runner, study_analysis,
                                                              tmp_path: Path) -> None:
    adir, _ = study_analysis
    doc = json.loads((adir / "results.json").read_text())
    doc["runs"] = [r for r in doc["runs"] if r["config"] != "q8"]
    (adir / "results.json").write_text(json.dumps(doc))
    _one_line_refusal(cli, adir, tmp_path / "r", "'q8'", "no run in results.json")


def test_a_configuration_missing_from_results_csv_is_refused(cli: Runner, study_analysis,
                                                             tmp_path: Path) -> None:
    adir, _ = study_analysis
    res = _csv(adir, "results.csv")
    res[res["config"] != "q4"].to_csv(adir / "results.csv", index=False)
    _one_line_refusal(cli, adir, tmp_path / "r", "results.csv", "'q4'", "has no row")


def test_a_truncated_windows_csv_is_refused(cli: Runner, study_analysis, tmp_path: Path) -> None:
    adir, _ = study_analysis
    text = (adir / "windows.csv").read_bytes()
    (adir / "windows.csv").write_bytes(text[: len(text) - 40])  # cut mid-line
    _one_line_refusal(cli, adir, tmp_path / "r", "windows.csv", "truncated")
    lines = text.decode().splitlines(keepends=True)
    (adir / "windows.csv").write_text("".join(lines[: len(lines) // 2]))  # cut at a line end
    _one_line_refusal(cli, adir, tmp_path / "r", "windows.csv", "runs.csv counted")


def test_verdicts_that_contradict_the_figures_are_refused(cli: Runner, study_analysis,
                                                          tmp_path: Path) -> None:
    """A valid configuration turned invalid in runs.csv would show as 'null — invalid runs'
    beside its own median; refused instead."""
    adir, _ = study_analysis
    runs = _csv(adir, "runs.csv")
    runs.loc[runs["config"] == "q4", "valid"] = False
    runs.to_csv(adir / "runs.csv", index=False)
    _one_line_refusal(cli, adir, tmp_path / "r", "runs.csv", "'q4'", "valid run")


@pytest.mark.usefixtures("figures_unsaved")  # the words are escaped, not the pixels
def test_html_in_a_title_or_a_name_is_escaped(cli: Runner, study_analysis, tmp_path: Path) -> None:
    adir, _ = study_analysis
    doc = json.loads((adir / "results.json").read_text())
    doc["notes"] = ["<script>alert('note')</script>"]
    for r in doc["runs"]:
        if r["run_id"] == "r_q2":
            r["path"] = "/x/<img src=x onerror=alert(1)>"
    (adir / "results.json").write_text(json.dumps(doc))
    code, text = cli(adir, tmp_path / "r", "--title", "<script>alert(1)</script> $x$ & co")
    assert code == 0, text
    for name in ("report.html", "report.md"):
        page = (tmp_path / "r" / name).read_text()
        assert "<script>" not in page and "<img src=x" not in page
        assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page


@pytest.mark.long
@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_generated_corruptions_of_the_tables_are_refused_or_consistent(study_analysis_shared,
                                                                       tmp_path_factory,
                                                                       data) -> None:
    """Any cell of results.csv, runs.csv or windows.csv replaced with a hostile value: the
    loader refuses in one line, or the tables render (never another exception)."""
    src, _ = study_analysis_shared
    d = tmp_path_factory.mktemp("corrupt")
    for name in (*report_data.FILES, "comparisons.csv"):
        if (src / name).exists():
            (d / name).write_bytes((src / name).read_bytes())
    name = data.draw(st.sampled_from(["results.csv", "runs.csv", "windows.csv"]))
    table = pd.read_csv(d / name)
    row = data.draw(st.integers(0, len(table) - 1))
    col = data.draw(st.sampled_from(list(table.columns)))
    value = data.draw(st.one_of(st.floats(allow_nan=True, allow_infinity=True),
                                st.integers(-10**12, 10**12), st.text(max_size=20),
                                st.sampled_from(["", "True", "False", "-1", "nan"])))
    table[col] = table[col].astype(object)
    table.loc[row, col] = value
    table.to_csv(d / name, index=False)
    try:
        rd = report_data.load(d)
    except UserError as exc:
        assert "\n" not in str(exc) and str(d) in str(exc)
        return
    for build in (report_tables.build_all,):
        build(rd)


_RECORD_KEYS = ["comparisons", "perplexity_matched_pairs", "savings", "phase_breakdown",
                "layer_groups", "pareto", "notes"]
_FIELDS = ["config", "config_a", "config_b", "cheaper", "dearer", "baseline", "comparison",
           "group", "type_a", "type_b", "energy_distinguishable", "distinguishable",
           "saving_pct", "energy_delta_j_per_token", "delta_j_per_token", "ci_lo", "ci_hi",
           "prefill_mj", "decode_mj", "idle_mj", "ppl_cheaper", "energy_saving_pct", "reason"]
_VALUES = st.one_of(st.none(), st.booleans(), st.integers(-10, 10**6), st.floats(),
                    st.sampled_from(["q4", "q8", "q2", "nope", ""]), st.text(max_size=8),
                    st.lists(st.integers(), max_size=2),
                    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2))


@pytest.mark.long
@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(key=st.sampled_from(_RECORD_KEYS),
       entry=st.dictionaries(st.sampled_from(_FIELDS), _VALUES, min_size=1, max_size=8),
       extra=_VALUES)
def test_generated_results_json_records_are_refused_or_worded(study_analysis_shared,
                                                              tmp_path_factory, key, entry,
                                                              extra) -> None:
    """Hostile records in results.json (comparisons, pairs, savings, phase breakdown, the
    layer-group differential, pareto, notes): refused in one line naming the field, or the
    answers, blocks and tables are built — never another exception."""
    from host.report import answers, method

    src, _ = study_analysis_shared
    d = tmp_path_factory.mktemp("records")
    for name in (*report_data.FILES, "comparisons.csv"):
        if (src / name).exists():
            (d / name).write_bytes((src / name).read_bytes())
    doc = json.loads((d / "results.json").read_text())
    if key == "layer_groups":
        doc[key] = {"differential": [entry, extra]}
    elif key in ("pareto", "notes"):
        doc[key] = [extra]
    else:
        doc[key] = [entry, extra]
    (d / "results.json").write_text(json.dumps(doc))
    try:
        rd = report_data.load(d)
    except UserError as exc:
        assert "\n" not in str(exc) and "results.json" in str(exc)
        return
    report_tables.build_all(rd)
    answers.build(rd)
    method.measurement_block(rd)


def test_an_emptied_runs_csv_is_refused_not_read_as_no_valid_run(cli: Runner, study_analysis,
                                                                 tmp_path: Path) -> None:
    adir, _ = study_analysis
    runs = _csv(adir, "runs.csv")
    runs.iloc[0:0].to_csv(adir / "runs.csv", index=False)  # the header only
    _one_line_refusal(cli, adir, tmp_path / "r", "runs.csv", "holds no run", "results.json")


def test_a_null_headline_beside_valid_runs_is_refused(cli: Runner, study_analysis,
                                                      tmp_path: Path) -> None:
    adir, _ = study_analysis
    res = _csv(adir, "results.csv")
    head = ((res["config"] == "q4") & (res["scope"] == "all") & (res["phase"] == "request")
            & (res["unit"] == "generated") & (res["basis"] == "gross"))
    assert int(res.loc[head, "n_runs_valid"].iloc[0]) > 0
    res.loc[head, "j_per_token_median"] = float("nan")
    res.to_csv(adir / "results.csv", index=False)
    _one_line_refusal(cli, adir, tmp_path / "r", "results.csv", "'q4'",
                      "j_per_token_median is empty")
