"""`epi meter run` for a bridge board (`bus = "bridge"`) or `--emulate-bridge`.

Chosen by meter.daemon.service.MeterDaemon.run instead of the SPI sampler; both feed the same
`RecordingSession` (lock, segments, meta.json, restart gaps, HTTP state, checkpoints). The
bridge adds `bus: "bridge"` in `board`, `bridge: {...}` (firmware hello, link, clock mapping,
counters) and `bridged: true`.

Links: a real board's serial port, or `--emulate-bridge`'s firmware behind an `emumcu://` port
(meter/bridge/emulated_port.py; faults injected on its wire): both opened by the same
`SerialLink` through pyserial, on the system clock or a SimulatedClock.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from epi.core.errors import UserError
from meter.board.channels import emulated_board, load_board
from meter.board.config import BoardConfig, BridgeConfig, ChannelConfig
from meter.bridge.capacity import link_capacity_hz, widest_sweep_line_bytes
from meter.bridge.emulate import EmulatedBoard
from meter.bridge.emulated_port import EmulatedPort, serve_board
from meter.bridge.faults import FaultyLink, UartFault, parse_bridge_faults
from meter.bridge.link import SerialLink
from meter.bridge.recorder import BridgeRecorder
from meter.chip_factory import power_models_for
from meter.clock import Clock, is_simulated
from meter.daemon.metrics import ChannelInfo
from meter.daemon.options import DaemonOptions, RunResult
from meter.emulation.faults import FaultSpec
from meter.emulation.power_models import PowerModel
from meter.recording.session import RecordingSession

DEFAULT_EMULATED_RATE_HZ = 10.0
EMULATED_PORT = "(emulated)"


def is_bridge_run(options: DaemonOptions) -> bool:
    """Whether MeterDaemon should run the bridge (a bridge board, or --emulate-bridge)."""
    if options.emulate_bridge:
        return True
    if options.board_path is None:
        return False
    return load_board(options.board_path).bridge is not None


@dataclass
class BridgePlan:
    """A bridge run as asked, checked before the trace directory is touched."""

    options: DaemonOptions
    clock: Clock
    board: BoardConfig
    bridge: BridgeConfig
    rate_hz: float | None
    emulate: bool
    uart_faults: list[UartFault]
    chip_faults: list[FaultSpec]
    seed: int = 0  # the emulated board's random faults (chip bit errors, the link's jitter)

    @property
    def enabled(self) -> list[ChannelConfig]:
        return [c for c in self.board.channels if c.enabled]


def prepare_bridge(o: DaemonOptions, clock: Clock) -> BridgePlan:
    """The board, link settings, rate and faults of a bridge run; UserError on any problem."""
    emulate = o.emulate_bridge or o.emulate
    if o.board_path is not None:
        board = load_board(o.board_path)
    else:
        board = emulated_board(o.n_emulated_channels, clock=clock)
    cfg = board.bridge or BridgeConfig(port=EMULATED_PORT, encoding="json",
                                       rate_hz=o.rate_hz or DEFAULT_EMULATED_RATE_HZ)
    uart_faults, chip_faults = parse_bridge_faults(o.faults) if o.faults else ([], [])
    if (uart_faults or chip_faults) and not emulate:
        raise UserError("--fault-injection: bridge faults are injected into the emulated board "
                        "only (add --emulate-bridge)")
    rate = o.rate_hz or cfg.rate_hz
    if rate is not None:
        check_link_rate(rate, cfg, len(board.channels),
                        "--rate" if o.rate_hz is not None else f"{board.path}: bridge.rate_hz")
    return BridgePlan(o, clock, board, cfg, rate, emulate, uart_faults, chip_faults)


def check_link_rate(rate_hz: float, cfg: BridgeConfig, n_channels: int, where: str) -> None:
    """Refuse a sweep rate the serial link cannot carry (meter/bridge/capacity.py)."""
    encoding = cfg.encoding or "json"  # the firmware's default encoding
    limit = link_capacity_hz(cfg.baud, encoding, n_channels)
    if rate_hz > limit:
        size = widest_sweep_line_bytes(encoding, n_channels)
        hint = (" (or encoding = \"compact\")" if encoding == "json" else "")
        raise UserError(
            f"{where}: {rate_hz:g} Hz is more than the link carries: {cfg.baud} baud moves "
            f"{cfg.baud // 10} bytes/s, {limit:.1f} {encoding} sweep lines/s of up to {size} "
            f"bytes for {n_channels} channel(s); lower the rate or raise bridge.baud{hint}")


def run_bridge(plan: BridgePlan, session: RecordingSession) -> RunResult:
    """Record the MCU's telemetry into the session's trace; returns the run's result."""
    o, clock, cfg, enabled = plan.options, plan.clock, plan.bridge, plan.enabled
    port: EmulatedPort | None = None
    emu: EmulatedBoard | None = None
    try:
        if plan.emulate:  # the firmware behind an emumcu:// port, read through pyserial
            models = power_models_for(o.power_model, [c.power_model for c in plan.board.channels],
                                      clock)
            emu = EmulatedBoard(clock, list(models), baud=cfg.baud,
                                rate_hz=plan.rate_hz or DEFAULT_EMULATED_RATE_HZ,
                                encoding=cfg.encoding or "json",
                                model_spi_time=is_simulated(clock), seed=plan.seed)
            port = serve_board(emu, cfg.baud, plan.uart_faults, plan.chip_faults,
                               seed=plan.seed)
        link = SerialLink(port.url if port is not None else cfg.port, cfg.baud)
        url = session.serve(o.listen, [ChannelInfo(c.index, c.name, c.node) for c in enabled])
        meta = _meta(plan, emu)
        if port is not None and isinstance(port.end, FaultyLink):
            # fault specs count from here (FaultyLink.t0): where the soak places them
            meta["fault_schedule_start_mono_ns"] = port.end.t0
        described = link.describe()
        where = described.get("port") or described.get("kind")
        writer = session.begin(meta, f"bridge on {where} at {cfg.baud} baud")
        recorder = BridgeRecorder(link, clock, writer, baud=cfg.baud,
                                  channels=[c.index for c in enabled], rate_hz=plan.rate_hz,
                                  encoding=cfg.encoding, log=session.log,
                                  idle_until=port.idle_until if port is not None else None)
        names = {c.index: c.name for c in enabled}
        state, hub = session.state, session.hub

        def publish(msg: dict[str, object]) -> None:
            channel = msg["channel"]
            msg["name"] = names.get(channel, str(channel)) if isinstance(channel, int) else "?"
            state.record_sample(msg)
            hub.publish(msg)

        recorder.on_sample = publish
        # a fault on no channel is the link's (a bad line), not a failed read of every one
        recorder.on_fault = lambda channel, kind: state.record_fault(
            channel, kind, down=channel is not None)
        recorder.on_sweep = lambda: state.record_sweep(late=False, skipped=0, jitter={})
        session.attach(recorder)
        session.log(f"epi meter: bridge {'(emulated MCU) ' if plan.emulate else ''}on {where} "
                    f"at {cfg.baud} baud into {o.out_dir} segment {writer.segment}"
                    + (f"; serving {url}" if url else ""))
        stats = recorder.run(
            o.duration_s,
            stats_callback=lambda rec: session.save_stats(rec.stats, bridge=rec.describe()))
        if port is not None and isinstance(port.end, FaultyLink) and \
                port.end.chip_injector is not None:  # when each chip fault acted (the soak)
            writer.update_meta(fault_applied=list(port.end.chip_injector.applied))
        session.finish(stats, f"{stats.sweeps} sweeps, {stats.samples_written} samples, "
                       f"{stats.lost_lines} lines lost, {stats.bad_crc} bad CRC, "
                       f"{stats.mcu_resets} MCU resets, {stats.reconnects} reconnects",
                       bridge=recorder.describe())
        session.log(f"epi meter: stopped: {stats.sweeps} sweeps, "
                    f"{stats.samples_written} samples")
        return RunResult(Path(o.out_dir), writer.segment, stats, url, plan.rate_hz or 0.0)
    finally:
        if port is not None:
            port.close()


