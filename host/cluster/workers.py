"""llama.cpp RPC workers: how one is started, local workers for tests, what a worker did.

One way to run a worker everywhere: llama.cpp's own `ggml-rpc-server` tool, built with the
bindings (`host.llama.install.tool_path`), run with `tool_env()` so it uses the same libraries.
`epi worker` execs it (systemd then supervises the tool itself, see
hardware/systemd/epi-worker.service); `LocalWorker` runs it as a child process for tests and
local experiments, waits until it answers the RPC HELLO, and reads its log.

With `GGML_RPC_DEBUG=1` the worker logs every command it serves; `worker_activity()` counts
them, which is how tests prove that each worker received its layers (`set_tensor`) and did
work (`graph_compute`/`graph_recompute`) rather than llama.cpp falling back to local CPU.
"""

from __future__ import annotations

import re
import subprocess
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from epi.core.errors import UserError
from host.cluster.rpc import Endpoint, wait_for_endpoint

_COMMAND = re.compile(r"^\[(\w+)\]", re.MULTILINE)
_ALLOC = re.compile(r"^\[alloc_buffer\] device: \d+, size: (\d+) ->", re.MULTILINE)


def worker_argv(
    host: str, port: int, threads: int, *, cache: bool = False, devices: str | None = None
) -> list[str]:
    """argv of `ggml-rpc-server` for one worker (never a shell string)."""
    from host.llama.install import tool_path

    argv = [str(tool_path("ggml-rpc-server")), "-H", host, "-p", str(port), "-t", str(threads)]
    if devices:
        argv += ["-d", devices]
    if cache:
        argv.append("-c")
    return argv


def worker_env(debug: bool = False) -> dict[str, str]:
    """Environment for the worker tool: the bindings' libraries, optional command logging."""
    from host.llama.install import tool_env

    env = tool_env()
    if debug:
        env["GGML_RPC_DEBUG"] = "1"
    else:
        env.pop("GGML_RPC_DEBUG", None)
    return env


@dataclass
class WorkerActivity:
    """Commands a worker served, from its GGML_RPC_DEBUG log."""

    commands: Counter[str] = field(default_factory=Counter)
    alloc_bytes: int = 0
    clients: int = 0

    @property
    def tensors_received(self) -> int:
        return self.commands["set_tensor"] + self.commands["set_tensor_hash"]

    @property
    def graphs_computed(self) -> int:
        return self.commands["graph_compute"] + self.commands["graph_recompute"]


def worker_activity(log_text: str) -> WorkerActivity:
    """Count the RPC commands in a worker log written with GGML_RPC_DEBUG=1."""
    act = WorkerActivity()
    act.commands.update(m.group(1) for m in _COMMAND.finditer(log_text))
    act.alloc_bytes = sum(int(m.group(1)) for m in _ALLOC.finditer(log_text))
    act.clients = log_text.count("Accepted client connection")
    return act


class LocalWorker:
    """A `ggml-rpc-server` child process on this machine (tests, local experiments).

    Started with GGML_RPC_DEBUG=1 so its log shows what it served; `stop()` (or the context
    manager) terminates it. The log goes to `log_path`.
    """

    def __init__(
        self,
        port: int,
        log_path: Path,
        *,
        host: str = "127.0.0.1",
        threads: int = 1,
        node: str | None = None,
        debug: bool = True,
    ) -> None:
        self.endpoint = Endpoint(host, port, node or f"{host}:{port}")
        self.log_path = Path(log_path)
        self.threads = threads
        self.debug = debug
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout_s: float = 30.0) -> LocalWorker:
        """Start the worker and wait until it answers the RPC HELLO."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                worker_argv(self.endpoint.host, self.endpoint.port, self.threads),
                env=worker_env(self.debug),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        try:
            wait_for_endpoint(self.endpoint, timeout_s)
        except UserError:
            self.stop()
            raise UserError(
                f"worker {self.endpoint.address} did not come up in {timeout_s:g} s "
                f"(port taken? log: {self.log_path})"
            ) from None
        return self

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        """Kill the worker at once (SIGKILL), as a crash or power loss would."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def stop(self) -> None:
        """Terminate the worker and wait for it."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def activity(self) -> WorkerActivity:
        return worker_activity(self.log_text())

    def __enter__(self) -> LocalWorker:
        return self.start() if self.proc is None else self

    def __exit__(self, *exc: object) -> None:
        self.stop()
