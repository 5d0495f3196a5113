"""Which layers each node holds: llama.cpp's split rule, and what its load log says it did.

llama.cpp (0.3.36, `llama_model::load_tensors`) splits `n_layer + 1` units — the repeating
layers plus the output layer — over its devices: with cumulative, normalised shares `s_i`, unit
`il` goes to the first device with `s_i > il / (n_layer + 1)` (float32). The token embedding
("input") always stays on the local CPU. epi passes explicit shares (equal by default, so a
placement never depends on a worker's momentary free memory), predicts the placement with the
same rule, reads the real one from llama.cpp's log ("layer N assigned to device D", "<buffer>
model buffer size = X MiB") and refuses to run when the two differ or a worker holds nothing.

Mixture-of-experts models place the same way: a layer's expert tensors (`*_exps`), router and
shared experts go with the layer. llama.cpp moves a tensor to another buffer type when the
preferred one cannot hold it ("... cannot be used with preferred buffer type RPC0[...], using
CPU instead"); a move off a worker is refused, since the layer would then compute elsewhere
than the placement says.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TypedDict

import numpy as np

from epi.core.errors import UserError
from host.cluster.rpc import Endpoint

_LAYER = re.compile(r"load_tensors: layer\s+(\d+) assigned to device (\S+?),")
_BUFFER = re.compile(r"load_tensors:\s+(\S+) model buffer size =\s+([\d.]+) MiB")
_ENDPOINT_IN_BUFFER = re.compile(r"^RPC\d+\[(.+)\]$")
_MOVED = re.compile(
    r"tensor '([^']+)' \((\S+)\) \(and (\d+) others\) cannot be used with preferred buffer "
    r"type (\S+), using (\S+) instead"
)


def parse_split(spec: str | None, n_workers: int) -> list[float]:
    """`--split 3,1` → shares per worker (positive numbers); equal shares when not given."""
    if spec is None:
        return [1.0] * n_workers
    if n_workers == 0:
        raise UserError("--split: only applies with --workers")
    try:
        shares = [float(s) for s in spec.split(",")]
    except ValueError:
        raise UserError(f"--split: {spec!r} is not a comma-separated list of numbers") from None
    if len(shares) != n_workers:
        raise UserError(f"--split: {len(shares)} shares for {n_workers} workers; give one each")
    if any(not np.isfinite(s) or s <= 0 for s in shares):
        raise UserError(f"--split: {spec!r}: every share must be a positive number")
    return shares


def predict_units(n_layers: int, shares: list[float]) -> list[list[int]]:
    """Units (layers 0..n_layers-1, output = n_layers) per device, by llama.cpp's float32 rule."""
    n_units = n_layers + 1
    cumulative = np.cumsum(np.asarray(shares, dtype=np.float32), dtype=np.float32)
    cumulative = (cumulative / cumulative[-1]).astype(np.float32)
    out: list[list[int]] = [[] for _ in shares]
    for il in range(n_units):
        value = np.float32(il) / np.float32(n_units)
        dev = int(np.searchsorted(cumulative, value, side="right"))
        out[min(dev, len(shares) - 1)].append(il)
    return out


@dataclass
class LoadLog:
    """Placement facts from one model load's llama.cpp log."""

    layer_device: dict[int, str] = field(default_factory=dict)  # unit index → device name
    buffer_mib: dict[str, float] = field(default_factory=dict)  # buffer name → MiB
    # (first tensor, tensor count, from buffer type, to buffer type) of each move llama.cpp made
    moved: list[tuple[str, int, str, str]] = field(default_factory=list)


def parse_load_log(text: str) -> LoadLog:
    """Per-unit devices and per-buffer weight sizes from a captured llama.cpp load log."""
    log = LoadLog()
    for m in _LAYER.finditer(text):
        log.layer_device[int(m.group(1))] = m.group(2)
    for m in _BUFFER.finditer(text):
        log.buffer_mib[m.group(1)] = log.buffer_mib.get(m.group(1), 0.0) + float(m.group(2))
    for m in _MOVED.finditer(text):
        log.moved.append((m.group(1), int(m.group(3)) + 1, m.group(4), m.group(5)))
    return log