def _meta(plan: BridgePlan, emu: EmulatedBoard | None) -> dict[str, object]:
    """The keys of a bridge segment's meta.json beside the session's common ones."""
    o, cfg = plan.options, plan.bridge
    faults = [f.describe() for f in plan.uart_faults] + [f.describe() for f in plan.chip_faults]
    return {
        "emulated": plan.emulate,
        "bridged": True,
        "power_model": _power_model(emu.models) if emu else None,
        "sample_period_s": 1.0 / plan.rate_hz if plan.rate_hz else None,
        "channels": [{"channel": c.index, "name": c.name, "node": c.node,
                      "ct": None,
                      "calibration": {"source": "MCU flash (see bridge.firmware)"},
                      "bus": {"kind": "bridge"}, "emulated": plan.emulate}
                     for c in plan.enabled],
        "board": {**plan.board.describe(), "bus": "bridge", "bridge": cfg.describe()},
        "fault_injection": faults or None,
        "emulated_mcu": emu.describe() if emu else None,
        **o.extra_meta,
    }


def _power_model(models: list[PowerModel]) -> dict[str, object]:
    if all(m is models[0] for m in models):
        return models[0].describe()
    return {"kind": "per_channel", "modelled": True,
            "channels": {str(i): m.describe() for i, m in enumerate(models)}}
