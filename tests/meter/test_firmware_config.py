"""The board's configuration: a file with a wrong type anywhere is refused in one
line by the firmware's reader, which keeps its last good configuration, and by
`epi meter firmware deploy` (dry-run included) before anything is built or copied."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from epi.cli import cli
from meter.firmware.config import (
    CONFIG_FILE,
    LAST_GOOD_FILE,
    default_config,
    load_config,
    parse_config,
)

BASE = {"format": "epi-bridge-config", "format_version": 1}
BAD = [
    ("not json {", "not valid JSON"),
    (json.dumps({"format": "other"}), "format is not"),
    (json.dumps({**BASE, "spi": 5}), "spi is not an object"),
    (json.dumps({**BASE, "spi": {"baud": "x"}}), "spi.baud"),
    (json.dumps({**BASE, "uart": [1, 2]}), "uart is not an object"),
    (json.dumps({**BASE, "uart": {"baud": -9600}}), "uart.baud"),
    (json.dumps({**BASE, "channels": "all"}), "channels is not a list"),
    (json.dumps({**BASE, "channels": [{"cs": 17}] * 99}), "channels is not a list"),
    (json.dumps({**BASE, "channels": [{"cs": "17"}]}), "channels[0].cs"),
    (json.dumps({**BASE, "channels": [{"cs": 17, "meter_constant_imp_per_kwh": 0}]}),
     "meter_constant"),
    (json.dumps({**BASE, "rate_hz": -10}), "rate_hz"),
    (json.dumps({**BASE, "rate_hz": "10"}), "rate_hz"),
    (json.dumps({**BASE, "encoding": 3}), "encoding"),
]


@pytest.mark.parametrize(("text", "why"), BAD)
def test_the_firmware_refuses_a_bad_file_in_one_line(text: str, why: str) -> None:
    cfg, error = parse_config(text)
    assert error is not None and why in error and "\n" not in error
    assert cfg == default_config()  # nothing of the bad file is in force


def test_a_good_file_overlays_the_defaults() -> None:
    cfg, error = parse_config(json.dumps({**BASE, "rate_hz": 20, "spi": {"baud": 100000}}))
    assert error is None and cfg["rate_hz"] == 20
    assert cfg["spi"] == {**default_config()["spi"], "baud": 100000}


@pytest.mark.parametrize(("text", "why"), BAD[:4])
def test_the_firmware_keeps_its_last_good_configuration(text: str, why: str) -> None:
    flash = {CONFIG_FILE: json.dumps({**BASE, "rate_hz": 25})}

    def read(name: str) -> str:
        if name not in flash:
            raise OSError(name)
        return flash[name]

    def write(name: str, data: str) -> None:
        flash[name] = data

    cfg, error = load_config(read, write)
    assert error is None and cfg["rate_hz"] == 25 and LAST_GOOD_FILE in flash
    flash[CONFIG_FILE] = text  # a bad file replaces it
    cfg, error = load_config(read, write)
    assert cfg["rate_hz"] == 25  # the last good one runs, not the defaults, not the bad one
    assert error is not None and why in error and "last good configuration" in error
    assert json.loads(flash[LAST_GOOD_FILE])["rate_hz"] == 25


@pytest.mark.parametrize("dry_run", [True, False])
@pytest.mark.parametrize(("text", "why"), BAD)
def test_deploy_refuses_a_bad_config_before_copying(tmp_path: Path, text: str, why: str,
                                                    dry_run: bool) -> None:
    cfg = tmp_path / "epi_meter.json"
    cfg.write_text(text)
    args = ["meter", "firmware", "deploy", "--port", "/dev/ttyNONE", "--config", str(cfg)]
    res = CliRunner().invoke(cli, args + (["--dry-run"] if dry_run else []))
    assert res.exit_code != 0
    out = res.output + str(res.exception)  # epi's UserError: one line, no traceback
    assert str(cfg) in out and why in out and "nothing deployed" in out, out
    assert "mpremote" not in out and "Traceback" not in out
