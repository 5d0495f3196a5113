"""`epi meter run --source`: beside the emulated board in one trace, and its one-line errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from host.analysis.traces import read_trace
from meter.sources.common import SYSFS_ROOT_ENV
from tests.cli_run import run_epi as _epi
from tests.meter.sources_fakes import AdvancingRapl, rapl_tree


@pytest.mark.long
def test_emulated_board_and_rapl_in_one_trace(tmp_path: Path, monkeypatch, capsys) -> None:
    rapl = AdvancingRapl(tmp_path / "sysfs", 20.0, 3.0)
    monkeypatch.setenv(SYSFS_ROOT_ENV, str(rapl.root))
    try:
        code, _, err = _epi(monkeypatch, capsys, "meter", "run", "--emulate", "--source",
                            "rapl", "--listen", "off", "--duration", "1.5", "--out",
                            str(tmp_path / "trace"))
    finally:
        rapl.stop()
    assert code == 0, err
    assert "software sources on their own threads: rapl:package-0" in err
    meta = json.loads((tmp_path / "trace" / "seg-000001.meta.json").read_text())
    chans = {c["channel"]: c for c in meta["channels"]}
    assert sorted(chans) == [0, 1, 2, 3, 4, 5]
    assert chans[4]["name"] == "rapl:package-0" and chans[4]["scope"] == "package"
    assert chans[4]["label"] == "component power, not wall power"
    assert "scope" not in chans[0]  # board channels unchanged
    assert meta["sources"]["channels"]["4"]["rows"] > 5
    t = read_trace(tmp_path / "trace")
    assert t.channels[4].scope == "package" and t.channels[0].scope == "wall"
    rows = t.samples[t.samples["channel"] == 4]
    assert len(rows) > 5 and rows["power_w"].median() == pytest.approx(20.0, rel=0.1)


def test_named_source_absent_is_one_line_exit_2(tmp_path: Path, monkeypatch, capsys) -> None:
    monkeypatch.setenv(SYSFS_ROOT_ENV, str(tmp_path))
    code, _, err = _epi(monkeypatch, capsys, "meter", "run", "--source", "rapl,hwmon",
                        "--out", str(tmp_path / "t"), "--duration", "1")
    assert code == 2
    assert err.count("\n") == 1 and "--source rapl:" in err and "no RAPL zones" in err
    assert not (tmp_path / "t").exists() or not list((tmp_path / "t").glob("seg-*"))


def test_unknown_source_name(tmp_path: Path, monkeypatch, capsys) -> None:
    code, _, err = _epi(monkeypatch, capsys, "meter", "run", "--source", "rapl,ipmi",
                        "--out", str(tmp_path / "t"))
    assert code == 2 and "unknown source 'ipmi'" in err


def test_sources_alone_write_a_trace_without_board(tmp_path: Path, monkeypatch, capsys) -> None:
    rapl_tree(tmp_path)
    monkeypatch.setenv(SYSFS_ROOT_ENV, str(tmp_path))
    code, _, err = _epi(monkeypatch, capsys, "meter", "run", "--source", "rapl", "--out",
                        str(tmp_path / "t"), "--duration", "0.5")
    assert code == 0, err
    meta = json.loads((tmp_path / "t" / "seg-000001.meta.json").read_text())
    assert meta["board"] is None and meta["stats"]["clean_stop"] is True
    assert [c["name"] for c in meta["channels"]] == ["rapl:package-0", "rapl:dram-0"]
