"""`epi meter run` for a bridge board (`bus = "bridge"`) or `--emulate-bridge`.

Called by meter.daemon.service.MeterDaemon.run instead of the SPI sampler. Same trace
directory, lock, segments and meta.json as direct SPI, with `bus: "bridge"` in `board`,
`bridge: {...}` (firmware hello, link, clock mapping, counters) and `bridged: true`.

Links: a real board's serial port (`SerialLink`); `--emulate-bridge` on the system clock runs
the firmware in a thread behind a pseudo-terminal (`PtyBridge`) and opens its other end with
the same `SerialLink`; on a SimulatedClock (tests, benchmarks) the in-process `SimLink`.
"""

from __future__ import annotations

import contextlib
import os
import socket
from pathlib import Path
from typing import Any

from epi import __version__
from epi.core.errors import UserError
from meter.board import BoardConfig, emulated_board, load_board
from meter.bridge.board import BridgeConfig
from meter.bridge.emulate import EmulatedBoard, PtyBridge, SimLink
from meter.bridge.faults import FaultyLink, parse_bridge_faults
from meter.bridge.link import SerialLink
from meter.bridge.recorder import BridgeRecorder
from meter.daemon.trace import TraceLock, TraceWriter

DEFAULT_EMULATED_RATE_HZ = 10.0


def is_bridge_run(options: Any) -> bool:
    """Whether MeterDaemon should run the bridge (a bridge board, or --emulate-bridge)."""
    if getattr(options, "emulate_bridge", False):
        return True
    if options.board_path is None:
        return False
    return load_board(options.board_path).bridge is not None


