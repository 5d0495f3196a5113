"""`epi meter read`: one reading of every channel, as a table (real board or emulator)."""

from __future__ import annotations

import json
from pathlib import Path

import click

from epi.commands.params import BoundedInt, FiniteFloat
from epi.core.errors import UserError
from meter.board.channels import Channel, emulated_board, load_board, open_channels
from meter.clock import SystemClock
from meter.driver.reading import Reading
from meter.errors import BusError

REAL_SETTLE_S = 2.0  # measurement registers after start-up: the datasheet gives no figure


def _fmt(value: object, spec: str) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return format(value, spec)
    return str(value)


@click.command("read")
@click.option("--board", "board_path", type=click.Path(path_type=Path, dir_okay=False),
              help="Board file (e.g. hardware/epi-meter.toml).")
@click.option("--emulate", is_flag=True,
              help="Emulated chips (with --board: that board's channels, emulated).")
@click.option("--channels", "n_channels", type=BoundedInt(1, 16), default=4,
              show_default=True, help="Channels of the emulated board (without --board).")
@click.option("--settle", "settle_s", type=FiniteFloat(0, 3600), default=None,
              help="Seconds between start-up and the reading [default: one measurement "
                   "refresh when emulated, 2 s for real chips].")
@click.option("--json", "as_json", is_flag=True, help="JSON lines instead of a table.")
def read(board_path: Path | None, emulate: bool, n_channels: int, settle_s: float | None,
         as_json: bool) -> None:
    """Start every channel's chip, wait for fresh measurements, read each once."""
    if board_path is None and not emulate:
        raise UserError("epi meter read: give --board FILE (real chips) or --emulate")
    clock = SystemClock()
    board = load_board(board_path) if board_path else emulated_board(n_channels, clock=clock)
    channels = open_channels(board, "emulated" if emulate else None, clock=clock)
    try:
        if settle_s is None:
            emulated = emulate or board.emulated
            settle_s = board.refresh_period_s * 1.5 if emulated else REAL_SETTLE_S
        clock.sleep(max(settle_s, 0.0))
        results: list[tuple[Channel, Reading | None, str | None]] = []
        for ch in channels:
            try:
                results.append((ch, ch.driver.read_sample(), None))
            except BusError as exc:
                results.append((ch, None, f"{type(exc).__name__}: {exc}"))
    finally:
        for ch in channels:
            ch.close()
    not_ready = (
        f"not ready: the chip's first measurement after start-up was not complete yet "
        f"(--settle {settle_s:g} s); measurement values withheld"
    )
    results = [(ch, s, error if s is None or s.ready else not_ready) for ch, s, error in results]
    if as_json:
        for ch, sample, error in results:
            row = {"channel": ch.index, "name": ch.name, "node": ch.node, "error": error}
            if sample is not None:
                row.update(sample.as_dict())
            click.echo(json.dumps(row))
        return
    header = ("ch", "name", "node", "voltage_v", "current_a", "power_w", "pf", "freq_hz",
              "q_var", "s_va", "energy_j", "status")
    lines: list[tuple[str, ...]] = [header]
    for ch, s, error in results:
        if s is None or not s.ready:
            lines.append((str(ch.index), ch.name, ch.node or "-", f"error: {error}"))
            continue
        lines.append((
            str(ch.index), ch.name, ch.node or "-",
            _fmt(s.voltage_v, ".2f"), _fmt(s.current_a, ".4f"), _fmt(s.power_w, ".3f"),
            _fmt(s.power_factor, ".3f"), _fmt(s.frequency_hz, ".2f"),
            _fmt(s.reactive_power_var, ".3f"), _fmt(s.apparent_power_va, ".3f"),
            _fmt(s.energy_j, ".2f"), f"0x{s.status:04X}",
        ))
    widths = [max(len(line[i]) for line in lines if i < len(line)) for i in range(len(header))]
    for line in lines:
        click.echo("  ".join(cell.rjust(widths[i]) if i >= 3 else cell.ljust(widths[i])
                             for i, cell in enumerate(line)).rstrip())
    source = f"board {board.path}" if board.path else "emulated board"
    click.echo(f"\n{source}; energy_j counts from start-up ({settle_s:.2f} s before the read)")
    for ch in channels:
        if ch.emulator is not None:
            model = ch.emulator.model.describe()
            params = ", ".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}"
                               for k, v in model.items()
                               if k not in ("kind", "modelled", "steps"))
            click.echo(f"  ch{ch.index}: emulated ATM90E26, power model {model['kind']} "
                       f"(modelled, not measured): {params}")
