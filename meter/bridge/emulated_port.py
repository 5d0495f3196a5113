"""An emulated board behind a serial port URL: `serve_board(board, baud)` → `emumcu://NAME`.

The far end is the board's wire (`SimLink`: 8N1 timing, the MCU's transmit buffer, optional
host latency), wrapped in `FaultyLink` when UART or chip faults are scheduled; the port is
registered with the `emumcu://` pyserial handler (meter/emulation/protocol_emumcu.py), so the
recorder reads it through `SerialLink` exactly as a real port. `idle_until` lets the MCU run
while the recorder waits for a lost port to come back (its output goes nowhere meanwhile).
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Sequence
from dataclasses import dataclass

from meter.bridge.emulate import EmulatedBoard, SimLink
from meter.bridge.faults import FaultyLink, UartFault
from meter.emulation.faults import FaultSpec
from meter.emulation.protocol_emumcu import register_port, unregister_port

_names = itertools.count(1)


@dataclass
class EmulatedPort:
    url: str
    name: str
    end: SimLink | FaultyLink

    def idle_until(self, t_mono_ns: int) -> None:
        self.end.idle_until(t_mono_ns)

    def close(self) -> None:
        unregister_port(self.name)


def serve_board(board: EmulatedBoard, baud: int, uart_faults: Sequence[UartFault] = (),
                chip_faults: Sequence[FaultSpec] = (), *, jitter_mean_ns: int = 0,
                seed: int = 0) -> EmulatedPort:
    """Register `board` as a new `emumcu://` port (faults injected on its wire)."""
    end: SimLink | FaultyLink = SimLink(board, baud, jitter_mean_ns=jitter_mean_ns, seed=seed)
    if uart_faults or chip_faults:
        end = FaultyLink(end, board.clock, list(uart_faults), board=board,
                         chip_faults=list(chip_faults), seed=seed)
    name = f"board-{os.getpid()}-{next(_names)}"
    return EmulatedPort(register_port(name, end), name, end)
