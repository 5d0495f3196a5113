"""`epi meter calibrate`: compute a channel's gains from reference readings, write, verify, save.

The load on the channel must be steady and known: `--volts` and `--amps` (true RMS from a
reference meter) set Ugain and IgainL; `--watts` (a resistive load's true power) additionally
sets Lgain from the energy the chip meters over `--seconds`. `--zero` instead calibrates the
current and power offsets with no load connected. Values the chip cannot hold (Ugain bit 15,
gains beyond ±50 %) are refused with the reason. The new registers are written with fresh
CS1/CS2 checksums, verified, and saved to the channel's calibration file.
"""

from __future__ import annotations

from pathlib import Path

import click

from epi.commands.aliases import prefer_alias, renamed_option
from epi.commands.params import BoundedInt, FiniteFloat, check_output_file
from epi.core.errors import UserError
from meter.board.channels import save_calibration_file
from meter.calibrate import (
    CalibrationOutcome,
    CalibrationRequest,
    calibrate_channel,
    channel_file,
)
from meter.driver.calibration_procedures import GainReport


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
@click.option("--out", "output", type=click.Path(path_type=Path, dir_okay=False),
              callback=prefer_alias("--out"),
              help="Where to save the calibration [default: the channel's file].")
@renamed_option("--output", "--out")
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

    req = CalibrationRequest(
        channel=channel, board_path=board_path, emulate=emulate, volts=volts, amps=amps,
        watts=watts, seconds=seconds, readings=readings, zero=zero,
        emulate_gain_error=emulate_gain_error, emulate_offset_ma=emulate_offset_ma,
        emulate_offset_w=emulate_offset_w)
    # where the result goes is checked before any calibration starts
    if output is not None:
        check_output_file(output, "--out", make_parents=True)
    else:
        own = channel_file(req)
        if own is not None:
            check_output_file(own, f"channel {channel} calibration", make_parents=True)
    done = calibrate_channel(req)
    for line in report_lines(done):
        click.echo(line)
    target = output or done.channel_file
    if target is None:
        click.echo("not saved: this channel has no calibration file (pass --out FILE)")
        return
    save_calibration_file(Path(target), done.report.calibration)
    click.echo(f"saved {target}")


def report_lines(done: CalibrationOutcome) -> list[str]:
    """The before/after table and the registers written, as the command prints them."""
    r = done.report
    lines = [f"channel {done.index} ({done.name}){' [emulated chip]' if done.emulated else ''}"]
    if isinstance(r, GainReport):
        ref = {"Urms": r.reference_volts, "Irms": r.reference_amps, "Pmean": r.reference_watts}
        units = {"Urms": "V", "Irms": "A", "Pmean": "W"}
        lines.append(f"{'reading':8} {'reference':>12} {'before':>12} {'error':>10} "
                     f"{'after':>12} {'error':>10}")
        for key in ("Urms", "Irms", "Pmean"):
            b, a, x = r.before[key], r.after[key], ref[key]
            lines.append(f"{key:8} {'-' if x is None else f'{x:.4f}':>12} {b:12.4f} "
                         f"{_pct(b, x):>10} {a:12.4f} {_pct(a, x):>10}  {units[key]}")
        if (r.energy_error_before is not None and r.energy_error_after is not None
                and r.energy_window_s is not None):
            lines.append(f"energy error over {r.energy_window_s:.1f} s: "
                         f"{r.energy_error_before * 100:+.3f} % before, "
                         f"{r.energy_error_after * 100:+.3f} % after "
                         f"({r.energy_counts} register counts)")
    else:
        sp = r.small_power_before
        lines.append(f"no-load Irms {r.irms_before_a * 1000:.3f} mA before, "
                     f"{r.after['Irms'] * 1000:.3f} mA after")
        lines.append(f"no-load Pmean in small-power mode {sp['Pmean']:.1f} LSB before; "
                     f"Pmean {r.after['Pmean']:.4f} W after")
    if r.changed:
        lines.append("registers written (with CS1/CS2, verified):")
        lines += [f"  {name:9} 0x{old:04X} -> 0x{new:04X}"
                  for name, (old, new) in r.changed.items()]
    else:
        lines.append("registers unchanged: the chip already reads the reference values")
    return lines
