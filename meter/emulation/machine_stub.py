"""A small stand-in for MicroPython's `machine` module: Pin, SPI, UART, freq, unique_id.

Used where the firmware runs without the RP2350: on CPython (the emulated bridge, backed by
the register-level chip emulator) and on MicroPython's WebAssembly port in the tests (backed
by a small fake chip). Chips are wired to chip-select pins with `attach(pin, chip)`; a chip is
anything with `spi_transfer(mosi: bytes) -> bytes`. An SPI transfer reaches every chip whose
CS pin is low (wired-AND on MISO; 0xFF when none drives it), and only in mode 3 at
<= 160 kHz — in any other mode the chip samples garbage, modelled as all ones.

MicroPython subset (this file itself runs on MicroPython).
"""

MAX_ATM90E26_SPI_HZ = 160000

_pins = {}  # type: dict[int, Pin]
_chips = {}


def attach(pin_number, chip):
    """Wire `chip` to chip-select pin `pin_number` of the default board."""
    _chips[pin_number] = chip


def detach_all():
    _chips.clear()
    _pins.clear()


def freq():
    return 150000000


def unique_id():
    return b"\xe9\x01\x00\x00\x00\x00\x00\x01"


class Pin:
    IN = 0
    OUT = 1
    PULL_UP = 1

    def __init__(self, ident, mode=-1, pull=None, value=None):
        self.ident = ident
        self.mode = mode
        self._value = 1 if value is None else (1 if value else 0)
        _pins[ident] = self

    def value(self, v=None):
        if v is None:
            return self._value
        self._value = 1 if v else 0
        return None

    def __call__(self, v=None):
        return self.value(v)

    def on(self):
        self._value = 1

    def off(self):
        self._value = 0


class SPI:
    MSB = 0
    LSB = 1

    def __init__(self, ident, baudrate=1000000, polarity=0, phase=0, bits=8, firstbit=0,
                 sck=None, mosi=None, miso=None, pins=None, chips=None):
        self.ident = ident
        self.baudrate = baudrate
        self.polarity = polarity
        self.phase = phase
        self.bits = bits
        self.firstbit = firstbit
        self.frames = 0
        self.bits_sent = 0
        self.on_transfer = None  # called with the transfer's wire time in seconds
        self._pins = _pins if pins is None else pins
        self._chips = _chips if chips is None else chips

    def init(self, baudrate=None, polarity=None, phase=None):
        if baudrate is not None:
            self.baudrate = baudrate
        if polarity is not None:
            self.polarity = polarity
        if phase is not None:
            self.phase = phase

    def write_readinto(self, write_buf, read_buf):
        n = len(write_buf)
        self.frames += 1
        self.bits_sent += 8 * n
        out = [0xFF] * n
        ok = (self.polarity == 1 and self.phase == 1 and self.baudrate <= MAX_ATM90E26_SPI_HZ
              and self.firstbit == SPI.MSB)
        if ok:
            for pin_number in self._chips:
                pin = self._pins.get(pin_number)
                if pin is not None and pin.value() == 0:
                    reply = self._chips[pin_number].spi_transfer(bytes(write_buf))
                    for i in range(n):
                        out[i] &= reply[i]
        for i in range(n):
            read_buf[i] = out[i]
        if self.on_transfer is not None:
            self.on_transfer(8.0 * n / self.baudrate)

    def write(self, buf):
        self.write_readinto(buf, bytearray(len(buf)))


class UART:
    """A UART whose receive side is fed by `feed(bytes)` and whose transmit side goes to
    `sink(bytes)` (or collects in `sent`)."""

    def __init__(self, ident, baudrate=115200, tx=None, rx=None, txbuf=256, rxbuf=256,
                 timeout=0, **kwargs):
        self.ident = ident
        self.baudrate = baudrate
        self.txbuf = txbuf
        self.rxbuf = rxbuf
        self.rx = bytearray()
        self.sent = bytearray()
        self.sink = None

    def feed(self, data):
        self.rx.extend(data)

    def any(self):
        return len(self.rx)

    def read(self, n=-1):
        if not self.rx:
            return None
        if n is None or n < 0 or n >= len(self.rx):
            data = bytes(self.rx)
            self.rx = bytearray()
        else:
            data = bytes(self.rx[:n])
            self.rx = self.rx[n:]
        return data

    def write(self, data):
        if self.sink is not None:
            self.sink(bytes(data))
        else:
            self.sent.extend(data)
        return len(data)

    def txdone(self):
        return True
