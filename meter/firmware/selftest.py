"""Self-tests of the firmware that run unchanged on MicroPython and on CPython.

`run()` exercises the line CRC, the tick extension past many `ticks_us` wraps, and a whole
firmware (app, chip driver, telemetry, commands) on the `machine` stand-in with `FakeChip`s:
sweeps in both encodings with cumulative counts, readiness (no values before a chip's first
complete measurement after start-up: `fail: "not_ready"`), the plausibility checks (a
glitched register word re-read, an implausible reading sent as `fail: "implausible"` with an
event that says why), commands (ping, rate, read, write, malformed ones), an absent chip (an
event and a `fail` entry, never a 0 reading), a chip reset, and a CS1 checksum error whose
SysStatus bits clear on read (acted on at the first read, confirmed by CS1 read back). The
test suite runs it on MicroPython's WebAssembly port and on CPython (tests/meter/firmware/).
Prints `SELFTEST OK <n>` on success, raises on the first failure.
MicroPython subset.
"""

import json

from meter.chip import registers as regs
from meter.chip.checksum import checksum
from meter.firmware.app import Firmware
from meter.firmware.config import default_config
from meter.firmware.crc import crc16, unseal
from meter.firmware.mcutime import TickExtender


class FakeChip:
    """A register-level ATM90E26 for the self-tests: LastData, read-clear energy, CalStart/
    AdjStart state, CS1/CS2 read back as the chip's own computation, SoftReset, and SysStatus
    error bits that clear on read (`checksum_error()`)."""

    def __init__(self, energy_per_read=0, ticks=None):
        self.energy_per_read = energy_per_read  # per read, or per 0.1 s when `ticks` is given
        self.ticks = ticks  # a ManualTicks: energy follows the time (a steady load)
        self.t_cleared = ticks.ticks_us() if ticks is not None else 0
        self.energy_cleared = 0
        self.first_read = None  # the start-up read the protocol discards
        self.glitch = {}  # address -> word the next read of it answers once (a misread)
        self.reset()

    def reset(self):
        self.regs = {}
        for r in regs.REGISTERS:
            self.regs[r.address] = r.reset
        self.regs[0x49] = 23000  # 230.00 V
        self.regs[0x4C] = 5000  # 50.00 Hz
        self.regs[0x4A] = 12  # 12 W
        self.regs[0x48] = 52  # 0.052 A: U·I·PF = 11.96 W, consistent with Pmean
        self.regs[0x4D] = 1000  # PF 1.000
        self.last = 0
        self.status = 0  # SysStatus: cleared on read

    def checksum_error(self):
        """An upset in the metering block: CS1 no longer matches; CalErr shows once."""
        self.regs[0x22] ^= 0x0010  # PLconstL
        self.status |= regs.CAL_ERR_MASK

    def spi_transfer(self, mosi):
        is_read = mosi[0] & 0x80
        a = mosi[0] & 0x7F
        value = (mosi[1] << 8) | mosi[2]
        if is_read:
            if a == regs.LAST_DATA:
                v = self.last
            elif a == regs.SYS_STATUS:
                v = self.status
                self.status = 0
            elif a == regs.AT_ENERGY:
                v = self.energy_per_read
                if self.ticks is not None:
                    now = self.ticks.ticks_us()
                    v = v * self.ticks.ticks_diff(now, self.t_cleared) // 100000
                    self.t_cleared = now
                v &= 0xFFFF
                self.energy_cleared += v
                if self.first_read is None:
                    self.first_read = v
            elif a == regs.CS1:
                v = checksum([self.regs[x] for x in regs.METERING_ADDRESSES])
            elif a == regs.CS2:
                v = checksum([self.regs[x] for x in regs.MEASUREMENT_CAL_ADDRESSES])
            elif a in self.glitch:
                v = self.glitch.pop(a)
            else:
                v = self.regs.get(a, 0)
            if a != regs.LAST_DATA:
                self.last = v
            return bytes([0, v >> 8, v & 0xFF])
        if a == regs.SOFT_RESET and value == regs.SOFT_RESET_CODE:
            self.reset()
        elif a in self.regs:
            self.regs[a] = value
        self.last = value
        return bytes([0, 0, 0])


