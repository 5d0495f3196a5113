"""Telemetry lines, commands, the clock mapping and the tick extension, checked against
independent references: CRC against binascii.crc_hqx, encodings against each other and
against the register codecs' own inverse, the mapping against an injected true clock.
Readers get generated hostile input (hypothesis)."""

from __future__ import annotations

import binascii
import json
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from meter.bridge.clockmap import ClockMapper
from meter.bridge.protocol import LineError, Message, Sweep, command, decode_line
from meter.chip import registers as regs
from meter.firmware import telemetry
from meter.firmware.crc import crc16, seal, unseal
from meter.firmware.mcutime import TickExtender


@settings(deadline=None)  # a loaded CI machine must not fail a correct test
@given(st.binary(max_size=400))
def test_crc_is_crc16_ccitt_false(data: bytes) -> None:
    assert crc16(data) == binascii.crc_hqx(data, 0xFFFF)


@settings(deadline=None)  # a loaded CI machine must not fail a correct test
@given(st.binary(max_size=300))
def test_the_line_reader_never_crashes_on_garbage(data: bytes) -> None:
    try:
        out = decode_line(data)
    except LineError:
        return
    assert isinstance(out, (Sweep, Message))


@settings(deadline=None)  # a loaded CI machine must not fail a correct test
@given(st.binary(min_size=1, max_size=200), st.integers(0, 7), st.data())
def test_any_single_bit_flip_is_caught_by_the_crc(payload: bytes, bit: int, data) -> None:
    line = seal(payload)
    i = data.draw(st.integers(0, len(line) - 2))  # not the newline
    bad = bytearray(line)
    bad[i] ^= 1 << bit
    assert unseal(bytes(bad)) is None or bytes(bad) == line


_word = st.integers(0, 0xFFFF)
_reading = st.tuples(st.integers(0, 0xFFFF), st.integers(0, 30000),
                     st.tuples(_word, st.integers(0, 255).map(lambda b: b << 8), _word, _word,
                               _word, _word))
_channel = st.tuples(st.integers(0, 0x3F), st.integers(0, (1 << 48) - 1),  # bit 6: not ready
                     st.one_of(st.none(), st.just("absent"), st.just("not_ready"), _reading))


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(0, 2**64 - 1), st.lists(_channel, max_size=6))
def test_compact_and_json_sweeps_decode_to_the_same_readings(seq: int, t_us: int,
                                                             chans: list) -> None:
    c = decode_line(telemetry.sweep_compact(seq, t_us, chans))
    j = decode_line(telemetry.sweep_json(seq, t_us, chans))
    assert isinstance(c, Sweep) and isinstance(j, Sweep)
    assert (c.seq, c.t_us) == (j.seq, j.t_us) == (seq, t_us)
    for (ch, counts, reading), rc, rj in zip(chans, c.channels, j.channels, strict=True):
        assert rc.channel == rj.channel == ch
        assert rc.counts == rj.counts == counts  # cumulative counts travel exactly
        if reading is None or isinstance(reading, str):
            assert rc.fail and rj.fail and rc.power_w is None and rj.power_w is None
            # not ready (before a chip's first measurement) is told apart in both encodings
            assert (rc.fail == "not_ready") == (rj.fail == "not_ready") == (reading == "not_ready")
            continue
        status, offset, raw = reading
        assert rc.status == rj.status == status and rc.offset_us == rj.offset_us == offset
        # the register's own inverse: Pmean words -> W -> words again
        assert regs.split_extended(rc.power_w, regs.BY_ADDRESS[0x4A]) == (raw[0], raw[1])
        assert rj.power_w == pytest.approx(rc.power_w, abs=6e-5)
        assert rj.voltage_v == pytest.approx(raw[2] * 0.01, abs=1e-9)
        assert rc.frequency_hz == pytest.approx(raw[5] * 0.01)