class PlacementEntry(TypedDict):
    """One node of run.json's `placement` (docs/formats.md §2)."""

    node: str
    endpoint: str | None  # host:port of an RPC worker; None for the local node
    devices: list[str]  # llama.cpp device names on that node
    layers: list[int]  # repeating layers it holds
    extra_tensors: list[str]  # non-layer parts: "token_embd", "output"
    weights_mib: float


def placement_from_log(
    log: LoadLog,
    n_layers: int,
    local_node: str,
    devices: dict[str, Endpoint],
) -> list[PlacementEntry]:
    """run.json `placement`: one entry per node, local node first.

    `devices` maps llama.cpp device names of RPC workers (e.g. "RPC0") to their endpoints;
    any other device is local. Layers are the repeating layers a node holds; `extra_tensors`
    names the non-layer parts ("token_embd" is always local; "output" where unit n_layers went).
    """
    if set(range(n_layers + 1)) - set(log.layer_device):
        raise UserError(
            "llama.cpp's load log lacks 'layer N assigned to device' lines; cannot record "
            "placement (is this llama.cpp 0.3.36?)"
        )
    for tensor, count, src, dst in log.moved:
        if _ENDPOINT_IN_BUFFER.match(src):
            raise UserError(
                f"llama.cpp could not keep {count} tensor(s) ({tensor} ...) on worker buffer "
                f"{src} and moved them to {dst}; the layers would not run where the placement "
                "says"
            )
    entries: dict[str, PlacementEntry] = {
        local_node: {
            "node": local_node,
            "endpoint": None,
            "devices": ["CPU"],
            "layers": [],
            "extra_tensors": ["token_embd"],
            "weights_mib": 0.0,
        }
    }
    for ep in devices.values():
        entries[ep.node] = {
            "node": ep.node,
            "endpoint": ep.address,
            "devices": [],
            "layers": [],
            "extra_tensors": [],
            "weights_mib": 0.0,
        }
    for unit in sorted(log.layer_device):
        dev = log.layer_device[unit]
        node = devices[dev].node if dev in devices else local_node
        entry = entries[node]
        if dev not in entry["devices"]:
            entry["devices"].append(dev)
        if unit < n_layers:
            entry["layers"].append(unit)
        else:
            entry["extra_tensors"].append("output")
    by_address = {ep.address: ep.node for ep in devices.values()}
    for buffer, mib in log.buffer_mib.items():
        m = _ENDPOINT_IN_BUFFER.match(buffer)
        node = by_address.get(m.group(1), local_node) if m else local_node
        entries[node]["weights_mib"] = round(entries[node]["weights_mib"] + mib, 3)
    return list(entries.values())


def check_predicted(predicted: dict[str, list[int]], n_layers: int, split: list[float]) -> None:
    """Refuse a split that would leave a worker without a repeating layer."""
    for node, units in predicted.items():
        if not [u for u in units if u < n_layers]:
            raise UserError(
                f"--split {','.join(f'{s:g}' for s in split)}: worker node {node} would get no "
                f"layer of the model's {n_layers}; give it a larger share"
            )


def check_placement(
    placement: list[PlacementEntry], predicted: dict[str, list[int]], n_layers: int
) -> None:
    """Refuse a load where a worker got nothing or llama.cpp deviated from the prediction.

    `predicted` maps worker node → units (layer indices; `n_layers` stands for the output).
    A worker whose weight buffer is empty did not receive its layers (silent CPU fallback).
    """
    actual = {e["node"]: e for e in placement if e["endpoint"] is not None}
    for node, units in predicted.items():
        entry = actual.get(node)
        if entry is None:
            raise UserError(f"node {node}: missing from llama.cpp's placement")
        where = f"worker {entry['endpoint']} (node {node})"
        if not entry["layers"]:
            raise UserError(f"{where} received no layers: llama.cpp kept them elsewhere")
        if entry["weights_mib"] <= 0:
            raise UserError(
                f"{where}: llama.cpp allocated no weight buffer on it; its layers did not "
                "reach the worker"
            )
        got = sorted(entry["layers"] + ([n_layers] if "output" in entry["extra_tensors"] else []))
        if got != sorted(units):
            raise UserError(
                f"{where}: llama.cpp placed units {got}, epi's split rule predicted "
                f"{sorted(units)}; refusing to run with an unexpected placement"
            )