class ManualTicks:
    """A 30-bit tick counter moved by hand (MicroPython's rp2 ticks_us period)."""

    def __init__(self, start=0, bits=30):
        self.mask = (1 << bits) - 1
        self.half = 1 << (bits - 1)
        self.t = start & self.mask

    def ticks_us(self):
        return self.t

    def ticks_diff(self, a, b):
        return ((a - b + self.half) & self.mask) - self.half

    def advance(self, us):
        self.t = (self.t + us) & self.mask


class FakeHardware:
    """`hw` for Firmware on the machine stand-in, with manual ticks."""

    def __init__(self, machine, chips, ticks):
        self.machine = machine
        self.ticks = ticks
        self.uart = machine.UART(0, baudrate=115200)
        self.spi = machine.SPI(0, baudrate=160000, polarity=1, phase=1)
        self.files = {}
        for pin in chips:
            machine.attach(pin, chips[pin])

    def ticks_us(self):
        return self.ticks.ticks_us()

    def ticks_diff(self, a, b):
        return self.ticks.ticks_diff(a, b)

    def sleep_us(self, us):
        self.ticks.advance(us)

    def pin(self, n):
        return self.machine.Pin(n, self.machine.Pin.OUT, value=1)

    def read_file(self, name):
        if name not in self.files:
            raise OSError(2)
        return self.files[name]

    def write_file(self, name, text):
        self.files[name] = text

    def boot_id(self):
        return "5e1f7e57"

    def info(self):
        return {"mcu": "self-test"}


def _lines(uart):
    out = []
    for raw in bytes(uart.sent).split(b"\n"):
        if raw:
            payload = unseal(raw + b"\n")
            assert payload is not None, "line without a valid CRC: %r" % raw
            out.append(payload)
    uart.sent = bytearray()
    return out


def check(cond, what):
    if not cond:
        raise AssertionError(what)


def test_crc():
    check(crc16(b"123456789") == 0x29B1, "CRC-16/CCITT-FALSE check value")


def test_tick_wrap():
    ticks = ManualTicks(start=(1 << 30) - 5000)
    ext = TickExtender(ticks.ticks_us, ticks.ticks_diff)
    total = 0
    step = 400000000  # 400 s, under half the 2**30 µs period
    for _ in range(9 * 10):  # ten hours
        ticks.advance(step)
        total += step
        check(ext.now_us() == total, "tick extension after %d us" % total)
    check(total > 30 * (1 << 30), "many wraps covered")