def test_compact_is_much_shorter_than_json() -> None:
    chans = [(i, 123456789, (0, 3000 * i, (12, 0x4500, 23000, 53, 0x03E8, 5000)))
             for i in range(4)]
    assert len(telemetry.sweep_compact(1, 2, chans)) < 0.45 * len(telemetry.sweep_json(1, 2,
                                                                                         chans))


def test_truncated_compact_record_is_a_parse_error() -> None:
    line = telemetry.sweep_compact(1, 2, [(0, 5, (0, 1, (1, 0, 2, 3, 4, 5)))])
    payload = unseal(line)
    assert payload is not None
    short = seal(b"S" + binascii.b2a_base64(binascii.a2b_base64(payload[1:])[:-3]).strip())
    with pytest.raises(LineError) as exc:
        decode_line(short)
    assert exc.value.kind == "parse"


def test_commands_are_sealed_json() -> None:
    line = command("ping", id=3)
    payload = unseal(line)
    assert payload is not None and json.loads(payload) == {"cmd": "ping", "id": 3}


class _Ticks:
    def __init__(self, bits: int = 30) -> None:
        self.mask = (1 << bits) - 1
        self.half = 1 << (bits - 1)
        self.true_us = 987_654_321

    def ticks_us(self) -> int:
        return self.true_us & self.mask

    def ticks_diff(self, a: int, b: int) -> int:
        return ((a - b + self.half) & self.mask) - self.half


@settings(deadline=None)  # a loaded CI machine must not fail a correct test
@given(st.lists(st.integers(0, (1 << 29) - 1), min_size=1, max_size=200))
def test_tick_extension_counts_past_every_wrap(steps: list[int]) -> None:
    """Hours of MCU time in steps under half the 2**30 µs tick period: never loses a µs."""
    t = _Ticks()
    ext = TickExtender(t.ticks_us, t.ticks_diff)
    start = t.true_us
    for s in steps:
        t.true_us += s
        assert ext.now_us() == t.true_us - start


def _exchange(rng: random.Random, t_pi_ns: int, drift_ppm: float, offset_us: float,
              base_ns: int) -> tuple[int, int, int, float]:
    """A ping with jittered latency in both directions; returns (send, mcu_us, recv, truth)."""
    up = 2_000_000 + rng.expovariate(1 / 3e6) + rng.uniform(0, 12e6)  # wire + poll + jitter
    down = 4_000_000 + rng.expovariate(1 / 3e6) + (rng.random() < 0.3) * 34e6  # queued line
    t_mcu_pi = t_pi_ns + up
    mcu_us = offset_us + (t_mcu_pi - base_ns) * (1 + drift_ppm * 1e-6) / 1000
    return t_pi_ns, round(mcu_us), round(t_mcu_pi + down), t_mcu_pi


def test_clock_mapping_recovers_drift_and_offset_within_1ms() -> None:
    rng = random.Random(4)
    mapper = ClockMapper()
    base, drift, off = 10 * 10**9, 50.0, 3.2e9
    truth = []
    for k in range(600):  # ten minutes, one ping a second
        s, m, r, t_true = _exchange(rng, base + k * 10**9, drift, off, base)
        mapper.add(s, m, r, wire_req_ns=2_000_000, wire_reply_ns=4_000_000)
        truth.append((m, t_true))
    mp = mapper.fit()
    assert mp is not None and mp.drift_fitted
    assert mp.drift_ppm == pytest.approx(drift, abs=2.0)
    worst = max(abs(mp.to_mono_ns(m) - t) for m, t in truth[-120:])
    assert worst < 1_000_000, worst
    assert mp.uncertainty_ns < 2_000_000


def test_without_enough_span_the_drift_is_not_guessed() -> None:
    mapper = ClockMapper()
    mapper.add(0, 1000, 2_000_000)
    mp = mapper.fit()
    assert mp is not None and not mp.drift_fitted and mp.slope_ns_per_us == 1000.0
