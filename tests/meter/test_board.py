"""Board files, emulated boards and opening channels (real boards refuse when unreachable)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from epi.core.errors import UserError
from meter.board.channels import emulated_board, load_board, open_channels
from meter.chip.calibration import Calibration
from meter.clock import SimulatedClock
from meter.emulation.power_models import ConstantPower, ScriptedProfile
from meter.errors import ChipResetError

REPO = Path(__file__).resolve().parents[2]
BOARD = REPO / "hardware/epi-meter.toml"

MINIMAL = """
format = "epi-board"
format_version = 1
[[channel]]
name = "a"
chip_select = "CE0"
"""


def test_the_shipped_board_file_loads() -> None:
    b = load_board(BOARD)
    assert [c.name for c in b.channels] == ["node0", "node1", "node2", "node3"]
    assert [c.gpio_cs for c in b.channels] == [8, 7, 25, 24]
    assert (b.spi_bus, b.speed_hz, b.mode, b.gpio_cs_device) == (0, 160_000, 3, 0)
    assert b.channels[0].frontend["v_l_mv"] == pytest.approx(50.0)  # 1 A / 2000 · 100 Ω
    assert b.channels[0].meter_constant_imp_per_kwh == 100_000_000
    assert b.channel("node2").index == 2 and b.channel("3").name == "node3"
    with pytest.raises(UserError, match="channel 'x' not found"):
        b.channel("x")


def _write(tmp_path: Path, text: str, name: str = "board.toml") -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


@pytest.mark.parametrize(
    ("replace", "key", "problem"),
    [
        (('format = "epi-board"', 'format = "x"'), "format", "expected 'epi-board'"),
        (("[[channel]]", "[spi]\nspeed_hz = 500000\n[[channel]]"), "spi.speed_hz", "500000"),
        (("[[channel]]", "[spi]\nmode = 0\n[[channel]]"), "spi.mode", "mode 3 only"),
        (('chip_select = "CE0"', 'chip_select = "CS9"'), "channel[0].chip_select", "CS9"),
        (('chip_select = "CE0"', 'chip_select = "CE0"\nuart = {port = "/dev/x"}'),
         "channel[0].chip_select", "exactly one"),
        (('chip_select = "CE0"', 'uart = {port = "/dev/x", baudrate = 4800}'),
         "channel[0].uart.baudrate", "2400 or 9600"),
        (('name = "a"', 'name = "a"\ncolour = 1'), "channel[0].colour", "unknown key"),
        (('format = "epi-board"', 'format = "epi-board"\nbus = "i2c"'), "bus", "'i2c'"),
        (("[[channel]]", "[bridge]\nport = \"/dev/ttyAMA0\"\n[[channel]]"), "bridge",
         'needs bus = "bridge"'),
        (('name = "a"', 'name = "a"\nmeter_constant_imp_per_kwh = -3'),
         "channel[0].meter_constant_imp_per_kwh", "> 0"),
        (('chip_select = "CE0"', 'chip_select = "CE0"\n[[channel]]\nname = "b"\n'
                                 'chip_select = "CE0"'), "channel[1].chip_select", "two"),
        (('chip_select = "CE0"', 'chip_select = "CE0"\n[[channel]]\nname = "b"\n'
                                 'chip_select = "GPIO5"\n[spi]\ngpio_cs_device = 0'),
         "spi.gpio_cs_device", "CE0 carries a chip"),
        # meta.json repeats the ct table: a TOML date there could not be written as JSON
        (('chip_select = "CE0"', 'chip_select = "CE0"\nct = {model = 2024-01-01}'),
         "channel[0].ct.model", "a number or text"),
    ],
)
def test_board_errors_name_file_key_and_problem(
    tmp_path: Path, replace: tuple[str, str], key: str, problem: str
) -> None:
    p = _write(tmp_path, MINIMAL.replace(*replace, 1))
    with pytest.raises(UserError) as info:
        load_board(p)
    msg = str(info.value)
    assert msg.startswith(f"{p}: {key}: ") and problem in msg and "\n" not in msg


def test_unreadable_board_files(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="board file not found"):
        load_board(tmp_path / "nope.toml")
    with pytest.raises(UserError, match="not valid TOML"):
        load_board(_write(tmp_path, "format = ="))


def test_calibration_file_is_checked_at_load(tmp_path: Path) -> None:
    cal = Calibration.default(3200).to_dict()
    (tmp_path / "a.json").write_text(json.dumps(cal))
    text = MINIMAL + 'calibration = "a.json"\n'
    with pytest.raises(UserError, match="made for 3200 imp/kWh"):
        load_board(_write(tmp_path, text))
    cal["registers"]["Ugain"] = "0x9000"
    cal.pop("checksums")
    (tmp_path / "a.json").write_text(json.dumps(cal))
    with pytest.raises(UserError, match=r"a\.json: registers\.Ugain: .*bit 15"):
        load_board(_write(tmp_path, text + "meter_constant_imp_per_kwh = 3200\n"))


def test_gpio_cs_device_defaults_to_a_free_spidev(tmp_path: Path) -> None:
    text = MINIMAL + '[[channel]]\nname = "b"\nchip_select = "GPIO5"\n'
    assert load_board(_write(tmp_path, text)).gpio_cs_device == 1


def test_emulated_board_channels_read_and_describe_themselves() -> None:
    clock = SimulatedClock()
    t0 = clock.monotonic_ns()
    models = [ConstantPower(3.0), ScriptedProfile([(0, 4.0)], start_mono_ns=t0)]
    board = emulated_board(2, models, clock=clock)
    events: list = []
    chans = open_channels(board, "emulated", on_event=lambda *e: events.append(e))
    clock.advance(1_000_000_000)
    assert [round(c.driver.read_sample().power_w, 2) for c in chans] == [3.0, 4.0]
    d = chans[1].describe()
    for key in ("channel", "name", "node", "meter_constant_imp_per_kwh", "ct", "calibration"):
        assert key in d
    assert d["emulated"] is True and d["power_model"]["kind"] == "scripted"
    assert d["power_model"]["modelled"] is True
    # driver events arrive with the channel index
    chans[1].emulator.reset_now()  # type: ignore[attr-defined]
    with pytest.raises(ChipResetError):
        chans[1].driver.read_sample()
    assert [e[:2] for e in events] == [(1, "chip_reset"), (1, "reinit")]
    assert board.describe()["emulated"] is True
    for c in chans:
        c.close()


def test_the_real_board_file_can_run_emulated() -> None:
    clock = SimulatedClock()
    chans = open_channels(load_board(BOARD), "emulated", clock=clock,
                          power_model=ConstantPower(5.0))
    clock.advance(1_000_000_000)
    assert [c.name for c in chans] == ["node0", "node1", "node2", "node3"]
    assert chans[0].describe()["node"] == "pi-node-0"
    assert chans[0].driver.read_sample().power_w == pytest.approx(5.0, abs=0.005)


def test_a_real_board_without_calibration_files_is_refused(tmp_path: Path) -> None:
    board = load_board(BOARD)  # hardware/calibration/*.json are not shipped
    with pytest.raises(UserError, match=r"channel\[0\]\.calibration: .*epi meter calibrate"):
        open_channels(board, "real")


def test_a_real_board_whose_chips_do_not_answer_is_refused(tmp_path: Path) -> None:
    # no /dev/spidev0.0 (and no GPIO) on the test machine: the board must refuse, not fake
    board = load_board(_write(tmp_path, MINIMAL))
    with pytest.raises(UserError) as info:
        open_channels(board, "real", allow_uncalibrated=True)
    assert str(info.value).startswith(f"{board.path}: channel a")