def test_firmware(machine):
    machine.detach_all()
    ticks = ManualTicks(start=(1 << 30) - 300000)  # wraps during the test
    # a steady 12 W (the Pmean they read): 333 counts per 0.1 s at 3.6 mJ per count
    chips = {17: FakeChip(333, ticks), 20: FakeChip(333, ticks)}
    hw = FakeHardware(machine, chips, ticks)
    cfg = default_config()
    cfg["channels"] = [{"cs": 17}, {"cs": 20}]
    cfg["first_measurement_ms"] = 350
    fw = Firmware(hw, cfg)
    hello = json.loads(_lines(hw.uart)[0])
    check(hello["k"] == "hello" and hello["boot"] == "5e1f7e57", "hello at boot")
    check(hw.spi.polarity == 1 and hw.spi.phase == 1 and hw.spi.baudrate <= 160000, "mode 3")
    n_sweeps = 0
    not_ready = 0
    last_counts = [0, 0]
    for i in range(40):
        if i == 20:
            fw.handle_line(b'{"cmd":"encoding","enc":"compact","id":3}')
        wait = fw.poll()
        ticks.advance(max(wait, 1))
        for payload in _lines(hw.uart):
            if payload.startswith(b"S"):
                n_sweeps += 1
                continue
            msg = json.loads(payload)
            if msg["k"] == "s":
                n_sweeps += 1
                counts = [c["e"] for c in msg["c"]]
                check(counts[0] >= last_counts[0] and counts[1] >= last_counts[1], "monotonic")
                if msg["c"][0].get("fail") == "not_ready":
                    check(n_sweeps <= 4 and "p" not in msg["c"][0], "not ready: no values")
                    not_ready += 1
                else:
                    check(msg["c"][0]["p"] == 12.0 and msg["c"][0]["v"] == 230.0, "values")
                last_counts = counts
    check(n_sweeps >= 30, "sweeps sent: %d" % n_sweeps)
    check(3 <= not_ready <= 4, "first 350 ms not ready (%d sweeps)" % not_ready)
    first = chips[17].first_read
    check(first is not None and fw.chips[0].counts == chips[17].energy_cleared - first,
          "counts = energy read since start")
    # commands: ping, malformed lines, unknown command, bad argument, read, write
    for raw in (b'{"cmd":"ping","id":9}', b"not json", b'{"nocmd":1}', b'{"cmd":"fly"}',
                b'{"cmd":"rate","hz":-3}', b'{"cmd":"read","ch":1,"reg":"Urms","id":4}',
                b'{"cmd":"write","ch":0,"reg":"SagTh","value":7000,"id":5}',
                b'{"cmd":"ping","id":10}*0000'):
        fw.handle_line(raw)
    replies = [json.loads(p) for p in _lines(hw.uart)]
    kinds = [r["k"] for r in replies]
    check(kinds == ["pong", "err", "err", "err", "err", "r", "r", "err"], "replies %r" % kinds)
    check(replies[5]["value"] == 23000, "read Urms")
    check(chips[17].regs[regs.SAG_TH] == 7000, "write SagTh")
    # load a calibration: written to the chip (verified), saved to flash, reported
    from meter.chip.calibration import Calibration

    cal = Calibration.default(1e8)
    cal.set("Ugain", 0x5C3B)
    fw.handle_line(json.dumps({"cmd": "cal", "ch": 1, "calibration": cal.to_dict(),
                               "id": 6}).encode())
    reply = [json.loads(p) for p in _lines(hw.uart) if b'"r"' in p][-1]
    check(reply["id"] == 6 and reply["saved"] and reply["cs2"] == cal.cs2(), "cal reply")
    check(chips[20].regs[0x31] == 0x5C3B, "Ugain written to the chip")
    saved = json.loads(hw.files["epi_meter.json"])
    check(saved["channels"][1]["calibration"]["registers"]["Ugain"] == "0x5C3B", "saved")
    # the stream goes on after malformed commands
    ticks.advance(200000)
    fw.poll()
    check(any(p.startswith(b"S") for p in _lines(hw.uart)), "stream continues")
    # plausibility: a glitched Pmean word is re-read (an event, the reading kept); a chip
    # whose Urms reads 50 V twice is an implausible reading: an event and a fail entry
    fw.handle_line(b'{"cmd":"encoding","enc":"json"}')
    _lines(hw.uart)
    chips[17].glitch[0x4A] = 900
    ticks.advance(200000)
    fw.poll()
    msgs = [json.loads(p) for p in _lines(hw.uart)]
    check([m["kind"] for m in msgs if m["k"] == "ev"] == ["misread"], "re-read event")
    check([m for m in msgs if m["k"] == "s"][-1]["c"][0]["p"] == 12.0, "re-read value")
    chips[17].regs[0x49] = 5000
    ticks.advance(200000)
    fw.poll()
    msgs = [json.loads(p) for p in _lines(hw.uart)]
    events = [m for m in msgs if m["k"] == "ev"]
    check(events and events[0]["kind"] == "implausible" and "voltage 50.00 V" in events[0]["d"],
          "implausible event with the reason")
    entry = [m for m in msgs if m["k"] == "s"][-1]["c"][0]
    check(entry.get("fail") == "implausible" and "p" not in entry, "implausible: no values")
    chips[17].regs[0x49] = 23000
    # an absent chip: an event, a failed entry with the counts, never a 0 reading
    machine.attach(20, _Absent())
    ticks.advance(200000)
    fw.poll()
    msgs = [json.loads(p) for p in _lines(hw.uart)]
    events = [m for m in msgs if m["k"] == "ev"]
    sweeps = [m for m in msgs if m["k"] == "s"]
    check(events and events[0]["kind"] == "absent" and events[0]["n"] == 1, "absent event")
    check(sweeps and sweeps[-1]["c"][1].get("fail") == "absent", "fail entry, no reading")
    check("p" not in sweeps[-1]["c"][1], "no power value for a failed reading")
    # a chip reset: reported, re-initialised, counts kept
    machine.attach(20, chips[20])
    before = fw.chips[0].counts
    chips[17].reset()
    for _ in range(3):
        ticks.advance(2000000)
        fw.poll()
    msgs = [json.loads(p) for p in _lines(hw.uart)]
    check(any(m["k"] == "ev" and m["kind"] == "chip_reset" and m["n"] == 0 for m in msgs),
          "chip reset event")
    check(fw.chips[0].counts >= before, "counts kept across a chip reset")
    # a CS1 checksum error whose SysStatus bits clear on read: acted on at the first read
    # (CS1 read back differs from the calibration's), the calibration re-loaded, values again
    _lines(hw.uart)
    chips[17].checksum_error()
    ticks.advance(200000)
    fw.poll()
    msgs = [json.loads(p) for p in _lines(hw.uart)]
    events = [m for m in msgs if m["k"] == "ev" and m["kind"] != "unmetered"]
    check([(m["kind"], m["n"]) for m in events] == [("checksum_error", 0)]
          and "CS1" in events[0]["d"], "checksum error event")
    check([(m["n"], m["t1"] > m["t0"]) for m in msgs if m["k"] == "ev"
           and m["kind"] == "unmetered"] == [(0, True)], "checksum error: unmetered declared")
    check([m for m in msgs if m["k"] == "s"][-1]["c"][0].get("fail") == "checksum_error",
          "checksum error: no values")
    check(chips[17].regs[0x22] == fw.chips[0].calibration.get("PLconstL"), "re-loaded")
    for _ in range(3):
        ticks.advance(200000)
        fw.poll()
    msgs = [json.loads(p) for p in _lines(hw.uart)]
    check([m for m in msgs if m["k"] == "s"][-1]["c"][0].get("p") == 12.0, "values again")
    return n_sweeps


