"""`epi report`: figures, tables and labels from an analysis of synthetic runs with exact
ground truth (piecewise-constant power, tests/host/conftest.py; the study is analysed and
rendered once per process, tests/host/report_fixtures.py), and the page in a real
browser (headless Chromium over the DevTools pipe)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from epi.core.errors import UserError
from host.report import data as report_data
from host.report.browser import Browser
from host.report.build import Report, write_report
from tests.host.report_fixtures import (  # noqa: F401  (fixtures)
    report_files,
    study_analysis,
    study_analysis_shared,
    study_report,
)

ARTIFACTS = Path(__file__).resolve().parents[2] / "out" / "test-artifacts"


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    """One headless Chromium for this module's pages (a start is most of a page check)."""
    with Browser() as b:
        yield b


def test_tables_carry_the_analysis_medians_and_invalid_runs_own_figures(
        study_analysis_shared):  # noqa: F811
    adir, truth = study_analysis_shared
    rd = report_data.load(adir)
    res = pd.read_csv(adir / "results.csv")
    h = res[(res["scope"] == "all") & (res["phase"] == "request") & (res["unit"] == "generated")
            & (res["basis"] == "gross")].set_index("config")
    # valid configurations: the analysis' median (and the ground truth) in the results table
    from host.report.tables import results_table, verdicts_table

    table = results_table(rd)
    rows = {r[0]: r for r in table.rows}
    for cfg in ("q4", "q8"):
        shown = float(rows[cfg][6].split(" ")[0])
        assert shown == pytest.approx(h.loc[cfg, "j_per_token_median"], rel=1e-3)
        assert shown == pytest.approx(truth[cfg], rel=0.01)
    # the failed run is not in any median, but its measured figure is shown, with the reason
    assert np.isnan(h.loc["q2", "j_per_token_median"])
    assert "invalid runs:" in rows["q2"][6]
    inv = float(rows["q2"][6].split("invalid runs: ")[1])
    assert inv == pytest.approx(truth["q2"], rel=0.01)
    assert table.row_classes[[r[0] for r in table.rows].index("q2")] == "invalid"
    vt = verdicts_table(rd)
    q2 = next(r for r in vt.rows if r[1] == "q2" and r[3] == "request")
    assert q2[4] == "INVALID" and "out of memory" in q2[9]
    assert float(q2[5]) == pytest.approx(truth["q2"], rel=0.01)


def test_every_figure_and_table_says_power_source_basis_and_counts(
        study_analysis_shared, study_report: Report):  # noqa: F811
    files = report_files(study_report)  # render_files(adir), as write_report wrote it
    md = files["report.md"].decode()
    html = files["report.html"].decode()
    rd = report_data.load(study_analysis_shared[0])
    assert rd.labels.power_source == "modelled"  # the synthetic trace says emulated
    for key in ("accuracy_vs_energy", "epi_sorted", "phase_energy", "power_trace",
                "layer_groups", "energy_vs_size", "energy_vs_bytes"):
        assert f"figures/{key}.png" in files and f"figures/{key}.svg" in files
        assert files[f"figures/{key}.png"][:8] == b"\x89PNG\r\n\x1a\n"
        assert b"<svg" in files[f"figures/{key}.svg"][:2000]
    captions = re.findall(r"<figcaption>(.*?)</figcaption>", html, re.S)
    tcaps = re.findall(r'<p class="caption">(.*?)</p>', html, re.S)
    assert len(captions) == 7 and len(tcaps) >= 4
    # the labels are stated once, in the "how these figures were measured" block ...
    block = re.search(r'<section class="method" id="method">(.*?)</section>', html, re.S)
    assert block is not None
    text = block.group(1)
    assert "power:</dt> <dd>modelled" in text and "energy basis:</dt> <dd>gross" in text
    assert "method:</dt> <dd>counter energy, step window edges" in text
    for phase in ("request", "prefill", "decode"):
        assert re.search(rf"{phase}: \d+ runs \(\d+ valid\), \d+ repeats, \d+ meter samples "
                         rf"in {phase} windows", text)
    assert html.count("energy basis:</dt>") == 1 and md.count("**energy basis:**") == 1
    assert "modelled (modelled" not in html and "modelled (modelled" not in md
    # ... and every caption keeps the short power tag and says only what differs
    for cap in captions + tcaps[:4]:
        assert "[modelled power, gross energy]" in cap, cap
        assert "energy basis:" not in cap and len(cap) < 800, cap
    assert "no intervals (medians per request)" in captions[2]
    assert re.search(r"one request, not a median: \d+ sweeps shown, \d+ samples", captions[3])
    assert "MODELLED" in html and "MODELLED" in md
    # the paper's results-table columns, in order
    assert "| Config | Early | Middle | Late | Size | Perplexity | J/Token | Accuracy | EPI |" in md
    # self-contained: no external resource, images inline
    assert not re.search(r'(src|href)="(https?:|//|file:)', html)
    assert html.count('src="data:image/png;base64,') == 7


