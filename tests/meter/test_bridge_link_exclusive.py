"""The serial port is opened exclusively: `epi meter firmware console` beside a
running bridge daemon must not open the daemon's port and steal its lines."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from click.testing import CliRunner

from epi.commands.meter_firmware import console_cmd
from epi.core.errors import UserError
from meter.bridge.link import SerialLink
from meter.errors import LinkLost


@pytest.fixture
def pty_port() -> Iterator[str]:
    master, slave = os.openpty()
    try:
        yield os.ttyname(slave)
    finally:
        os.close(master)
        os.close(slave)


def test_a_second_open_of_the_same_port_is_refused(pty_port: str) -> None:
    first = SerialLink(pty_port, 115200)
    first.open()
    try:
        second = SerialLink(pty_port, 115200)
        with pytest.raises(LinkLost, match="lock"):
            second.open()
        assert second.ser is None
    finally:
        first.close()
    again = SerialLink(pty_port, 115200)  # free once the first closed it
    again.open()
    again.close()


def test_firmware_console_refuses_a_port_the_daemon_holds(pty_port: str) -> None:
    daemon = SerialLink(pty_port, 115200)
    daemon.open()
    try:
        res = CliRunner().invoke(console_cmd, ["--port", pty_port, "--seconds", "0.2"])
    finally:
        daemon.close()
    assert res.exit_code != 0
    assert isinstance(res.exception, UserError)  # epi's one-line error, never a traceback
    assert "cannot open" in str(res.exception) and "lock" in str(res.exception)


def test_a_console_command_carries_any_field_name_to_the_wire() -> None:
    """`--send '{"cmd": "ping", "name": 1}'` (a field called like the helper's own parameter)
    goes out as that JSON, sealed; a JSON value that is not a command object is one line."""
    import json

    from meter.firmware.crc import unseal

    master, slave = os.openpty()
    try:
        res = CliRunner().invoke(console_cmd, ["--port", os.ttyname(slave), "--seconds", "0.1",
                                               "--send", '{"cmd": "ping", "name": 1}'])
        assert res.exit_code == 0, res.output
        wire = os.read(master, 4096)
    finally:
        os.close(master)
        os.close(slave)
    line = next(ln for ln in wire.split(b"\n") if ln.strip())
    payload = unseal(line.strip())  # its CRC checks out
    assert payload is not None and json.loads(payload) == {"cmd": "ping", "name": 1}
    for bad in ('{"name": 1}', '{"cmd": 3}', '{"cmd": ""}'):
        out = CliRunner().invoke(console_cmd, ["--port", "/nonexistent-port", "--send", bad])
        assert out.exit_code != 0
