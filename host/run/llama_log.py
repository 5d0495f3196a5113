"""Capture llama.cpp's log (including debug lines) while a model loads.

llama.cpp reports where it put every layer ("load_tensors: layer N assigned to device RPC0")
and how large each device's weight buffer is only in its log, so the runner reads placement
from there — what llama.cpp actually did, not a prediction. The callback is process-wide; the
context manager restores llama-cpp-python's own callback when it leaves.
"""

from __future__ import annotations

import ctypes
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TextIO

LEVEL_NAMES = {0: "NONE", 1: "INFO", 2: "WARN", 3: "ERROR", 4: "DEBUG", 5: "CONT"}


class LlamaLog:
    """Lines llama.cpp logged while captured; optionally mirrored to a file."""

    def __init__(self, mirror: TextIO | None = None) -> None:
        self.parts: list[str] = []
        self.mirror = mirror

    def add(self, text: str) -> None:
        self.parts.append(text)
        if self.mirror is not None:
            self.mirror.write(text)

    @property
    def text(self) -> str:
        return "".join(self.parts)

    def lines(self) -> list[str]:
        return self.text.splitlines()


@contextmanager
def captured_llama_log(mirror_path: Path | None = None) -> Iterator[LlamaLog]:
    """Send every llama.cpp/ggml log line to a LlamaLog (and `mirror_path`) inside the block."""
    import llama_cpp
    from llama_cpp import _logger

    mirror = (
        open(mirror_path, "a", encoding="utf-8")  # noqa: SIM115  (closed in the finally below)
        if mirror_path is not None
        else None
    )
    log = LlamaLog(mirror)

    @llama_cpp.llama_log_callback
    def _callback(level: int, text: bytes, user_data: ctypes.c_void_p) -> None:
        log.add(text.decode("utf-8", errors="replace"))

    llama_cpp.llama_log_set(_callback, ctypes.c_void_p(0))
    try:
        yield log
    finally:
        llama_cpp.llama_log_set(_logger.llama_log_callback, ctypes.c_void_p(0))
        if mirror is not None:
            mirror.close()
