"""Chip layer: the register table, value codecs and wire frames (reference §1, §2)."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from meter.chip import frames
from meter.chip import registers as regs


def test_register_table_reset_values_and_access_match_the_reference() -> None:
    expect = {
        "SoftReset": (0x00, regs.W, 0x0000),
        "SysStatus": (0x01, regs.RC, 0x0000),
        "FuncEn": (0x02, regs.RW, 0x000C),
        "SagTh": (0x03, regs.RW, 0x1D6A),
        "LastData": (0x06, regs.R, 0x0000),
        "CalStart": (0x20, regs.RW, 0x6886),
        "PLconstH": (0x21, regs.RW, 0x0015),
        "PLconstL": (0x22, regs.RW, 0xD174),
        "PStartTh": (0x27, regs.RW, 0x08BD),
        "QStartTh": (0x29, regs.RW, 0x0AEC),
        "MMode": (0x2B, regs.RW, 0x9422),
        "AdjStart": (0x30, regs.RW, 0x6886),
        "Ugain": (0x31, regs.RW, 0x6720),
        "IgainL": (0x32, regs.RW, 0x7A13),
        "IgainN": (0x33, regs.RW, 0x7530),
        "ATenergy": (0x42, regs.RC, 0x0000),
        "EnStatus": (0x46, regs.R, 0xC800),
        "Pmean": (0x4A, regs.R, 0x0000),
    }
    for name, (address, access, reset) in expect.items():
        r = regs.reg(name)
        assert (r.address, r.access, r.reset) == (address, access, reset), name
        assert regs.reg(address) is r
    assert [r.name for r in regs.REGISTERS if r.read_clear] == [
        "SysStatus", "APenergy", "ANenergy", "ATenergy", "RPenergy", "RNenergy", "RTenergy"
    ]
    assert 0x69 not in regs.BY_ADDRESS and 0x6C not in regs.BY_ADDRESS  # undefined: read 0
    assert len(regs.METERING_ADDRESSES) == 11 and len(regs.MEASUREMENT_CAL_ADDRESSES) == 10


def test_codecs_follow_each_registers_encoding() -> None:
    # PowerF / Pangle: sign-magnitude, not two's complement
    assert regs.reg("PowerF").decode(0x03E8) == pytest.approx(1.0)
    assert regs.reg("PowerF").decode(0x83E8) == pytest.approx(-1.0)
    assert regs.reg("Pangle").decode(0x8708) == pytest.approx(-180.0)  # 0.1 degree units
    # Pmean / Qmean: two's complement — small negative powers must stay small and negative
    assert regs.reg("Pmean").decode(0xFFFE) == -2.0
    assert regs.reg("Qmean").decode(0x8000) == -32768.0
    # unsigned with scale
    assert regs.reg("Urms").decode(0x59D8) == pytest.approx(230.0)
    assert regs.reg("Freq").decode(0x1388) == pytest.approx(50.0)
    assert regs.reg("Irms").decode(0x0032) == pytest.approx(0.05)
    # Lphi: sign bit + 10-bit magnitude
    assert regs.decode(regs.PHI, 0x8024) == -36
    with pytest.raises(ValueError):
        regs.encode(regs.PHI, 1024)


def test_lsb_extension_adds_eight_bits_and_keeps_the_sign() -> None:
    pmean = regs.reg("Pmean")
    # -2.5 W: (0xFFFD << 16 | 0x8000) as int32 / 65536
    assert regs.extended_value(pmean, 0xFFFD, 0x8000) == pytest.approx(-2.5)
    urms = regs.reg("Urms")
    assert regs.extended_value(urms, 0x59D8, 0x8000) == pytest.approx(230.005)
    raw, lsb = regs.split_extended(-2.5, pmean)
    assert (raw, lsb) == (0xFFFD, 0x8000)
    assert lsb & 0x00FF == 0  # bits 7:0 of LSB are always 0 on the chip


@given(st.integers(-0x8000, 0x7FFF))
def test_signed16_round_trips(value: int) -> None:
    assert regs.to_signed16(regs.from_signed16(value)) == value


@given(st.integers(-0x7FFF, 0x7FFF))
def test_sign_magnitude_round_trips(value: int) -> None:
    assert regs.to_sign_magnitude(regs.from_sign_magnitude(value)) == value


@given(st.floats(-32000.0, 32000.0, allow_nan=False))
def test_extended_split_is_within_one_extended_lsb(value: float) -> None:
    pmean = regs.reg("Pmean")
    raw, lsb = regs.split_extended(value, pmean)
    assert abs(regs.extended_value(pmean, raw, lsb) - value) <= 128 / 65536 + 1e-12


def test_energy_counter_wraps_at_0xffff() -> None:
    assert regs.energy_delta(0xFFF0, 0x0010) == 0x20
    assert regs.energy_delta(0x0010, 0x0010) == 0
    assert pytest.approx(6553.6) == regs.ENERGY_WRAP * regs.PULSES_PER_COUNT


def test_spi_frames_are_rw_bit_address_then_msb_first_data() -> None:
    assert frames.spi_read_frame(0x49) == bytes([0xC9, 0x00, 0x00])
    assert frames.spi_write_frame(0x20, 0x5678) == bytes([0x20, 0x56, 0x78])
    assert frames.spi_read_value(bytes([0xFF, 0x12, 0x34])) == 0x1234
    assert frames.spi_parse_mosi(bytes([0xC9, 0, 0])) == (True, 0x49, 0)


def test_uart_frames_match_the_reference_examples() -> None:
    assert frames.uart_write_request(0x00, 0x789A) == bytes.fromhex("FE00789A12")
    assert frames.uart_write_request(0x20, 0x5678) == bytes.fromhex("FE205678EE")
    assert frames.uart_read_request(0x49) == bytes.fromhex("FEC9C9")
    assert frames.uart_read_reply(0x59D8) == bytes([0x59, 0xD8, (0x59 + 0xD8) & 0xFF])
    assert frames.uart_parse_read_reply(bytes([0x59, 0xD8, 0x31])) == 0x59D8
    with pytest.raises(ValueError, match="checksum"):
        frames.uart_parse_read_reply(bytes([0x59, 0xD8, 0x32]))


def test_register_table_markdown_lists_every_register_and_the_docs_carry_it() -> None:
    text = regs.register_table_markdown()
    assert text.count("\n") == len(regs.REGISTERS) + 1
    assert "| 4AH | Pmean | R | 0000H | s16 | 1 W |" in text
    docs = (Path(__file__).resolve().parents[2] / "docs/meter.md").read_text()
    assert text in docs  # the docs' table is generated, not re-typed