def run_bridge(daemon: Any) -> Any:
    """Run the bridge recorder for a MeterDaemon; returns its RunResult."""
    from meter.daemon.service import RunResult, clock_boot_id

    o = daemon.options
    clock = daemon.clock
    if o.duration_s is not None and not o.duration_s > 0:
        raise UserError(f"--duration {o.duration_s:g}: must be > 0 seconds")
    emulate = bool(getattr(o, "emulate_bridge", False)) or o.emulate
    board: BoardConfig
    if o.board_path is not None:
        board = load_board(o.board_path)
    else:
        board = emulated_board(o.n_emulated_channels, clock=clock)
    cfg: BridgeConfig = board.bridge or BridgeConfig(  # type: ignore[assignment]
        port="(emulated)", baud=115200, encoding="json",
        rate_hz=o.rate_hz or DEFAULT_EMULATED_RATE_HZ)
    rate = o.rate_hz or cfg.rate_hz
    faults, chip_faults = parse_bridge_faults(o.faults) if o.faults else ([], [])
    if (faults or chip_faults) and not emulate:
        raise UserError("--fault-injection: bridge faults are injected into the emulated board "
                        "only (add --emulate-bridge)")
    lock = TraceLock(o.out_dir)
    pty: PtyBridge | None = None
    emu: EmulatedBoard | None = None
    writer: TraceWriter | None = None
    recorder: BridgeRecorder | None = None
    try:
        enabled = [c for c in board.channels if c.enabled]
        if emulate:
            models = _models(o, board, clock, len(board.channels))
            emu = EmulatedBoard(clock, models, baud=cfg.baud, rate_hz=rate or 10.0,
                                encoding=cfg.encoding or "json",
                                model_spi_time=bool(getattr(clock, "simulated", False)))
            if getattr(clock, "simulated", False):
                link: Any = SimLink(emu, cfg.baud)
            else:
                pty = PtyBridge(emu).start()
                link = SerialLink(pty.port, cfg.baud)
            if faults or chip_faults:
                link = FaultyLink(link, clock, faults, board=pty or emu, chip_faults=chip_faults)
        else:
            link = SerialLink(cfg.port, cfg.baud)
        url = None
        if o.listen:
            server, hub, state = _server(o.listen, enabled, clock)
            daemon.server = server
            url = server.url
        started = (clock.monotonic_ns(), clock.realtime_ns())
        meta = {
            "daemon_version": __version__,
            "host": socket.gethostname(),
            "boot_id": clock_boot_id(clock),
            "pid": os.getpid(),
            "started_mono_ns": started[0],
            "started_real_ns": started[1],
            "emulated": emulate,
            "bridged": True,
            "power_model": _power_model(emu) if emu else None,
            "sample_period_s": 1.0 / rate if rate else None,
            "channels": [{"channel": c.index, "name": c.name, "node": c.node,
                          "meter_constant_imp_per_kwh": None, "ct": None,
                          "calibration": {"source": "MCU flash (see bridge.firmware)"},
                          "bus": {"kind": "bridge"}, "emulated": emulate}
                         for c in enabled],
            "board": {**board.describe(), "bus": "bridge", "bridge": cfg.describe()},
            "clock": clock.describe() if hasattr(clock, "describe") else {},
            "listen": url,
            "fault_injection": [f.describe() for f in faults]
            + [f.describe() for f in chip_faults] or None,
            "emulated_mcu": emu.describe() if emu else None,
            "stats": {"clean_stop": False},
            **o.extra_meta,
        }
        writer = TraceWriter(o.out_dir, meta, lock=lock)
        daemon._write_restart_gap(writer, started)
        where = link.describe().get("port") or link.describe()["kind"]
        writer.write_event(started[0], started[1], None, "start",
                           f"epi meter {__version__}: bridge on {where} at {cfg.baud} baud; "
                           f"segment {writer.segment}")
        recorder = BridgeRecorder(link, clock, writer, baud=cfg.baud,
                                  channels=[c.index for c in enabled], rate_hz=rate,
                                  encoding=cfg.encoding, log=daemon.log,
                                  wire_time=pty is None)
        daemon.sampler = recorder  # MeterDaemon.stop() reaches it
        if daemon.server is not None:
            names = {c.index: c.name for c in enabled}

            def publish(msg: dict) -> None:
                msg["name"] = names.get(msg["channel"], str(msg["channel"]))
                state.record_sample(msg)
                hub.publish(msg)

            recorder.on_sample = publish
            recorder.on_fault = state.record_fault
            state.info.update({"daemon_version": __version__, "bridged": True,
                               "host": meta["host"], "boot_id": meta["boot_id"],
                               "clock_kind": meta["clock"].get("kind", "system"),
                               "emulated": emulate, "segment": writer.segment,
                               "sample_period_s": meta["sample_period_s"],
                               "started_real_ns": started[1],
                               "trace_dir": str(Path(o.out_dir).resolve())})
            daemon.server.start()
        if daemon._stop.is_set():
            recorder.stop()
        daemon.ready.set()
        daemon.log(f"epi meter: bridge {'(emulated MCU) ' if emulate else ''}on {where} at "
                   f"{cfg.baud} baud into {o.out_dir} segment {writer.segment}"
                   + (f"; serving {url}" if url else ""))
        stats = recorder.run(o.duration_s)
        now = (clock.monotonic_ns(), clock.realtime_ns())
        writer.write_event(now[0], now[1], None, "stop",
                           f"clean stop: {stats.sweeps} sweeps, {stats.samples_written} samples, "
                           f"{stats.lost_lines} lines lost, {stats.bad_crc} bad CRC, "
                           f"{stats.mcu_resets} MCU resets, {stats.reconnects} reconnects")
        writer.close(stats={"clean_stop": True, "ended_mono_ns": now[0], "ended_real_ns": now[1],
                            "samples_written": stats.samples_written, **stats.as_dict()})
        daemon.log(f"epi meter: stopped: {stats.sweeps} sweeps, {stats.samples_written} samples")
        return RunResult(Path(o.out_dir), writer.segment, stats, None, rate or 0.0)  # type: ignore[arg-type]
    except BaseException:
        # a crash, or the trace directory removed under us (TraceLostError): keep the
        # statistics, flagged as not a clean stop, where the files can still be written
        if writer is not None:
            with contextlib.suppress(OSError):
                writer.close(stats={"clean_stop": False,
                                    **(recorder.stats.as_dict() if recorder else {})})
        raise
    finally:
        if daemon.server is not None:
            daemon.server.stop()
        if pty is not None:
            pty.stop()
        lock.release()


def _server(listen: str, channels: list[Any], clock: Any) -> tuple[Any, Any, Any]:
    """The daemon's HTTP endpoints (clock sync, live stream, /metrics, /status)."""
    from meter.daemon.http_server import MeterServer, parse_listen
    from meter.daemon.live_stream import LiveHub
    from meter.daemon.metrics import ChannelInfo, MeterState

    host, port = parse_listen(listen)
    state = MeterState([ChannelInfo(c.index, c.name, c.node) for c in channels], {})
    hub = LiveHub()
    return MeterServer(host, port, state=state, hub=hub, clock=clock), hub, state


def _models(o: Any, board: BoardConfig, clock: Any, n: int) -> list[Any]:
    from meter.board import _default_models

    if o.power_model is None:
        models = [c.power_model for c in board.channels]
        if any(m is None for m in models):
            return _default_models(n, clock)
        return models
    if isinstance(o.power_model, (list, tuple)):
        if len(o.power_model) != n:
            raise UserError(f"{len(o.power_model)} power models for {n} channels")
        return list(o.power_model)
    return [o.power_model] * n


def _power_model(emu: EmulatedBoard) -> dict:
    models = emu.models
    if all(m is models[0] for m in models):
        return models[0].describe()  # type: ignore[no-any-return]
    return {"kind": "per_channel", "modelled": True,
            "channels": {str(i): m.describe() for i, m in enumerate(models)}}