class _Absent:
    def spi_transfer(self, mosi):
        return b"\xff\xff\xff"


def test_hardware(machine):
    """meter.firmware.hw on the `machine` module it is given (MicroPython only: it needs
    time.ticks_us): SPI mode 3 at <= 160 kHz, CS pins idle high, UART at the config's baud."""
    machine.detach_all()
    from meter.firmware.hw import McuHardware

    cfg = default_config()
    hw = McuHardware(cfg)
    check(hw.spi.polarity == 1 and hw.spi.phase == 1, "SPI mode 3")
    check(hw.spi.baudrate == 160000 and hw.spi.firstbit == machine.SPI.MSB, "160 kHz MSB")
    check(hw.uart.baudrate == 115200, "UART baud")
    check(hw.pin(17).value() == 1, "CS idle high")
    check(len(hw.boot_id()) == 8, "boot id")
    t0 = hw.ticks_us()
    check(hw.ticks_diff(hw.ticks_us(), t0) >= 0, "ticks")
    check(hw.info()["mcu"] == "RP2350", "info")


def test_calibration_record():
    """The calibration record round trip (f-strings, classmethods) on this interpreter."""
    from meter.chip.calibration import Calibration
    from meter.firmware.config import channel_calibration

    cal = Calibration.default(1e8)
    cal.set("Ugain", 0x5C3B)
    back, source = channel_calibration({"calibration": cal.to_dict()})
    check(source == "flash" and back.get("Ugain") == 0x5C3B, "calibration from flash")
    check(back.cs1() == cal.cs1() and back.cs2() == cal.cs2(), "checksums")
    bad = cal.to_dict()
    bad["registers"]["Ugain"] = "0x9000"  # bit 15 set: refused, design values used
    back, source = channel_calibration({"calibration": bad})
    check(source.startswith("design values (flash record rejected"), source)


def run(machine):
    import sys

    test_crc()
    test_tick_wrap()
    test_calibration_record()
    n = test_firmware(machine)
    if sys.implementation.name == "micropython":
        test_hardware(machine)
    print("SELFTEST OK %d on %s" % (n, sys.implementation.name))
    return n