def test_measured_trace_is_labelled_measured(study_analysis):  # noqa: F811
    adir, _ = study_analysis
    doc = json.loads((adir / "results.json").read_text())
    doc["trace"]["emulated"] = False
    doc["trace"]["power_models"] = []
    (adir / "results.json").write_text(json.dumps(doc))
    res = pd.read_csv(adir / "results.csv")
    # the analysis' own column decides first
    assert (res["power_source"].str.startswith("modelled")).all()
    res["power_source"] = "measured"
    res.to_csv(adir / "results.csv", index=False)
    assert report_data.load(adir).labels.power_source == "measured"
    res.loc[res.index[-1], "power_source"] = "modelled (ActivityModel)"
    res.to_csv(adir / "results.csv", index=False)
    assert report_data.load(adir).labels.power_source == "modelled"  # one modelled row is enough
    res["power_source"] = "modelled: activity model"
    res["ci_method"] = "BCa bootstrap"
    res.to_csv(adir / "results.csv", index=False)
    lab = report_data.load(adir).labels
    assert lab.power_source == "modelled"
    assert lab.ci_text.startswith("J/token: BCa bootstrap, coverage 75 % n=3 (q4, q8)")


def test_cli_writes_report_atomically_and_errors_are_one_line(study_report: Report,  # noqa: F811
                                                              study_analysis,  # noqa: F811
                                                              tmp_path):
    # `epi report ADIR --out OUT` through the click command: study_report ran it (exit 0)
    out = study_report.out_dir
    assert (out / "report.html").is_file() and (out / "report.md").is_file()
    assert len(list((out / "figures").glob("*.png"))) == 7
    adir, _ = study_analysis
    (adir / "windows.csv").unlink()
    with pytest.raises(UserError, match=r"windows\.csv: missing"):
        write_report(adir, tmp_path / "rep2")
    assert not (tmp_path / "rep2").exists()


@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=st.text(max_size=200))
def test_hostile_results_json_is_one_line_error(tmp_path_factory, text):
    d = tmp_path_factory.mktemp("bad")
    for name in report_data.FILES:
        (d / name).write_text("a,b\n1,2\n")
    (d / "results.json").write_text(text)
    with pytest.raises(UserError) as exc:
        report_data.load(d)
    assert "\n" not in str(exc.value) and "results" in str(exc.value)


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(key=st.sampled_from(["options", "trace", "runs", "pareto", "notes", "savings",
                            "layer_groups", "runs.0", "runs.0.config", "trace.path",
                            "trace.emulated", "trace.power_models"]),
       value=st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
                          lambda inner: st.lists(inner, max_size=3)
                          | st.dictionaries(st.text(max_size=5), inner, max_size=3),
                          max_leaves=8))
def test_hostile_results_json_fields_are_one_line_errors(tmp_path_factory, key, value):
    """A results.json field of the wrong type: one line naming the file, never a traceback."""
    d = tmp_path_factory.mktemp("badfield")
    for name in report_data.FILES:
        (d / name).write_text("")  # empty tables: only results.json can be wrong
    (d / "results.csv").write_text("config,scope,phase,unit,basis\n")
    doc = {"format": "epi-analysis", "options": {}, "trace": {"path": "t", "emulated": True,
           "power_models": []}, "runs": [{"config": "c", "run_id": "r", "path": "p"}]}
    *parents, last = key.split(".")
    target = doc
    for k in parents:
        target = target[int(k)] if isinstance(target, list) else target[k]
    if isinstance(target, list):
        target[int(last)] = value
    else:
        target[last] = value
    (d / "results.json").write_text(json.dumps(doc))
    try:
        report_data.load(d)
    except UserError as exc:
        assert "\n" not in str(exc) and "results.json" in str(exc)


@pytest.mark.serial  # Chromium's processes use both cores: two pages at once took 8 and 17 s
def test_report_in_headless_chromium(study_report: Report, browser: Browser):  # noqa: F811
    """The page a reader opens: every figure loads (natural size), no console errors;
    the screenshot is kept as a test artifact."""
    page = browser.check(study_report.html)
    assert len(page.images) == 7
    for img in page.images:
        assert img["complete"] and img["natural_width"] > 200 and img["natural_height"] > 150, img
    assert page.console_errors == []
    assert page.screenshot_png[:8] == b"\x89PNG\r\n\x1a\n"
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    (ARTIFACTS / "report-screenshot.png").write_bytes(page.screenshot_png)


def test_browser_check_sees_broken_images_and_console_errors(tmp_path, browser: Browser):
    """The browser check can fail: a missing image and a console error are reported."""
    page = tmp_path / "bad.html"
    page.write_text('<html><body><img alt="x" src="missing.png">'
                    '<script>console.error("boom")</script></body></html>')
    res = browser.check(page)
    assert res.images[0]["natural_width"] == 0
    assert any("boom" in e for e in res.console_errors)


def test_token_times_come_from_the_token_log_reader(tmp_path: Path) -> None:
    from epi.formats.tokenlog import EVENT_COLUMNS
    from host.report.figures import _token_times

    rows = [[0, 0, 0, "p", "request_start", "", "", 100, 1], [0, 0, 0, "p", "token", 0, 5, 110, 2],
            [1, 0, 0, "p", "token", 0, 7, 115, 3], [0, 0, 0, "p", "token", 1, 6, 120, 4]]
    (tmp_path / "events.csv").write_text(
        ",".join(EVENT_COLUMNS) + "\n" + "".join(",".join(map(str, r)) + "\n" for r in rows))
    assert _token_times(tmp_path, 0) == [110, 120]
    assert _token_times(tmp_path, 1) == [115]
    (tmp_path / "events.csv").write_text("request_id\n\xff")  # refused: no token lines drawn
    assert _token_times(tmp_path, 0) == []
    assert _token_times(tmp_path / "gone", 0) == []
