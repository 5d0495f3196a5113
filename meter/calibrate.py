"""Calibrate one channel end to end: open it (a real chip from the board file, or an emulated
chip carrying exactly the reference load), run the gain or offset procedure, close it.

`epi meter calibrate` validates its options, calls `calibrate_channel` and prints the report;
this module is the work in between, so a script or a test calibrates the same way the command
does. Formulas: docs/atm90e26.md §6; procedures: meter/driver/calibration_procedures.py.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from epi.core.errors import UserError
from meter.board.channels import emulated_board, load_board, open_channels
from meter.chip.calibration import CalibrationError
from meter.clock import SimulatedClock, SystemClock
from meter.driver import calibration_procedures as procedures
from meter.emulation.power_models import ConstantPower
from meter.errors import BusError


@dataclass(frozen=True)
class CalibrationRequest:
    """One calibration: the channel (index or name), where the chip is, the reference.

    Without `board_path` (or with `emulate`) the chip is emulated; the `emulate_*` errors are
    then put into its front end so there is something to correct. `zero` calibrates the
    offsets at no load instead of the gains (then volts/amps/watts are None)."""

    channel: str
    board_path: Path | None = None
    emulate: bool = False
    volts: float | None = None
    amps: float | None = None
    watts: float | None = None
    seconds: float = 60.0
    readings: int = 5
    zero: bool = False
    emulate_gain_error: float = 0.0
    emulate_offset_ma: float = 0.0
    emulate_offset_w: float = 0.0


@dataclass(frozen=True)
class CalibrationOutcome:
    """The channel calibrated, whether its chip was emulated, the procedure's report, and the
    channel's own calibration file (None when the board gives it none)."""

    index: int
    name: str
    emulated: bool
    report: procedures.GainReport | procedures.OffsetReport
    channel_file: Path | None


def channel_file(req: CalibrationRequest) -> Path | None:
    """The calibration file the board gives the requested channel (None if none or emulated
    without a board), to check it can be written before any calibration starts."""
    if req.board_path is None:
        return None
    return load_board(req.board_path).channel(req.channel).calibration_path


def _emulated_load(req: CalibrationRequest) -> ConstantPower:
    if req.zero or req.volts is None or req.amps is None:
        return ConstantPower(0.0, voltage_v=230.0)
    pf = min(req.watts / (req.volts * req.amps), 1.0) if req.watts is not None else 1.0
    return ConstantPower(req.volts * req.amps * pf, voltage_v=req.volts, power_factor=pf)


def calibrate_channel(req: CalibrationRequest) -> CalibrationOutcome:
    """Run the request's procedure on its channel; a one-line `UserError` when the chip
    cannot hold the result or the bus fails (nothing is saved here: see `save`)."""
    if not req.zero and (req.volts is None or req.amps is None):
        raise UserError("calibration: volts and amps are required for gains (or zero)")
    emulated = req.emulate or req.board_path is None
    clock = SimulatedClock() if emulated else SystemClock()
    board = load_board(req.board_path) if req.board_path else emulated_board(4, clock=clock)
    ch_cfg = dataclasses.replace(board.channel(req.channel), enabled=True)
    one = dataclasses.replace(board, channels=[ch_cfg], clock=clock)
    chans = open_channels(one, "emulated" if emulated else None, clock=clock,
                          power_model=_emulated_load(req) if emulated else None,
                          allow_uncalibrated=True)
    ch = chans[0]
    if emulated:
        e = req.emulate_gain_error
        assert ch.emulator is not None  # opened with the emulated factory
        ch.emulator.errors.update(
            {"voltage": e, "current_l": e, "energy_l": e,
             "current_offset_a": req.emulate_offset_ma / 1000.0,
             "power_offset_w": req.emulate_offset_w})
    interval = board.refresh_period_s if emulated else 1.0
    report: procedures.GainReport | procedures.OffsetReport
    try:
        clock.sleep(interval * 1.5)
        if req.zero:
            report = procedures.calibrate_offsets(ch.driver, n_readings=req.readings,
                                                  interval_s=interval)
        else:
            assert req.volts is not None and req.amps is not None  # checked above
            report = procedures.calibrate_gains(
                ch.driver, req.volts, req.amps, req.watts, seconds=req.seconds,
                n_readings=req.readings, interval_s=interval)
    except CalibrationError as exc:
        raise UserError(f"channel {ch.name}: {exc}") from None
    except BusError as exc:
        raise UserError(f"channel {ch.name}: bus error during calibration: {exc}") from None
    finally:
        ch.close()
    return CalibrationOutcome(ch.index, ch.name, emulated, report, ch_cfg.calibration_path)
