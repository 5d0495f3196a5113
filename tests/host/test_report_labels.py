"""What the report says about its intervals, its comparisons and its power: each interval with
its own coverage (a percent) and n when configurations have different repeat counts, the paired
comparisons of comparisons.csv with their verdicts, and "component power, not wall power" for
software-counter channels — on analyses of files written per docs/formats.md by the test
fixtures (tests/host/conftest.py). These tests read the report's words: its figures are built
(captions, alt text) but not drawn into PNG/SVG (report_fixtures.figures_unsaved; the drawn
figures are test_report.py's subject). Expected coverages are the exact binomial figures
1 − 2·0.5ⁿ (n = 3: 75 %, n = 6: 96.875 %), computed here, not by the code under test."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pandas as pd
import pytest

from host.analysis.model import Options
from host.analysis.output import analyze_to
from host.report import data as report_data
from host.report import tables as report_tables
from host.report.build import render_files
from host.report.method import measurement_block
from tests.host.report_fixtures import (  # noqa: F401  (fixtures)
    figures_unsaved,
    interleaved_flips0,
    interleaved_flips10,
    mixed_n,
    mixed_n_shared,
)

NS = 1_000_000_000
COMPONENT = "component power, not wall power"


def _write(tmp_path: Path, runs: list[Path], tdir: Path, opts: Options,
           acc: Path | None = None) -> Path:
    out = tmp_path / "analysis"
    analyze_to(out, runs, tdir, opts, acc)
    return out


def _pct(x: float) -> str:
    p = 100 * x
    return f"{p:.0f} %" if abs(p - round(p)) < 0.05 else f"{p:.1f} %"


@pytest.mark.usefixtures("figures_unsaved")
def test_each_cell_and_caption_states_its_own_coverage_and_n(mixed_n_shared: Path  # noqa: F811
                                                            ) -> None:
    adir = mixed_n_shared  # q4 with 6 repeats, q8 with 3 (report_fixtures.build_mixed_n)
    cov6, cov3 = 1 - 2 * 0.5 ** 6, 1 - 2 * 0.5 ** 3  # [min, max] of the median, exact
    rd = report_data.load(adir)
    t = report_tables.results_table(rd)
    rows = {r[0]: r for r in t.rows}
    assert rows["q4"][6].endswith(f"] {_pct(cov6)} n=6")  # "96.9 % n=6"
    assert rows["q8"][6].endswith(f"] {_pct(cov3)} n=3")  # "75 % n=3"
    # EPI combines two intervals: only a lower bound on its coverage, said as one
    assert rows["q4"][8].endswith(f"] ≥{_pct(cov6 + 0.95 - 1)} n=6")
    assert rows["q8"][8].endswith(f"] ≥{_pct(cov3 + 0.95 - 1)} n=3")
    # accuracy intervals are the accuracy file's 95 % intervals, not J/token's label
    assert rows["q4"][7].endswith("] 95 %")
    cap = dict(measurement_block(rd))["intervals"]  # stated once, for every figure and table
    assert f"{_pct(cov6)} n=6 (q4)" in cap and f"{_pct(cov3)} n=3 (q8)" in cap
    assert "no 95 % interval of the median exists from n=3 repeats" in cap
    assert "accuracy: the accuracy file's 95 % interval" in cap and "EPI: J/token interval" in cap
    files = render_files(adir)
    for name in ("report.md", "report.html"):
        text = files[name].decode()
        assert "bootstrap" not in text and "coverage 0.9" not in text
        assert not re.search(r"coverage 0\.\d", text)  # never a raw fraction
        assert "median difference" not in text
        assert "95 % order-statistic" not in text and "95% bootstrap" not in text
    md = files["report.md"].decode()
    assert "mean difference B − A" in md and "paired-t interval over rounds" in md


def test_no_interval_label_is_invented_for_an_older_analysis(mixed_n: Path) -> None:  # noqa: F811
    res = pd.read_csv(mixed_n / "results.csv").drop(columns=["ci_method", "ci_coverage",
                                                             "ci_note"])
    res.to_csv(mixed_n / "results.csv", index=False)
    text = report_data.load(mixed_n).labels.ci_text
    assert "coverage unknown" in text and "95" not in text


@pytest.mark.usefixtures("figures_unsaved")
def test_report_shows_paired_comparisons_and_savings_intervals(
        interleaved_flips10: Path) -> None:  # noqa: F811
    adir = interleaved_flips10  # q8 right on 10 more items, baseline q4
    rd = report_data.load(adir)
    comp = pd.read_csv(adir / "comparisons.csv")
    c = report_tables.comparisons_table(rd)
    kinds = {r[0] for r in c.rows}
    assert {"savings vs baseline", "frontier neighbours"} <= kinds
    assert len(c.rows) == len(comp)
    row = next(r for r in c.rows if r[0] == "savings vs baseline")
    assert row[1:3] == ["q4", "q8"]
    # 3 rounds (each the mean of its run's 2 repeats): n = 3 pairs, a real 95 % t interval
    assert row[3].endswith("] 95 % n=3") and row[4] == "paired by round"
    assert row[5] == "q8 uses more than q4"
    assert "McNemar p=0.00195" in row[6]  # 10 discordant items, all one way: 2/2¹⁰
    assert row[7] == "q8 uses more energy than q4; q8 is more accurate"
    s = report_tables.savings_table(rd)
    srow = next(r for r in s.rows if r[0] == "q8")
    lo, hi = (float(x) for x in re.search(r"\[(\S+), (\S+)\]", srow[2]).groups())
    assert hi < 0 and lo - 0.01 <= -3.0 <= hi + 0.01  # q8 draws 3 % more: resolved
    assert srow[2].endswith("95 % n=3") and srow[4] == "q8 uses more than q4"
    p = report_tables.pairs_table(rd)
    assert "do not overlap" not in p.caption and "paired interval" in p.caption
    md = render_files(adir)["report.md"].decode()
    assert "## Paired comparisons" in md or "Paired comparisons" in md
    assert "cannot be told apart" in md  # the caption says what the verdict means


def test_comparison_that_cannot_be_told_apart_says_so(interleaved_flips0: Path  # noqa: F811
                                                       ) -> None:
    adir = interleaved_flips0  # both right on the same items, baseline q4
    c = report_tables.comparisons_table(report_data.load(adir))
    row = next(r for r in c.rows if r[0] == "savings vs baseline")
    assert row[6].endswith("cannot be told apart")


# --------------------------------------------------------------------------- component power
def _software_channel(tdir: Path, channels: dict[int, tuple[str, str]], *,
                      emulated: bool) -> None:
    """Rewrite the fixture trace's meta: `channels[ch] = (source, scope)` become software
    channels (no meter constant, a counter step) as docs/sources.md describes them."""
    for meta in tdir.glob("seg-*.meta.json"):
        m = json.loads(meta.read_text())
        for c in m["channels"]:
            if c["channel"] in channels:
                src, scope = channels[c["channel"]]
                c.update(source=src, scope=scope, meter_constant_imp_per_kwh=None,
                         resolution_j=1e-6, name=f"{src}:{scope}", node="n0")
        m["emulated"] = emulated
        if not emulated:
            m.pop("power_model", None)
            m["board"] = None
        meta.write_text(json.dumps(m))


@pytest.mark.usefixtures("figures_unsaved")
def test_rapl_only_trace_is_component_power_in_report_and_results_csv(tmp_path: Path,
                                                                      synth_run) -> None:
    tdir, rdir, _, _ = synth_run()
    _software_channel(tdir, {0: ("rapl", "package")}, emulated=False)
    adir = _write(tmp_path, [rdir], tdir, Options())
    res = pd.read_csv(adir / "results.csv")
    assert res["power_source"].str.contains(COMPONENT).all()
    assert res["power_source"].str.startswith("measured").all()
    rd = report_data.load(adir)
    assert rd.labels.power_source == "measured" and COMPONENT in rd.labels.power_detail
    files = render_files(adir)
    for name in ("report.md", "report.html"):
        text = files[name].decode()
        assert COMPONENT in text
        assert "ATM90E26" not in text  # no wall meter was there
    md = files["report.md"].decode()
    caps = [ln for ln in md.splitlines() if ln.startswith(("Medians", "EPI per", "Median "))]
    assert caps and all(COMPONENT in ln for ln in caps)


@pytest.mark.usefixtures("figures_unsaved")
def test_emulated_wall_and_software_channel_are_labelled_side_by_side(tmp_path: Path,
                                                                      synth_tools) -> None:
    sched = synth_tools.make_schedule(500 * NS)
    wall = sched.profile(**synth_tools.LEVELS)
    package = synth_tools.Steps(wall.t_ns, wall.level_w * 0.5)  # RAPL sees half the wall
    tdir = synth_tools.write_trace(tmp_path / "trace", {0: wall, 1: package}, 498 * NS,
                                   sched.requests[-1]["end"] + 3 * NS, nodes={0: "n0", 1: "n0"})
    rdir = synth_tools.write_run(tmp_path / "run1", sched, nodes=["n0"])
    _software_channel(tdir, {1: ("rapl", "package")}, emulated=True)
    adir = _write(tmp_path, [rdir], tdir, Options())
    res = pd.read_csv(adir / "results.csv")
    # the main figures are the (emulated) wall channel: modelled, not component power
    assert res["power_source"].str.startswith("modelled").all()
    assert not res["power_source"].str.contains(COMPONENT).any()
    rd = report_data.load(adir)
    t = report_tables.components_table(rd)
    assert t is not None and t.rows
    for r in t.rows:
        assert r[5] == COMPONENT and r[8] == "wall power (emulated: modelled, not measured)"
        assert r[6] != "null" and r[9] != "null"  # both figures, side by side
        assert float(r[11]) == pytest.approx(2.0, rel=1e-3)  # wall / component, by design
    md = render_files(adir)["report.md"].decode()
    assert "Component power beside wall power" in md
    assert f"| {COMPONENT} |" in md and "wall power (emulated: modelled, not measured)" in md


# --------------------------------------------------------------------------- manifests
def test_corrupt_manifest_is_said_corrupt_with_its_path(mixed_n: Path,  # noqa: F811
                                                        tmp_path: Path) -> None:
    doc = json.loads((mixed_n / "results.json").read_text())
    for run in doc["runs"]:
        if run["config"] == "q4":
            run["model"]["path"] = str(tmp_path / "q4.gguf")
    (mixed_n / "results.json").write_text(json.dumps(doc))
    bad = tmp_path / "q4.manifest.json"
    bad.write_text("{not json")
    rd = report_data.load(mixed_n)  # the report still renders
    t = report_tables.results_table(rd)
    q4 = next(r for r in t.rows if r[0] == "q4")
    assert q4[1:4] == ["corrupt manifest"] * 3  # not "?", which means "no manifest"
    assert "corrupt manifest" in t.caption and str(bad) in t.caption
    q8 = next(r for r in t.rows if r[0] == "q8")
    assert q8[1:4] == ["?"] * 3  # no manifest at all


@pytest.mark.parametrize(("cv", "said"), [(0.03, "a CV above 3 % (cv_threshold)"),
                                          (0.08, "above 8 % (cv_threshold, the default is 3 %)")])
def test_the_measurement_block_states_the_repeat_spread_gate(mixed_n: Path,  # noqa: F811
                                                             cv: float, said: str) -> None:
    doc = json.loads((mixed_n / "results.json").read_text())
    doc["options"]["cv_threshold"] = cv
    (mixed_n / "results.json").write_text(json.dumps(doc))
    entries = dict(measurement_block(report_data.load(mixed_n)))
    assert said in entries["invalid runs"]
