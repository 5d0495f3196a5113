"""The RP2350's hardware for the firmware: machine.UART, machine.SPI (mode 3), CS pins.

Only imported on the MCU (and by tests through the `machine` stand-in): the emulated bridge
passes its own `hw` object. MicroPython subset.
"""

import binascii
import os
import time

import machine

UART_TXBUF = 4096  # a whole sweep line fits: the UART drains it while the next sweep reads SPI
UART_RXBUF = 1024


class McuHardware:
    """What `meter.firmware.app.Firmware` needs, from the board's peripherals."""

    def __init__(self, config):
        u = config["uart"]
        s = config["spi"]
        self.uart = machine.UART(
            u["id"], baudrate=u["baud"], tx=machine.Pin(u["tx"]), rx=machine.Pin(u["rx"]),
            txbuf=UART_TXBUF, rxbuf=UART_RXBUF,
        )
        # ATM90E26: SPI mode 3 (CPOL=1, CPHA=1), MSB first, at most 160 kHz
        self.spi = machine.SPI(
            s["id"], baudrate=s["baud"], polarity=1, phase=1, bits=8, firstbit=machine.SPI.MSB,
            sck=machine.Pin(s["sck"]), mosi=machine.Pin(s["mosi"]), miso=machine.Pin(s["miso"]),
        )
        # MicroPython's time module has these; CPython's typeshed does not know them
        self.ticks_us = time.ticks_us  # type: ignore[attr-defined]  # MicroPython only
        self.ticks_diff = time.ticks_diff  # type: ignore[attr-defined]  # MicroPython only
        self.sleep_us = time.sleep_us  # type: ignore[attr-defined]  # MicroPython only

    def pin(self, number):
        """A chip-select line, idle high (deselected) from the start."""
        return machine.Pin(number, machine.Pin.OUT, value=1)

    def read_file(self, name):
        with open(name) as f:
            return f.read()

    def write_file(self, name, text):
        tmp = name + ".tmp"
        with open(tmp, "w") as f:
            f.write(text)
        os.rename(tmp, name)

    def boot_id(self):
        try:
            return binascii.hexlify(os.urandom(4)).decode()
        except (AttributeError, OSError):  # a port without a random source
            import random

            return "%08x" % random.getrandbits(32)

    def info(self):
        return {
            "mcu": "RP2350",
            "freq_hz": machine.freq(),
            "uid": binascii.hexlify(machine.unique_id()).decode(),
            "micropython": ".".join(str(x) for x in __import__("sys").implementation.version[:3]),
        }
