"""`epi worker`: run a llama.cpp RPC worker (the `ggml-rpc-server` tool) on this node.

The command checks its options, prints what it starts, then *replaces itself* with the tool
(exec), so a supervisor such as systemd sees and signals the worker directly. Binds 127.0.0.1
unless --host says otherwise; on a Pi cluster give the node's LAN address (the RPC protocol has
no authentication: keep it on a private network).
"""

from __future__ import annotations

import ipaddress
import os
import socket

import click

from epi.commands.params import (
    THREADS,
    BoundedInt,
)
from epi.core.errors import UserError
from host.cluster.rpc import DEFAULT_PORT
from host.cluster.workers import worker_argv, worker_env


def _check_host(host: str) -> None:
    try:
        ipaddress.ip_address(host)
        return
    except ValueError:
        pass
    try:
        socket.getaddrinfo(host, None)
    except OSError:
        raise UserError(f"--host {host!r}: not an IP address and does not resolve") from None


def _check_port_free(host: str, port: int) -> None:
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as exc:
            msg = f"--host {host} --port {port}: cannot listen ({exc.strerror})"
            raise UserError(msg) from None


def _default_threads() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


@click.command("worker")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", type=BoundedInt(1, 65535), default=DEFAULT_PORT, show_default=True,
              help="TCP port.")
@click.option("--threads", type=THREADS, default=None, help="CPU threads [default: usable cores].")
@click.option(
    "--cache/--no-cache",
    default=False,
    show_default=True,
    help="Keep received tensors in ~/.cache/llama.cpp/rpc (-c): later loads of the same "
    "model skip the network transfer.",
)
@click.option(
    "--debug/--no-debug",
    default=False,
    show_default=True,
    help="Log every RPC command served (GGML_RPC_DEBUG=1): shows the layers arriving.",
)
def worker(host: str, port: int, threads: int | None, cache: bool, debug: bool) -> None:
    """Start a llama.cpp RPC worker; `epi run --workers HOST:PORT` sends it layers."""
    if not 1 <= port <= 65535:
        raise UserError(f"--port {port}: outside 1..65535")
    threads = threads if threads is not None else _default_threads()
    if threads < 1:
        raise UserError(f"--threads {threads}: must be at least 1")
    _check_host(host)
    _check_port_free(host, port)
    argv = worker_argv(host, port, threads, cache=cache)
    click.echo(
        f"epi worker: ggml-rpc-server on {host}:{port}, "
        f"{threads} thread{'' if threads == 1 else 's'}, "
        f"tensor cache {'on' if cache else 'off'}{', debug log' if debug else ''}",
        err=True,
    )
    os.execve(argv[0], argv, worker_env(debug))
