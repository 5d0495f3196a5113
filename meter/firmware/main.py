"""The MCU's entry point (copied to the board's flash root as main.py by `epi meter firmware
deploy`): load the configuration from flash, open the peripherals, run for ever."""

from meter.firmware.app import Firmware
from meter.firmware.config import load_config
from meter.firmware.hw import McuHardware


def _read(name):
    with open(name) as f:
        return f.read()


def main():
    config, error = load_config(_read)
    Firmware(McuHardware(config), config, error).run()


main()
