"""Hostile input to the meter side's readers and options (hypothesis): a board TOML, a
calibration record, the float options. Every outcome is a value in the documented range or
a one-line UserError / click usage error (exit 2) — never a traceback, never a silent drop."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import click
import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from epi.commands.params import FiniteFloat as Finite
from epi.core.errors import UserError
from meter.board.channels import RANGES, load_board, load_calibration_file
from meter.chip.calibration import Calibration, CalibrationError

SETTINGS = settings(max_examples=40, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture])


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        return repr(v)
    if isinstance(v, int):
        return str(v)
    if isinstance(v, dict):
        return "{ " + ", ".join(f"{k} = {_toml_value(x)}" for k, x in v.items()) + " }"
    return json.dumps(str(v))


def _toml(doc: dict[str, Any]) -> str:
    lines = [f"{k} = {_toml_value(v)}" for k, v in doc.items()
             if not isinstance(v, (dict, list))]
    for k, v in doc.items():
        if isinstance(v, dict):
            lines.append(f"[{k}]")
            lines += [f"{kk} = {_toml_value(vv)}" for kk, vv in v.items()]
    for ch in doc.get("channel", []):
        lines.append("[[channel]]")
        lines += [f"{kk} = {_toml_value(vv)}" for kk, vv in ch.items()]
    return "\n".join(lines) + "\n"


def _base() -> dict[str, Any]:
    return {
        "format": "epi-board", "format_version": 1, "name": "b",
        "spi": {"bus": 0, "speed_hz": 160000, "mode": 3},
        "sampling": {"period_s": 0.05},
        "frontend": {"un_v": 230.0, "ib_a": 1.0, "v_u_mv": 250.0},
        "emulator": {"refresh_period_s": 0.2},
        "channel": [{"name": "a", "chip_select": "CE0",
                     "ct": {"ratio": 2000, "burden_ohm": 100.0},
                     "meter_constant_imp_per_kwh": 1e8}],
    }


NUMERIC = [("sampling", "period_s"), ("emulator", "refresh_period_s"), ("frontend", "un_v"),
           ("frontend", "ib_a"), ("frontend", "v_u_mv"), ("ct", "ratio"), ("ct", "burden_ohm"),
           ("channel", "meter_constant_imp_per_kwh")]
hostile_numbers = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True), st.integers(-10**20, 10**20),
    st.text(alphabet=st.characters(min_codepoint=32, max_codepoint=126), max_size=5),
    st.booleans(),
)


def _write(tmp_path: Path, doc: dict[str, Any]) -> Path:
    p = tmp_path / "board.toml"
    p.write_text(_toml(doc))
    return p


@SETTINGS
@given(where=st.sampled_from(NUMERIC), value=hostile_numbers)
def test_board_numbers_are_in_range_or_refused_by_name(
    tmp_path: Path, where: tuple[str, str], value: Any
) -> None:
    doc = _base()
    table, key = where
    if table == "channel":
        doc["channel"][0][key] = value
    elif table == "ct":
        doc["channel"][0]["ct"][key] = value
    else:
        doc[table][key] = value
    try:
        board = load_board(_write(tmp_path, doc))
    except UserError as exc:
        assert key in str(exc) and "\n" not in str(exc)
        return
    lo, hi = RANGES[key]
    got = {
        "period_s": board.sample_period_s, "refresh_period_s": board.refresh_period_s,
        "meter_constant_imp_per_kwh": board.channels[0].meter_constant_imp_per_kwh,
    }.get(key, float(value))
    assert math.isfinite(got) and lo < got <= hi


@SETTINGS
@given(table=st.sampled_from(["", "spi", "sampling", "frontend", "emulator", "ct", "channel"]),
       key=st.from_regex(r"[a-z][a-z_]{0,10}", fullmatch=True))
def test_unknown_keys_anywhere_are_refused_by_name(
    tmp_path: Path, table: str, key: str
) -> None:
    doc = _base()
    target = {"": doc, "ct": doc["channel"][0]["ct"], "channel": doc["channel"][0]}.get(
        table, doc.get(table))
    if key in target:
        return
    target[key] = 1
    with pytest.raises(UserError) as info:
        load_board(_write(tmp_path, doc))
    assert key in str(info.value)


def test_a_typo_in_spi_is_refused(tmp_path: Path) -> None:
    doc = _base()
    doc["spi"]["speed"] = 1
    with pytest.raises(UserError, match=r"spi\.speed: unknown key"):
        load_board(_write(tmp_path, doc))


def test_an_extreme_meter_constant_is_a_user_error(tmp_path: Path) -> None:
    doc = _base()
    doc["channel"][0]["meter_constant_imp_per_kwh"] = 1e11
    with pytest.raises(UserError, match="meter_constant_imp_per_kwh"):
        load_board(_write(tmp_path, doc))


json_leaf = st.one_of(st.none(), st.booleans(), st.integers(-2**40, 2**40),
                      st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=8))
json_value = st.recursive(json_leaf, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=6), inner, max_size=3)),
    max_leaves=8)


@SETTINGS
@given(checksums=json_value, mc=json_leaf)
def test_calibration_records_are_valid_or_refused(checksums: Any, mc: Any) -> None:
    good = Calibration.default(1e8).to_dict()
    for record in ({**good, "checksums": checksums}, {**good, "meter_constant_imp_per_kwh": mc}):
        try:
            cal = Calibration.from_dict(record)
        except CalibrationError:
            continue
        assert math.isfinite(cal.meter_constant_imp_per_kwh)
        assert cal.meter_constant_imp_per_kwh > 0
        if isinstance(record.get("checksums"), dict):
            assert set(record["checksums"]) <= {"CS1", "CS2"}


def test_garbage_checksums_are_refused() -> None:
    good = Calibration.default(1e8).to_dict()
    for garbage in ("zz", [1, 2], {"CS3": 1}, {"CS1": "0xZZ"}, {"CS1": 70000}):
        with pytest.raises(CalibrationError, match="checksums"):
            Calibration.from_dict({**good, "checksums": garbage})


@SETTINGS
@given(text=st.one_of(st.text(max_size=12), st.sampled_from(
    ["nan", "inf", "-inf", "NaN", "1e400", "-0", "0", "1e-320"])))
def test_finite_option_type_gives_a_range_value_or_a_usage_error(text: str) -> None:
    t = Finite(0, 100, lo_open=True)
    try:
        v = t.convert(text, None, None)
    except click.BadParameter:
        return
    assert math.isfinite(v) and 0 < v <= 100


@pytest.mark.parametrize("args", [
    ["run", "--emulate", "--out", "{out}", "--duration", "nan"],
    ["run", "--emulate", "--out", "{out}", "--rate", "inf"],
    ["read", "--emulate", "--settle", "nan"],
    ["calibrate", "0", "--emulate", "--volts", "nan", "--amps", "1"],
    ["calibrate", "0", "--emulate", "--volts", "230", "--amps", "1", "--seconds", "inf"],
])
def test_nan_and_inf_options_are_usage_errors(tmp_path: Path, args: list[str]) -> None:
    from epi.commands.meter_group import meter

    args = [a.replace("{out}", str(tmp_path / "t")) for a in args]
    res = CliRunner().invoke(meter, args)
    assert res.exit_code == 2, res.output
    assert "finite" in res.output and "Traceback" not in res.output


# ------------------------------------------------------------------ raw bytes
RAW_BYTES = st.one_of(
    st.binary(max_size=96),
    st.sampled_from([b"[" * 100_000, b"a = " + b"[" * 100_000, b"a = " + b"{b=" * 5_000,
                     b"\xff\xfe", b"format = \"epi-board\"\n\xff = 1\n", b'{"x": NaN}',
                     b"{" * 100_000, b"[]", b"null", b""]),
)


def _one_line(exc: UserError, path: Path) -> None:
    assert str(path) in str(exc) and "\n" not in str(exc)


@SETTINGS
@given(raw=RAW_BYTES)
def test_board_file_of_any_bytes_loads_or_is_one_line_error(tmp_path: Path, raw: bytes) -> None:
    p = tmp_path / "board.toml"
    p.write_bytes(raw)
    try:
        load_board(p)
    except UserError as exc:
        _one_line(exc, p)


@SETTINGS
@given(raw=RAW_BYTES)
def test_calibration_file_of_any_bytes_loads_or_is_one_line_error(
    tmp_path: Path, raw: bytes
) -> None:
    p = tmp_path / "cal.json"
    p.write_bytes(raw)
    try:
        cal = load_calibration_file(p)
    except UserError as exc:
        _one_line(exc, p)
        return
    assert math.isfinite(cal.meter_constant_imp_per_kwh)  # pragma: no cover (random bytes)


def test_deeply_nested_board_and_calibration_are_one_line_errors(tmp_path: Path) -> None:
    board = tmp_path / "deep.toml"
    board.write_text("format = " + "[" * 100_000)
    with pytest.raises(UserError, match="not valid TOML"):
        load_board(board)
    cal = tmp_path / "cal.json"
    cal.write_text("[" * 100_000)
    with pytest.raises(UserError, match="nested deeper"):
        load_calibration_file(cal)


def _epi(argv: list[str], monkeypatch: pytest.MonkeyPatch,
         capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    """Run the real entry point (`epi.cli.main`); its exit code and stderr."""
    import sys

    from epi.cli import main

    monkeypatch.setattr(sys, "argv", ["epi", *argv])
    try:
        main()
    except SystemExit as exc:
        return int(exc.code or 0), capsys.readouterr().err
    return 0, capsys.readouterr().err  # success returns without sys.exit


def test_deep_calibration_via_meter_read_exits_2(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    doc = _base()
    doc["channel"][0]["calibration"] = "cal.json"
    (tmp_path / "cal.json").write_text("[" * 100_000)
    code, err = _epi(["meter", "read", "--emulate", "--board", str(_write(tmp_path, doc))],
                     monkeypatch, capsys)
    assert code == 2, err
    assert "cal.json" in err and "nested deeper" in err and err.count("\n") == 1


@pytest.mark.parametrize("key,value", [("bus", -5), ("bus", 32), ("gpio_cs_device", -1),
                                       ("gpio_cs_device", 10)])
def test_spi_numbers_out_of_range_are_refused(tmp_path: Path, key: str, value: int) -> None:
    doc = _base()
    doc["spi"][key] = value
    with pytest.raises(UserError, match=rf"spi\.{key}: {value}: expected"):
        load_board(_write(tmp_path, doc))


def test_spi_bus_in_range_is_kept(tmp_path: Path) -> None:
    doc = _base()
    doc["spi"]["bus"] = 6
    assert load_board(_write(tmp_path, doc)).spi_bus == 6


@pytest.mark.parametrize("kind", ["directory", "under a file"])
def test_calibrate_refuses_an_unusable_output_before_calibrating(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
    kind: str
) -> None:
    from meter.driver import calibration_procedures as procedures

    def never(*a: Any, **k: Any) -> None:
        raise AssertionError("calibrated although the output cannot be written")

    monkeypatch.setattr(procedures, "calibrate_gains", never)
    (tmp_path / "file").write_text("")
    out = tmp_path if kind == "directory" else tmp_path / "file" / "cal.json"
    code, err = _epi(["meter", "calibrate", "0", "--emulate", "--volts", "230", "--amps", "1",
                      "--out", str(out)], monkeypatch, capsys)
    assert code == 2 and err.count("\n") == 1, err
    assert err.startswith("epi: error: --out") and str(out) in err


def test_calibrate_creates_missing_output_directories(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "new" / "dir" / "cal.json"
    code, err = _epi(["meter", "calibrate", "0", "--emulate", "--volts", "230", "--amps", "1",
                      "--readings", "1", "--out", str(out)], monkeypatch, capsys)
    assert code == 0, err
    assert load_calibration_file(out).meter_constant_imp_per_kwh > 0


@pytest.mark.parametrize("as_json", [True, False])
def test_meter_read_settle_0_shows_no_values_only_an_error(tmp_path: Path,
                                                            as_json: bool) -> None:
    """Regression: a reading taken before the chip's first measurement was shown
    as 0 V / 0 W / 0 Hz with error null. A 30 s emulated refresh makes "too early" certain."""
    from epi.commands.meter_group import meter

    doc = _base()
    doc["emulator"]["refresh_period_s"] = 30.0
    argv = ["read", "--emulate", "--board", str(_write(tmp_path, doc)), "--settle", "0"]
    res = CliRunner().invoke(meter, argv + (["--json"] if as_json else []))
    assert res.exit_code == 0, res.output
    if as_json:
        (row,) = [json.loads(line) for line in res.output.splitlines() if line.startswith("{")]
        assert row["error"].startswith("not ready") and row["ready"] is False
        for key in ("voltage_v", "current_a", "power_w", "power_factor", "frequency_hz"):
            assert row[key] is None, key
    else:
        (line,) = [x for x in res.output.splitlines() if x.startswith("0 ")]
        assert "error: not ready" in line and " V" not in line
        assert not {"0.00", "0.000", "0.0000"} & set(line.split())
