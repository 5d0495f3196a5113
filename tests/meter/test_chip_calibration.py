"""Calibration math against the application note's worked examples (reference §4.2)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from meter.board.channels import load_board
from meter.chip import calibration as calib
from meter.chip import registers as regs
from meter.chip.calibration import Calibration, CalibrationError

REPO = Path(__file__).resolve().parents[2]


def test_pl_constant_worked_example_is_the_power_on_default() -> None:
    # MC 3200 imp/kWh, Un 220 V, Ib 5 A, G_L 24, V_L 1 mV, V_U 250 mV -> 1 429 876 = 0015D174H
    pl = calib.pl_constant(3200, 220, 5, 24, 1, 250)
    assert pl == 1_429_876 == 0x0015D174
    assert calib.pl_words(pl) == (0x0015, 0xD174)
    assert calib.meter_constant_from_pl(pl, 220, 5, 24, 1, 250) == pytest.approx(3200, rel=1e-6)


def test_esphome_pl_example() -> None:
    # SCT-013-000 + 12 ohm burden (6 mV/A at Ib 1 A), 193 mV at 230 V: 1 319 838
    assert calib.pl_constant(3200, 230, 1, 1, 6, 193) == 1_319_838


def test_lgain_worked_example() -> None:
    assert calib.lgain_from_error(-0.1378) == 0x1475
    # a negative correction is written as two's complement
    word = calib.lgain_from_error(0.05)
    assert word & 0x8000 and calib.lgain_ratio(word) == pytest.approx(-0.05 / 1.05, abs=1e-4)
    # an existing Lgain compounds: (1 + new) = (1 + old) / (1 + error)
    again = calib.lgain_from_error(0.01, word)
    assert 1 + calib.lgain_ratio(again) == pytest.approx((1 - 0.05 / 1.05) / 1.01, abs=1e-4)
    with pytest.raises(CalibrationError, match=r"-50 %\.\.\+50 %"):
        calib.lgain_from_error(1.5)


def test_lphi_worked_example() -> None:
    assert calib.lphi_from_error(0.0095) == 0x0024
    assert calib.lphi_from_error(-0.0095) == 0x8024
    with pytest.raises(CalibrationError, match="10-bit"):
        calib.lphi_from_error(0.3)


def test_start_threshold_worked_example_is_the_default() -> None:
    assert calib.start_threshold(24, 1, 250, 0.004) == 0x08BD
    # and back to the power it stands for: K · Un · Ib
    assert calib.threshold_power_w(0x08BD, 220, 5, 24, 1, 250) == pytest.approx(0.004 * 1100,
                                                                                  rel=1e-3)


def test_ugain_and_igain_worked_examples() -> None:
    assert calib.ugain_from_reading(220.024, 246.01) == 0x5C3B
    assert calib.igain_from_reading(5.008, 6.744) == 0x5AA7  # AN rounds; truncation gives A6
    assert calib.igain_from_reading(5.008, 6.744, 31251) == 23207


def test_ugain_bit_15_is_refused_with_a_reason() -> None:
    with pytest.raises(CalibrationError, match="bit 15 must be 0"):
        calib.ugain_from_reading(230.0, 180.0)  # 26400 · 230/180 = 33733 > 0x7FFF
    with pytest.raises(CalibrationError, match="bit 15"):
        Calibration(1e6, {"Ugain": 0xD464})  # the widely copied public-driver default


def test_offsets_worked_examples() -> None:
    assert calib.power_offset(regs.to_signed16(0xFFCB)) == 0x0035
    word = calib.current_offset(0.010, 31251)  # 10 mA at no load
    assert regs.to_signed16(word) == -1221
    assert calib.current_offset_correction_a(word, 31251) == pytest.approx(-0.010, abs=1e-5)
    assert calib.small_power_w_per_lsb(26400, 31251) == pytest.approx(1 / 508.4, rel=1e-3)


@pytest.mark.parametrize("mc", [1000, 3200, 1_000_000])
def test_energy_counts_to_joules_follow_the_meter_constant(mc: float) -> None:
    # one LSB = 0.1 pulse = 0.1/MC kWh — never the 1000 imp/kWh shortcut
    assert calib.counts_to_joules(10, mc) == pytest.approx(3.6e6 / mc)
    assert calib.joules_per_count(mc) * mc == pytest.approx(360_000.0)


def test_calibration_record_round_trips_and_validates() -> None:
    cal = Calibration.default(1_000_000)
    assert cal.pl_constant == calib.pl_constant(1e6, 230, 1, 1, 50, 250)
    data = json.loads(json.dumps(cal.to_dict()))
    back = Calibration.from_dict(data)
    assert back.registers == cal.registers and back.cs1() == cal.cs1()
    data["registers"]["Lgain"] = "0x0001"  # edited without its checksum
    with pytest.raises(CalibrationError, match=r"checksums\.CS1"):
        Calibration.from_dict(data)
    for bad, match in [
        ({**cal.to_dict(), "format": "x"}, "format"),
        ({**cal.to_dict(), "format_version": 9}, "format_version"),
        ({**cal.to_dict(), "meter_constant_imp_per_kwh": 0}, "meter_constant"),
        ({**cal.to_dict(), "registers": {"Bogus": 1}}, "registers.Bogus"),
        ({**cal.to_dict(), "registers": {"Lgain": "zz"}}, "registers.Lgain"),
        ({**cal.to_dict(), "frontend": {"un_v": -1}}, "frontend.un_v"),
    ]:
        bad.pop("checksums", None)
        with pytest.raises(CalibrationError, match=match):
            Calibration.from_dict(bad)


def test_example_calibration_file_fits_the_board_file() -> None:
    data = json.loads((REPO / "hardware/calibration.example.json").read_text())
    cal = Calibration.from_dict(data)
    board = load_board(REPO / "hardware/epi-meter.toml")
    ch = board.channels[0]
    fe = ch.frontend
    assert cal.meter_constant_imp_per_kwh == ch.meter_constant_imp_per_kwh
    assert cal.pl_constant == calib.pl_constant(
        ch.meter_constant_imp_per_kwh, fe["un_v"], fe["ib_a"], 1, fe["v_l_mv"], fe["v_u_mv"]
    )
