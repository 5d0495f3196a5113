"""NVIDIA GPUs through NVML, called with ctypes on ``libnvidia-ml.so.1`` (no Python package).

One channel per GPU. Where the GPU has it (Volta and later) the channel is the total energy
counter, ``nvmlDeviceGetTotalEnergyConsumption`` (mJ since the driver loaded); otherwise the
power reading ``nvmlDeviceGetPowerUsage`` (mW), integrated over the sample times. Both update
every 100 ms on an H100 and one energy call costs about 3.8 ms there, so the source never polls
faster than 10 Hz and runs on its own thread, never delaying the wall meter's sweeps.

``NvmlBinding`` is the seam: it takes any object with the NVML C functions as attributes (a
``ctypes.CDLL`` in real use, a fake in tests) and does all the ``ctypes`` work.
"""

from __future__ import annotations

import contextlib
import ctypes

from epi.formats.trace import EventKind
from meter.sources.common import ChannelSpec, PowerSource, SourceError

LIBRARY = "libnvidia-ml.so.1"
NVML_SUCCESS = 0
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_GPU_IS_LOST = 15
NVML_MIN_INTERVAL_S = 0.1  # the counters update every 100 ms (measured on an H100)
MEASURES = ("the whole GPU board as NVML reports it (GPU, its memory, VRMs on the board); "
            "not the host CPU, host memory or the power supply's losses")


class NvmlError(Exception):
    def __init__(self, function: str, code: int, text: str) -> None:
        super().__init__(f"{function} failed: NVML error {code} ({text})")
        self.function, self.code, self.text = function, code, text


class NvmlBinding:
    """The few NVML calls epi makes, each checked; ``lib`` has the C functions."""

    def __init__(self, lib: ctypes.CDLL) -> None:
        self.lib = lib

    @classmethod
    def load(cls) -> NvmlBinding:
        try:
            return cls(ctypes.CDLL(LIBRARY))
        except OSError as exc:
            raise SourceError(EventKind.READ_ERROR, f"NVML: cannot load {LIBRARY} ({exc})",
                              "install the NVIDIA driver (it ships libnvidia-ml)") from None

    def _check(self, function: str, code: int) -> None:
        if code != NVML_SUCCESS:
            text = "unknown"
            try:
                fn = self.lib.nvmlErrorString
                fn.restype = ctypes.c_char_p
                raw = fn(code)
                text = raw.decode() if isinstance(raw, bytes) else str(raw)
            except (AttributeError, OSError):
                pass
            raise NvmlError(function, code, text)

    def init(self) -> None:
        self._check("nvmlInit_v2", self.lib.nvmlInit_v2())

    def shutdown(self) -> None:
        self._check("nvmlShutdown", self.lib.nvmlShutdown())

    def device_count(self) -> int:
        n = ctypes.c_uint(0)
        self._check("nvmlDeviceGetCount_v2", self.lib.nvmlDeviceGetCount_v2(ctypes.byref(n)))
        return int(n.value)

    def handle(self, index: int) -> ctypes.c_void_p:
        h = ctypes.c_void_p()
        self._check("nvmlDeviceGetHandleByIndex_v2",
                    self.lib.nvmlDeviceGetHandleByIndex_v2(ctypes.c_uint(index), ctypes.byref(h)))
        return h

    def name(self, handle: ctypes.c_void_p) -> str:
        buf = ctypes.create_string_buffer(96)
        self._check("nvmlDeviceGetName", self.lib.nvmlDeviceGetName(handle, buf, ctypes.c_uint(96)))
        return buf.value.decode(errors="replace")

    def total_energy_mj(self, handle: ctypes.c_void_p) -> int:
        e = ctypes.c_ulonglong(0)
        self._check("nvmlDeviceGetTotalEnergyConsumption",
                    self.lib.nvmlDeviceGetTotalEnergyConsumption(handle, ctypes.byref(e)))
        return int(e.value)

    def power_mw(self, handle: ctypes.c_void_p) -> int:
        p = ctypes.c_uint(0)
        self._check("nvmlDeviceGetPowerUsage",
                    self.lib.nvmlDeviceGetPowerUsage(handle, ctypes.byref(p)))
        return int(p.value)


def _as_source_error(exc: NvmlError, what: str) -> SourceError:
    if exc.code == NVML_ERROR_NO_PERMISSION:
        return SourceError(EventKind.PERMISSION_DENIED, f"NVML {what}: {exc}",
                           "run as a user in the video group or as root")
    if exc.code == NVML_ERROR_GPU_IS_LOST:
        return SourceError(EventKind.READ_ERROR, f"NVML {what}: {exc}",
                           "the GPU fell off the bus: check `nvidia-smi` and dmesg, reset it")
    return SourceError(EventKind.READ_ERROR, f"NVML {what}: {exc}", "check `nvidia-smi`")


class NvmlSource(PowerSource):
    """One channel per GPU: its energy counter where supported, else its power reading."""

    kind = "nvml"
    min_interval_s = NVML_MIN_INTERVAL_S

    def __init__(self, binding: NvmlBinding | None = None) -> None:
        self.nvml = binding if binding is not None else NvmlBinding.load()
        try:
            self.nvml.init()
            count = self.nvml.device_count()
        except NvmlError as exc:
            raise _as_source_error(exc, "init") from None
        if count == 0:
            raise SourceError(EventKind.READ_ERROR, "NVML: no GPU", "check `nvidia-smi`")
        self._specs: list[ChannelSpec] = []
        self._reads: list[tuple[ctypes.c_void_p, bool]] = []  # (handle, has energy counter)
        for i in range(count):
            try:
                h = self.nvml.handle(i)
                name = self.nvml.name(h)
            except NvmlError as exc:
                raise _as_source_error(exc, f"GPU {i}") from None
            try:
                self.nvml.total_energy_mj(h)
                energy = True
            except NvmlError as exc:
                if exc.code != NVML_ERROR_NOT_SUPPORTED:
                    raise _as_source_error(exc, f"GPU {i} energy") from None
                energy = False
                try:
                    self.nvml.power_mw(h)
                except NvmlError as exc2:
                    raise _as_source_error(exc2, f"GPU {i} power") from None
            self._specs.append(ChannelSpec(
                source="nvml", name=f"nvml:gpu{i}", scope="gpu",
                counter="energy" if energy else "power",
                resolution_j=1e-3 if energy else None, resolution_w=None if energy else 1e-3,
                measures=MEASURES, path=f"GPU {i}",
                extra={"device": name, "index": i,
                       "nvml_call": "nvmlDeviceGetTotalEnergyConsumption" if energy
                       else "nvmlDeviceGetPowerUsage (integrated over sample times)"},
            ))
            self._reads.append((h, energy))

    def channels(self) -> list[ChannelSpec]:
        return list(self._specs)

    def read(self) -> list[float | SourceError]:
        out: list[float | SourceError] = []
        for i, (h, energy) in enumerate(self._reads):
            try:
                out.append(self.nvml.total_energy_mj(h) / 1e3 if energy
                           else self.nvml.power_mw(h) / 1e3)
            except NvmlError as exc:
                out.append(_as_source_error(exc, f"GPU {i}"))
        return out

    def close(self) -> None:
        with contextlib.suppress(NvmlError):
            self.nvml.shutdown()
