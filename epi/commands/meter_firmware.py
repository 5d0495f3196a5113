"""`epi meter firmware build | deploy | console`: the board MCU's firmware (docs/bridge.md)."""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from pathlib import Path

import click

from epi.commands.params import BoundedInt, FiniteFloat
from epi.core.errors import UserError


@click.group("firmware")
def firmware() -> None:
    """The epi-meter board's RP2350 firmware: compile, flash, talk to it."""


@firmware.command("build")
@click.option("--out", "out_dir", type=click.Path(path_type=Path, file_okay=False),
              default=Path("out/firmware"), show_default=True, help="Build folder.")
def build_cmd(out_dir: Path) -> None:
    """Compile the firmware and the chip layer with mpy-cross (.mpy for the RP2350)."""
    from epi.commands.params import check_output_dir
    from meter.bridge.firmware_tools import build

    res = build(check_output_dir(out_dir, "--out"))
    size = sum(p.stat().st_size for p in res.files)
    click.echo(f"built {len(res.files)} files ({size} bytes) into {out_dir}")


@firmware.command("deploy")
@click.option("--port", required=True, help="The Pico 2's USB serial port (e.g. /dev/ttyACM0).")
@click.option("--config", type=click.Path(path_type=Path, dir_okay=False, exists=True),
              help="Board configuration for the MCU's flash (epi_meter.json, docs/bridge.md).")
@click.option("--dry-run", is_flag=True, help="Print the mpremote command, run nothing.")
def deploy_cmd(port: str, config: Path | None, dry_run: bool) -> None:
    """Build, copy to the board with mpremote, and reset it. The config is checked first with
    the firmware's own reader: a file the board would refuse is refused here (dry-run too)."""
    from meter.bridge.firmware_tools import build, check_config_file, deploy_argv

    if config is not None:
        check_config_file(config)
    with tempfile.TemporaryDirectory(prefix="epi-firmware-") as tmp:
        res = build(Path(tmp))
        argv = deploy_argv(res.out_dir, port, config)
        if dry_run:
            click.echo(" ".join(argv))
            return
        proc = subprocess.run(argv, check=False)
        if proc.returncode != 0:
            raise UserError(f"mpremote failed on {port} (exit {proc.returncode})")
    click.echo(f"deployed {len(res.files)} files to {port}; the board restarted")


@firmware.command("console")
@click.option("--port", help="The bridge UART [default: EPI_BRIDGE_PORT, /dev/ttyAMA0, ...].")
@click.option("--baud", default=115200, show_default=True, type=BoundedInt(300, 4_000_000),
              help="UART speed, baud (the bridge board's `baud`).")
@click.option("--send", "sends", multiple=True, metavar="CMD",
              help='A command to send (`ping`, `hello`, or a JSON object); repeatable. Without '
              "it, commands are read from standard input.")
@click.option("--seconds", type=FiniteFloat(0, 86_400, lo_open=True),
              help="Stop after this long [default: until EOF/Ctrl-C].")
def console_cmd(port: str | None, baud: int, sends: tuple[str, ...], seconds: float | None
                ) -> None:
    """Talk to the firmware over the bridge UART: print every line, decoded and CRC-checked."""
    import json

    from meter.bridge.link import SerialLink
    from meter.bridge.probe import default_port
    from meter.bridge.protocol import LineError, command, decode_line, seal
    from meter.errors import LinkLost

    port = port or default_port()
    if port is None:
        raise UserError("epi meter firmware console: no port (give --port)")
    link = SerialLink(port, baud)
    try:
        link.open()
    except LinkLost as exc:
        raise UserError(f"{port}: cannot open: {exc}") from None

    def encode(text: str) -> bytes:
        text = text.strip()
        if text.startswith("{"):
            try:
                obj = json.loads(text)
            except ValueError as exc:
                raise UserError(f"--send {text!r}: not JSON: {exc}") from None
            if not isinstance(obj, dict) or not isinstance(obj.get("cmd"), str) \
                    or not obj["cmd"]:
                raise UserError(f"--send {text[:60]!r}: expected a JSON object with a "
                                'non-empty string "cmd"')
            # the command's own fields, whatever they are called ("name" included)
            return seal(json.dumps({"cmd": obj.pop("cmd"), **obj},
                                   separators=(",", ":")).encode())
        return command(text)

    for s in sends:
        link.write(encode(s))
    end = time.monotonic() + seconds if seconds is not None else None
    buf = b""
    try:
        while end is None or time.monotonic() < end:
            if not sends and end is None:
                import select

                ready, _, _ = select.select([sys.stdin], [], [], 0)
                if ready:
                    line = sys.stdin.readline()
                    if not line:
                        break
                    if line.strip():
                        link.write(encode(line))
            buf += link.read(0.1)
            *lines, buf = buf.split(b"\n")
            for ln in lines:
                try:
                    msg = decode_line(ln + b"\n")
                    click.echo(repr(msg))
                except LineError as exc:
                    click.echo(f"! {exc.kind}: {exc.detail}")
    except LinkLost as exc:
        raise UserError(f"{port}: {exc}") from None
    finally:
        link.close()
