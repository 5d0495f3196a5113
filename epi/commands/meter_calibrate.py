"""`epi meter calibrate`: compute a channel's gains from reference readings, write, verify, save.

The load on the channel must be steady and known: `--volts` and `--amps` (true RMS from a
reference meter) set Ugain and IgainL; `--watts` (a resistive load's true power) additionally
sets Lgain from the energy the chip meters over `--seconds`. `--zero` instead calibrates the
current and power offsets with no load connected. Values the chip cannot hold (Ugain bit 15,
gains beyond ±50 %) are refused with the reason. The new registers are written with fresh
CS1/CS2 checksums, verified, and saved to the channel's calibration file.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import click

from epi.commands.params import BoundedInt, FiniteFloat, check_output_file
from epi.core.errors import UserError
from meter.board import emulated_board, load_board, open_channels, save_calibration_file
from meter.chip.calibration import CalibrationError
from meter.clock import SimulatedClock, SystemClock
from meter.driver import calibration_procedures as procedures
from meter.emulation.power_models import ConstantPower
from meter.errors import BusError


def _pct(measured: float, reference: float | None) -> str:
    if reference is None or reference == 0:
        return ""
    return f"{(measured / reference - 1) * 100:+.3f} %"


@click.command("calibrate")
@click.argument("channel")
@click.option("--board", "board_path", type=click.Path(path_type=Path, dir_okay=False),
              help="Board file; the calibration is saved to the channel's calibration file.")
@click.option("--emulate", is_flag=True,
              help="Calibrate an emulated chip that carries exactly the reference load.")
@click.option("--emulate-gain-error", type=FiniteFloat(-0.5, 0.5), default=0.0, show_default=True,
              help="With --emulate: the emulated front end reads (1 + this) × true "
                   "voltage, current and energy, so there is something to correct.")
@click.option("--emulate-offset-ma", type=FiniteFloat(-1000, 1000), default=0.0, show_default=True,
              help="With --emulate: a current offset of the emulated front end, mA.")
@click.option("--emulate-offset-w", type=FiniteFloat(-1000, 1000), default=0.0, show_default=True,
              help="With --emulate: an active-power offset of the emulated front end, W.")
@click.option("--volts", type=FiniteFloat(0, 1000, lo_open=True), help="Reference RMS voltage, V.")
@click.option("--amps", type=FiniteFloat(0, 100, lo_open=True), help="Reference RMS current, A.")
@click.option("--watts", type=FiniteFloat(0, 100_000, lo_open=True),
              help="Reference active power, W (enables Lgain).")
@click.option("--seconds", type=FiniteFloat(0, 86_400, lo_open=True), default=60.0,
              show_default=True,
              help="Energy window for --watts.")
@click.option("--readings", type=BoundedInt(1, 100), default=5, show_default=True,
              help="Readings averaged for voltage and current.")
@click.option("--zero", is_flag=True, help="Offsets instead: NO load current flowing.")
@click.option("--output", type=click.Path(path_type=Path, dir_okay=False),
              help="Where to save the calibration [default: the channel's file].")
def calibrate(channel: str, board_path: Path | None, emulate: bool, emulate_gain_error: float,
              emulate_offset_ma: float, emulate_offset_w: float, volts: float | None,
              amps: float | None, watts: float | None, seconds: float, readings: int,
              zero: bool, output: Path | None) -> None:
    """Calibrate CHANNEL (index or name) against reference readings."""
    if board_path is None and not emulate:
        raise UserError("epi meter calibrate: give --board FILE (real chips) or --emulate")
    if zero and (volts is not None or amps is not None or watts is not None):
        raise UserError("epi meter calibrate: --zero takes no --volts/--amps/--watts "
                        "(offsets are measured with no load)")
    if not zero and (volts is None or amps is None):
        raise UserError("epi meter calibrate: --volts and --amps are required (or --zero)")
    for name, value in (("--volts", volts), ("--amps", amps), ("--watts", watts),
                        ("--seconds", seconds)):
        if value is not None and value <= 0:
            raise UserError(f"epi meter calibrate: {name} must be > 0, got {value}")
    va = volts * amps if volts is not None and amps is not None else None
    if watts is not None and va is not None and watts > va * 1.001:
        raise UserError(f"epi meter calibrate: --watts {watts} exceeds --volts × --amps "
                        f"({va:.3f} VA): power factor above 1")

    if output is not None:
        check_output_file(output, "--output", make_parents=True)

    emulated = emulate or board_path is None
    clock = SimulatedClock() if emulated else SystemClock()
    board = load_board(board_path) if board_path else emulated_board(4, clock=clock)
    ch_cfg = board.channel(channel)
    if output is None and ch_cfg.calibration_path is not None:  # the channel's own file
        check_output_file(ch_cfg.calibration_path, f"channel {ch_cfg.name} calibration",
                          make_parents=True)
    ch_cfg = dataclasses.replace(ch_cfg, enabled=True)
    one = dataclasses.replace(board, channels=[ch_cfg], clock=clock)
    model = None
    if emulated:
        if zero:
            model = ConstantPower(0.0, voltage_v=230.0)
        else:
            assert volts is not None and amps is not None  # required without --zero (above)
            pf = min(watts / (volts * amps), 1.0) if watts is not None else 1.0
            model = ConstantPower(volts * amps * pf, voltage_v=volts, power_factor=pf)
    chans = open_channels(one, "emulated" if emulated else None, clock=clock,
                          power_model=model, allow_uncalibrated=True)
    ch = chans[0]
    if emulated:
        e = emulate_gain_error
        assert ch.emulator is not None  # opened with the emulated factory
        ch.emulator.errors.update(
            {"voltage": e, "current_l": e, "energy_l": e,
             "current_offset_a": emulate_offset_ma / 1000.0, "power_offset_w": emulate_offset_w}
        )
    interval = board.refresh_period_s if emulated else 1.0
    try:
        clock.sleep(interval * 1.5)
        if zero:
            report = procedures.calibrate_offsets(
                ch.driver, n_readings=readings, interval_s=interval
            )
        else:
            assert volts is not None and amps is not None  # checked above
            report = procedures.calibrate_gains(
                ch.driver, volts, amps, watts, seconds=seconds, n_readings=readings,
                interval_s=interval,
            )
    except CalibrationError as exc:
        raise UserError(f"channel {ch.name}: {exc}") from None
    except BusError as exc:
        raise UserError(f"channel {ch.name}: bus error during calibration: {exc}") from None
    finally:
        ch.close()

    click.echo(f"channel {ch.index} ({ch.name}){' [emulated chip]' if emulated else ''}")
    if not zero:
        ref = {"Urms": volts, "Irms": amps, "Pmean": watts}
        units = {"Urms": "V", "Irms": "A", "Pmean": "W"}
        click.echo(f"{'reading':8} {'reference':>12} {'before':>12} {'error':>10} "
                   f"{'after':>12} {'error':>10}")
        for key in ("Urms", "Irms", "Pmean"):
            b, a, r = report["before"][key], report["after"][key], ref[key]
            click.echo(f"{key:8} {'-' if r is None else f'{r:.4f}':>12} {b:12.4f} "
                       f"{_pct(b, r):>10} {a:12.4f} {_pct(a, r):>10}  {units[key]}")
        if watts is not None:
            click.echo(f"energy error over {report['energy_window_s']:.1f} s: "
                       f"{report['energy_error_before'] * 100:+.3f} % before, "
                       f"{report['energy_error_after'] * 100:+.3f} % after "
                       f"({report['energy_counts']} register counts)")
    else:
        sp = report["before"]["small_power"]
        click.echo(f"no-load Irms {report['before']['Irms'] * 1000:.3f} mA before, "
                   f"{report['after']['Irms'] * 1000:.3f} mA after")
        click.echo(f"no-load Pmean in small-power mode {sp['Pmean']:.1f} LSB before; "
                   f"Pmean {report['after']['Pmean']:.4f} W after")
    if report["changed"]:
        click.echo("registers written (with CS1/CS2, verified):")
        for name, (old, new) in report["changed"].items():
            click.echo(f"  {name:9} 0x{old:04X} -> 0x{new:04X}")
    else:
        click.echo("registers unchanged: the chip already reads the reference values")
    cal = report["calibration"]
    target = output or ch_cfg.calibration_path
    if target is None:
        click.echo("not saved: this channel has no calibration file (pass --output FILE)")
        return
    save_calibration_file(Path(target), cal)
    click.echo(f"saved {target}")
