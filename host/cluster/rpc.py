"""Client side of llama.cpp RPC: name workers, check they answer, attach them to llama.cpp.

- `parse_workers("pi1=10.0.0.11:50052,10.0.0.12:50052")` → endpoints with node names (the name
  before `=`; otherwise the host, or host:port when several workers share a host). Node names
  are what `hardware/epi-meter.toml` channels refer to with their `node` key.
- `probe()` speaks the RPC protocol's HELLO itself (1 command byte, 8-byte size, 24-byte
  capability block; reply: version + capabilities), so "unreachable", "not an RPC server" and
  "incompatible version" are told apart *before* llama.cpp connects — llama.cpp aborts the whole
  process when a worker does not answer.
- `attach()` registers the workers with the ggml device registry that libllama uses. It must
  open the *same* libggml file that libllama loaded: a second copy has its own registry and the
  model silently stays on the CPU. The copy in use is found in /proc/self/maps after
  `import llama_cpp` (libllama's RUNPATH may point at the build directory, not at
  `host.llama.install.lib_dir()`), and the attach is checked by reading the devices back.
"""

from __future__ import annotations

import ctypes
import socket
import struct
import time
from dataclasses import dataclass
from pathlib import Path

from epi.core.errors import UserError

RPC_CMD_HELLO = 14
RPC_CONN_CAPS_SIZE = 24
RPC_PROTO_MAJOR = 7  # llama.cpp 0.3.36's ggml-rpc protocol; a worker must match it
RPC_PROTO_MAX_MINOR = 0
DEFAULT_PORT = 50052


@dataclass(frozen=True)
class Endpoint:
    """One RPC worker: where it listens and which node (meter channel) it is."""

    host: str
    port: int
    node: str

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"


def _parse_port(text: str, where: str) -> int:
    try:
        port = int(text)
    except ValueError:
        raise UserError(f"{where}: port {text!r} is not a number") from None
    if not 1 <= port <= 65535:
        raise UserError(f"{where}: port {port} is outside 1..65535")
    return port


def parse_workers(spec: str, option: str = "--workers") -> list[Endpoint]:
    """Parse `[name=]host:port,...` into endpoints with unique node names and addresses."""
    items = [s.strip() for s in spec.split(",") if s.strip()]
    if not items:
        raise UserError(f"{option}: empty; expected host:port[,host:port...]")
    raw: list[tuple[str | None, str, int]] = []
    for item in items:
        name, _, addr = item.rpartition("=")
        host, sep, port_text = addr.rpartition(":")
        if not sep or not host:
            raise UserError(f"{option}: {item!r} is not [name=]host:port")
        host = host.strip("[]")
        raw.append((name or None, host, _parse_port(port_text, f"{option} {item!r}")))
    hosts = [h for _, h, _ in raw]
    endpoints: list[Endpoint] = []
    for given, host, port in raw:
        node = given or (host if hosts.count(host) == 1 else f"{host}:{port}")
        endpoints.append(Endpoint(host, port, node))
    for attr in ("address", "node"):
        values = [getattr(e, attr) for e in endpoints]
        dup = next((v for v in values if values.count(v) > 1), None)
        if dup is not None:
            raise UserError(f"{option}: {attr} {dup!r} appears twice")
    return endpoints


def probe(endpoint: Endpoint, timeout_s: float = 5.0) -> tuple[int, int, int]:
    """RPC HELLO with a worker; its protocol version, or a one-line UserError.

    The worker serves one client at a time: a worker busy with another client does not answer
    within `timeout_s` and is reported as busy.
    """
    where = f"worker {endpoint.address} (node {endpoint.node})"
    try:
        sock = socket.create_connection((endpoint.host, endpoint.port), timeout=timeout_s)
    except OSError as exc:
        reason = exc.strerror or exc.__class__.__name__
        raise UserError(f"{where}: unreachable ({reason}); is `epi worker` running?") from None
    try:
        sock.settimeout(timeout_s)
        sock.sendall(
            struct.pack("<BQ", RPC_CMD_HELLO, RPC_CONN_CAPS_SIZE) + bytes(RPC_CONN_CAPS_SIZE)
        )
        size = struct.unpack("<Q", _recv_exact(sock, 8))[0]
        if size < 3 or size > 1024:
            raise UserError(f"{where}: answered HELLO with {size} bytes; not a llama.cpp worker")
        major, minor, patch = _recv_exact(sock, size)[:3]
    except TimeoutError:
        raise UserError(
            f"{where}: no HELLO reply in {timeout_s:g} s (busy with another client, or not "
            "a llama.cpp RPC worker)"
        ) from None
    except (ConnectionError, EOFError) as exc:
        raise UserError(f"{where}: closed the connection during HELLO ({exc})") from None
    finally:
        sock.close()
    if major != RPC_PROTO_MAJOR or minor > RPC_PROTO_MAX_MINOR:
        raise UserError(
            f"{where}: speaks RPC protocol {major}.{minor}.{patch}, this epi needs "
            f"{RPC_PROTO_MAJOR}.0-{RPC_PROTO_MAJOR}.{RPC_PROTO_MAX_MINOR}; rebuild the worker "
            "from the same llama.cpp"
        )
    return major, minor, patch


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise EOFError("connection closed")
        buf += chunk
    return buf


