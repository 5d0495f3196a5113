"""Chip layer: the register table, value codecs and wire frames (reference §1, §2)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from meter.chip import calibration, frames
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


# ---- bit fields -------------------------------------------------------------------------------
def test_bit_fields_sit_inside_their_register_without_overlap() -> None:
    by_register: dict[str, int] = {}
    for f in regs.FIELDS:
        assert f.register in regs.BY_NAME, f
        assert 0 <= f.lo <= f.hi <= 15, f
        assert by_register.get(f.register, 0) & f.mask == 0, f"{f} overlaps"
        by_register[f.register] = by_register.get(f.register, 0) | f.mask
        assert regs.field(f.register, f.name) is f


def test_bit_fields_match_the_datasheet_positions() -> None:
    """Positions from the datasheet register pages (docs/atm90e26.md), not from the table."""
    assert regs.CAL_ERR_MASK == 0xC000 and regs.ADJ_ERR_MASK == 0x3000
    assert regs.field("MMode", "Lgain").mask == 0xE000
    assert regs.field("MMode", "LNSel").mask == 0x0400
    assert regs.field("EnStatus", "Lline").mask == 0x0800
    # reset values decode as the datasheet describes them
    mmode = regs.BY_NAME["MMode"].reset  # 9422H
    assert regs.field("MMode", "Lgain").get(mmode) == 0b100  # gain 1
    assert regs.field("MMode", "LNSel").get(mmode) == 1  # L line
    en = regs.BY_NAME["EnStatus"].reset  # C800H: no-load both, L line
    assert [regs.field("EnStatus", n).get(en) for n in ("Qnoload", "Pnoload", "Lline")] == [1] * 3
    assert regs.field("FuncEn", "RevPEn").get(regs.BY_NAME["FuncEn"].reset) == 1  # 000CH


def test_field_put_replaces_only_its_bits_and_refuses_what_does_not_fit() -> None:
    f = regs.field("MMode", "Lgain")
    word = f.put(0x9422, 0b011)  # gain 24
    assert word == 0x7422 and f.get(word) == 0b011
    assert calibration.l_pga_gain(word) == 24 and calibration.l_pga_gain(0x9422) == 1
    with pytest.raises(ValueError, match="3 bits"):
        f.put(0, 8)


def test_the_docs_carry_the_generated_field_table() -> None:
    docs = (Path(__file__).resolve().parents[2] / "docs/atm90e26.md").read_text()
    block = docs.split("<!-- fields:begin -->\n", 1)[1].split("\n<!-- fields:end -->", 1)[0]
    assert block == regs.field_table_markdown()


def test_no_register_mask_is_declared_twice() -> None:
    """Outside the register table, no module binds a *_MASK name to an int literal equal to a
    field's mask (import it from meter.chip.registers instead)."""
    root = Path(__file__).resolve().parents[2]
    masks = {f.mask for f in regs.FIELDS}
    offenders = []
    for top in ("meter", "host", "epi"):
        for path in (root / top).rglob("*.py"):
            if path == root / "meter/chip/registers.py":
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                if (isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant)
                        and node.value.value in masks and any(
                            isinstance(t, ast.Name) and "MASK" in t.id for t in node.targets)):
                    offenders.append(f"{path.relative_to(root)}:{node.lineno}")
    assert offenders == []
