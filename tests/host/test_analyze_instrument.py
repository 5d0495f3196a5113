"""Every J/token figure carries its instrument uncertainty beside the repeat interval,
and the analysis says whether the board that made the trace was qualified.

Expected figures come from the datasheet closed form (docs/atm90e26.md §3, meter/plan.py's
doc): chip class 0.1 %, a plug-in calibration reference 1 % (k = 1), the CT class when
uncalibrated, one energy count = 0.1 CF pulse = 0.1 × 3.6e6 J / meter constant, combined
root-sum-square — written out here, not taken from host.analysis.instrument.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from epi import cli as epi_cli
from host.analysis.output import analyze_to
from host.analysis.pipeline import Options, analyze
from tests.host.conftest import write_synth_run

METER_CONSTANT = 1e7  # the synthetic trace's (tests/host/conftest.py write_trace)
COUNT_J = 0.1 * 3.6e6 / METER_CONSTANT  # one energy count: 0.036 J


def _measured(tdir: Path, source: str, ct: dict | None = None,
              qualification: object = None) -> None:
    """Rewrite the synthetic trace's meta as a real board's: measured, calibration `source`."""
    for meta_path in sorted(tdir.glob("seg-*.meta.json")):
        m = json.loads(meta_path.read_text())
        m["emulated"] = False
        m.pop("power_model", None)
        for ch in m["channels"]:
            ch["calibration"] = {"source": source}
            ch["ct"] = ct
        if qualification is not None:
            m["qualification"] = qualification
        meta_path.write_text(json.dumps(m))


def _qual_record(passed: bool, class_pct: float) -> dict:
    return {"format": "epi-meter-qualification", "format_version": 1, "board": "b.toml",
            "emulated": False, "reference": "plug-in energy meter ± 1 %", "passed": passed,
            "channels": [{"channel": "ch0", "accuracy_class_pct": class_pct,
                          "passed": passed}]}


def _headline(a) -> pd.Series:
    r = a.results
    return r[(r["scope"] == "all") & (r["phase"] == "request") & (r["unit"] == "generated")
             & (r["basis"] == "gross")].iloc[0]


def _expected(ref_pct: float, energy_j: float) -> float:
    return math.sqrt(0.1 ** 2 + ref_pct ** 2 + (COUNT_J / energy_j * 100.0) ** 2)


@pytest.fixture(scope="module")
def calibrated(tmp_path_factory: pytest.TempPathFactory) -> SimpleNamespace:
    """The `synth_run()` run and trace (tests/host/conftest.py, the same writers and
    defaults), its meta rewritten as a board calibrated against cal/ch0.json with no
    qualification.json beside it, analysed once into `out` with the default options.

    Shared by the tests that read this one analysis, or analyse these inputs again with other
    options (five tests used to generate and analyse the same inputs). Nothing may write
    into it: the tests that need other meta build their own run."""
    root = tmp_path_factory.mktemp("calibrated")
    tdir, rdir, _, _ = write_synth_run(root)
    cal = root / "cal" / "ch0.json"
    cal.parent.mkdir()
    _measured(tdir, str(cal))
    a = analyze_to(root / "out", [rdir], tdir, Options())
    return SimpleNamespace(tdir=tdir, rdir=rdir, cal=cal, a=a, out=root / "out")


def test_calibrated_board_figures_carry_the_closed_form_term(calibrated):
    a, cal = calibrated.a, calibrated.cal
    for _, row in a.results.iterrows():
        e = row["energy_per_request_j_median"]
        if not (np.isfinite(e) and e > 0):  # no energy: n/a, never inf or 0
            assert math.isnan(row["instrument_u_pct"]), row["figure"]
            assert row["instrument_u_basis"].startswith("n/a"), row["figure"]
            continue
        assert row["instrument_u_pct"] == pytest.approx(_expected(1.0, e), rel=1e-9)
        assert "calibration reference 1 %" in row["instrument_u_basis"]
    h = _headline(a)
    assert h["instrument_u_pct"] > 1.0  # never silently 0
    assert h["board_qualification"].startswith("not qualified: no qualification.json")
    assert str(cal.parent / "qualification.json") in h["board_qualification"]


def test_uncalibrated_board_uses_the_ct_class(synth_run):
    tdir, rdir, _, _ = synth_run()
    _measured(tdir, "design values (uncalibrated)", ct={"accuracy_class_pct": 0.5})
    h = _headline(analyze([rdir], tdir))
    assert h["instrument_u_pct"] == pytest.approx(
        _expected(0.5, h["energy_per_request_j_median"]), rel=1e-9)
    assert "CT class 0.5 %" in h["instrument_u_basis"]


def test_qualification_beside_the_calibration_is_cited(synth_run, tmp_path):
    tdir, rdir, _, _ = synth_run()
    cal = tmp_path / "cal" / "ch0.json"
    cal.parent.mkdir()
    (cal.parent / "qualification.json").write_text(json.dumps(_qual_record(True, 1.0)))
    _measured(tdir, str(cal))
    h = _headline(analyze([rdir], tdir))
    assert h["board_qualification"].startswith("qualified: PASSED against class 1 %")


def test_failed_qualification_named_in_the_meta_says_failed(synth_run, tmp_path):
    tdir, rdir, _, _ = synth_run()
    q = tmp_path / "q.json"
    q.write_text(json.dumps(_qual_record(False, 0.5)))
    _measured(tdir, "design values (uncalibrated)", qualification=str(q))
    h = _headline(analyze([rdir], tdir))
    assert h["board_qualification"].startswith("qualified: FAILED against class 0.5 %")


def test_bound_exceeded_gives_a_reason(calibrated):
    tdir, rdir = calibrated.tdir, calibrated.rdir
    h = _headline(analyze([rdir], tdir, Options(max_instrument_u_pct=0.5)))
    assert "instrument uncertainty" in h["reason"] and "0.5 %" in h["reason"]
    h = _headline(analyze([rdir], tdir, Options(max_instrument_u_pct=5.0)))
    assert "instrument uncertainty" not in str(h["reason"])


def test_modelled_power_says_na_not_zero(synth_run):
    tdir, rdir, _, _ = synth_run()  # the synthetic trace is emulated (modelled power)
    h = _headline(analyze([rdir], tdir))
    assert math.isnan(h["instrument_u_pct"])
    assert h["instrument_u_basis"] == "n/a (modelled)"


def test_results_csv_has_the_columns(calibrated, tmp_path, monkeypatch, capsys):
    tdir, rdir = calibrated.tdir, calibrated.rdir
    out = tmp_path / "out"
    monkeypatch.setattr(sys, "argv", ["epi", "analyze", str(rdir), "--trace", str(tdir),
                                      "--out", str(out), "--max-instrument-u-pct", "3"])
    code = 0
    try:
        epi_cli.main()
    except SystemExit as exc:
        code = int(exc.code or 0)
    assert code == 0, capsys.readouterr().err
    res = pd.read_csv(out / "results.csv")
    assert {"instrument_u_pct", "instrument_u_basis", "board_qualification"} <= set(res)
    row = res[(res["scope"] == "all") & (res["phase"] == "request")
              & (res["unit"] == "generated") & (res["basis"] == "gross")].iloc[0]
    assert row["instrument_u_pct"] == pytest.approx(
        _expected(1.0, row["energy_per_request_j_median"]), rel=1e-6)
    doc = json.loads((out / "results.json").read_text())
    assert doc["instrument"]["max_instrument_u_pct"] == 3.0
    assert doc["instrument"]["qualification"]["qualified"] is False


def test_summary_prints_the_instrument_column_and_the_board(calibrated):
    from host.analysis.summary import summary_text

    a = calibrated.a
    text = summary_text(a)
    assert "instrument ± %" in text and "bound 2 %" in text
    assert "board: not qualified" in text
    u = _headline(a)["instrument_u_pct"]
    assert f"{u:.3g}" in text


@pytest.mark.parametrize("qualified", [False, True])
def test_report_states_the_term_and_the_board_from_data(synth_run, calibrated, tmp_path,
                                                        qualified):
    from host.report import answers, method
    from host.report import data as report_data

    if qualified:  # its own board: a qualification.json beside its calibration
        tdir, rdir, _, _ = synth_run()
        cal = tmp_path / "cal" / "ch0.json"
        cal.parent.mkdir()
        (cal.parent / "qualification.json").write_text(json.dumps(_qual_record(True, 1.0)))
        _measured(tdir, str(cal))
        out = tmp_path / "out"
        a = analyze_to(out, [rdir], tdir, Options())
    else:  # the shared calibrated board, none beside its calibration
        a, out = calibrated.a, calibrated.out
    rd = report_data.load(out)
    limits = " ".join(answers.limits(rd))
    u = _headline(a)["instrument_u_pct"]
    assert f"± {u:.3g} %" in limits  # the figure's own term, not a fixed sentence
    assert ("NOT qualified" in limits) is (not qualified)
    entries = dict(method.measurement_block(rd))
    inst = entries["instrument uncertainty"]
    assert f"± {u:.3g} %" in inst and "bound 2 %" in inst
    assert ("PASSED against class 1 %" in inst) is qualified


def test_hostile_meta_and_record_never_crash_and_never_claim_qualified(synth_run, tmp_path):
    tdir, rdir, _, _ = synth_run()
    bad = tmp_path / "q.json"
    bad.write_text("{not json")
    _measured(tdir, str(tmp_path / "ch0.json"), qualification=str(bad))
    h = _headline(analyze([rdir], tdir))
    assert h["board_qualification"].startswith("not qualified:")
    assert "not readable JSON" in h["board_qualification"]
    assert np.isfinite(h["instrument_u_pct"])
    (bad).write_text(json.dumps({"format": "something-else"}))
    h = _headline(analyze([rdir], tdir))
    assert "is not an epi-meter-qualification record" in h["board_qualification"]