def wait_for_endpoint(endpoint: Endpoint, timeout_s: float = 30.0) -> tuple[int, int, int]:
    """Probe until the worker answers HELLO (it may still be starting) or the time is up."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return probe(endpoint, timeout_s=min(5.0, max(0.5, timeout_s)))
        except UserError:
            if time.monotonic() >= deadline:
                raise
            time.sleep(0.05)


# ---- attaching workers to llama.cpp ---------------------------------------------------------


def loaded_libggml_path() -> Path:
    """The libggml file that libllama actually loaded into this process (Linux)."""
    import llama_cpp  # noqa: F401  (loads libllama and, through it, libggml)

    paths: set[str] = set()
    try:
        with open("/proc/self/maps", encoding="utf-8") as fh:
            for line in fh:
                parts = line.split()
                if len(parts) >= 6 and Path(parts[-1]).name.startswith("libggml.so"):
                    paths.add(parts[-1])
    except OSError as exc:
        raise UserError(f"cannot read /proc/self/maps to find libggml ({exc.strerror})") from None
    if len(paths) != 1:
        raise UserError(
            f"expected exactly one libggml loaded by llama_cpp, found {sorted(paths) or 'none'}: "
            "two copies mean two device registries and workers would be ignored"
        )
    return Path(paths.pop())


class _Ggml:
    """ctypes view of the registry functions of the libggml that libllama uses."""

    def __init__(self) -> None:
        self.path = loaded_libggml_path()
        lib = ctypes.CDLL(str(self.path), mode=ctypes.RTLD_GLOBAL)
        vp, cp, sz = ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t
        for name, res, args in (
            ("ggml_backend_reg_by_name", vp, [cp]),
            ("ggml_backend_reg_get_proc_address", vp, [vp, cp]),
            ("ggml_backend_register", None, [vp]),
            ("ggml_backend_dev_count", sz, []),
            ("ggml_backend_dev_get", vp, [sz]),
            ("ggml_backend_dev_name", cp, [vp]),
            ("ggml_backend_dev_description", cp, [vp]),
        ):
            fn = getattr(lib, name)
            fn.restype = res
            fn.argtypes = args
        self.lib = lib

    def devices(self) -> list[tuple[str, str]]:
        """(name, description) of every registered device; RPC descriptions are endpoints."""
        out = []
        for i in range(self.lib.ggml_backend_dev_count()):
            dev = self.lib.ggml_backend_dev_get(i)
            name = self.lib.ggml_backend_dev_name(dev).decode()
            desc = self.lib.ggml_backend_dev_description(dev).decode()
            out.append((name, desc))
        return out


# Addresses registered in this process: registering one twice would duplicate its devices.
_ATTACHED: set[str] = set()


def attach(endpoints: list[Endpoint]) -> dict[str, Endpoint]:
    """Register the workers with llama.cpp in this process; llama device name → endpoint.

    Every endpoint is probed first (llama.cpp aborts the process on a dead one). Registration
    is process-wide and permanent, which is why `epi run` loads models with workers in a child
    process of its own.
    """
    import llama_cpp

    if not llama_cpp.llama_supports_rpc():
        raise UserError("this llama.cpp has no RPC support (needs GGML_RPC=ON); run `make setup`")
    for ep in endpoints:
        probe(ep)
    ggml = _Ggml()
    reg = ggml.lib.ggml_backend_reg_by_name(b"RPC")
    if not reg:
        raise UserError(f"{ggml.path}: has no RPC backend registered; rebuild with GGML_RPC=ON")
    fp = ggml.lib.ggml_backend_reg_get_proc_address(reg, b"ggml_backend_rpc_add_server")
    if not fp:
        raise UserError(f"{ggml.path}: RPC backend lacks ggml_backend_rpc_add_server")
    add_server = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_char_p)(fp)
    for ep in endpoints:
        if ep.address in _ATTACHED:
            continue
        server_reg = add_server(ep.address.encode())
        if not server_reg:
            raise UserError(f"worker {ep.address} (node {ep.node}): reports no devices")
        ggml.lib.ggml_backend_register(server_reg)
        _ATTACHED.add(ep.address)
    by_address = {ep.address: ep for ep in endpoints}
    mapping = {name: by_address[desc] for name, desc in ggml.devices() if desc in by_address}
    missing = [ep.address for ep in endpoints if ep not in mapping.values()]
    if missing:
        raise UserError(
            f"workers {', '.join(missing)} did not appear in llama.cpp's device list "
            f"(libggml {ggml.path}); they would be ignored"
        )
    return mapping
