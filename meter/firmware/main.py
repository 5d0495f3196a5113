"""The MCU's entry point (copied to the board's flash root as main.py by `epi meter firmware
deploy`): load the configuration from flash (a good one is kept as the last good), open the
peripherals, run for ever."""

from meter.firmware.app import Firmware
from meter.firmware.config import load_config
from meter.firmware.hw import McuHardware


def _read(name):
    with open(name) as f:
        return f.read()


def _write(name, text):
    with open(name, "w") as f:
        f.write(text)


def main():
    config, error = load_config(_read, _write)
    Firmware(McuHardware(config), config, error).run()


main()
