"""The search space: one quantization type per transformer layer, and what each choice costs in
bytes read per generated token.

A candidate is a tuple of tensor types, one per layer (every block tensor of a layer gets that
layer's type); the token embedding and the output tensor keep fixed types. Only types that fit
every block tensor's row length are allowed by default, so the file holds exactly what the
candidate says (llama.cpp would otherwise write a fallback type and the byte count would lie).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from epi.core.errors import UserError
from epi.core.text import ranges_text
from host.quant.gguf_info import ModelInfo
from host.quant.quant_types import bits_per_weight, type_size

# Tensor types the search may choose, best first (llama.cpp tensor type names).
CANDIDATE_TYPES = ("Q8_0", "Q6_K", "Q5_K", "Q5_1", "Q5_0", "Q4_K", "Q4_1", "Q4_0", "Q3_K", "Q2_K")
_BLOCK_RE = re.compile(r"^blk\.(\d+)\.")


@dataclass(frozen=True)
class LayerTensors:
    """The quantizable tensors of one layer: (row length, element count) each."""

    layer: int
    tensors: tuple[tuple[str, int, int], ...]  # (name, row_len, n_elements)

    @property
    def n_weights(self) -> int:
        return sum(n for _, _, n in self.tensors)


@dataclass(frozen=True)
class SearchSpace:
    """Layers of a base model, the types each may take, and fixed non-block types."""

    n_layers: int
    layers: tuple[LayerTensors, ...]
    types: tuple[str, ...]  # allowed, best (most bits) first
    non_block: dict[str, str]
    fixed_bytes: int  # non-block tensors at their fixed types (embedding, output, norms)
    n_weights: int  # every tensor's weights, for bits per weight

    def layer_bytes(self, layer: int, type_name: str) -> int:
        """Bytes of one layer's quantizable tensors at `type_name`."""
        block, nbytes = type_size(type_name)
        return sum(n // block * nbytes for _, _, n in self.layers[layer].tensors)

    def bytes_of(self, assignment: Sequence[str]) -> int:
        """Bytes of the whole model under `assignment` (one type per layer)."""
        self.check(assignment)
        return self.fixed_bytes + sum(
            self.layer_bytes(i, t) for i, t in enumerate(assignment)
        )

    def bpw_of(self, assignment: Sequence[str]) -> float:
        """Bits per weight of the whole model under `assignment`."""
        return self.bytes_of(assignment) * 8 / self.n_weights

    def check(self, assignment: Sequence[str]) -> None:
        if len(assignment) != self.n_layers:
            raise UserError(
                f"assignment has {len(assignment)} layers, the model has {self.n_layers}"
            )
        bad = sorted({t for t in assignment if t not in self.types})
        if bad:
            raise UserError(f"types {bad} are not allowed here (allowed: {list(self.types)})")


def fitting_types(model: ModelInfo, types: Iterable[str] = CANDIDATE_TYPES) -> list[str]:
    """Types whose block size divides the row length of every block tensor of `model`."""
    rows = [t.row_len for t in model.tensors if _BLOCK_RE.match(t.name) and t.n_dims >= 2]
    return [t for t in types if all(r % type_size(t)[0] == 0 for r in rows)]


def build_space(
    model: ModelInfo,
    types: Sequence[str] | None = None,
    non_block: dict[str, str] | None = None,
) -> SearchSpace:
    """The search space of `model`: allowed types (default: those that fit every block tensor,
    ordered by bits per weight, highest first) and fixed non-block types (default Q8_0)."""
    fitting = fitting_types(model)
    if types is None:
        chosen = fitting
    else:
        unfit = [t for t in types if t not in fitting]
        if unfit:
            raise UserError(
                f"--types: {', '.join(unfit)} do not fit every block tensor of {model.path.name} "
                f"(row lengths must be multiples of the type's block); fitting: {fitting}"
            )
        chosen = list(dict.fromkeys(types))
    if len(chosen) < 2:
        raise UserError(
            f"{model.path.name}: fewer than two quantization types fit its tensors ({chosen}); "
            "nothing to search"
        )
    chosen.sort(key=bits_per_weight, reverse=True)
    nb = {"token_embd": "Q8_0", "output": "Q8_0", **(non_block or {})}
    per_layer: dict[int, list[tuple[str, int, int]]] = {}
    fixed = 0
    n_weights = 0
    for t in model.tensors:
        n_weights += t.n_elements
        m = _BLOCK_RE.match(t.name)
        if m and t.n_dims >= 2:
            per_layer.setdefault(int(m.group(1)), []).append((t.name, t.row_len, t.n_elements))
        elif t.n_dims >= 2 and t.name.split(".")[0] in nb:
            block, nbytes = type_size(nb[t.name.split(".")[0]])
            fixed += t.n_elements // block * nbytes
        else:  # norms and other 1-D tensors stay F32
            fixed += t.n_elements * 4
    n_layers = model.shape.n_layers
    layers = tuple(LayerTensors(i, tuple(per_layer.get(i, ()))) for i in range(n_layers))
    return SearchSpace(n_layers, layers, tuple(chosen), nb, fixed, n_weights)


def assignment_groups(assignment: Sequence[str]) -> list[tuple[list[int], str]]:
    """Consecutive layers with the same type, as (layers, type) groups in layer order."""
    groups: list[tuple[list[int], str]] = []
    for i, t in enumerate(assignment):
        if groups and groups[-1][1] == t:
            groups[-1][0].append(i)
        else:
            groups.append(([i], t))
    return groups


def assignment_text(assignment: Sequence[str]) -> str:
    """'0-7:Q8_0 8-29:Q4_0' for tables."""
    return " ".join(f"{ranges_text(ls)}:{t}" for ls, t in assignment_groups(assignment))


def mixmap_document(map_id: str, assignment: Sequence[str], space: SearchSpace,
                    description: str) -> dict:
    """The candidate as an epi mix map (docs/mixmaps.md): explicit layers, one group per run."""
    return {
        "format": "epi-mixmap",
        "format_version": 1,
        "id": map_id,
        "description": description,
        "base_type": "Q8_0",
        "groups": [
            {"name": f"g{k}", "layers": list(ls), "type": t}
            for k, (ls, t) in enumerate(assignment_groups(assignment))
        ],
        "non_block": dict(space.non_block),
    }


def write_mixmap(path: Path, document: dict) -> None:
    """Write a mix map file (plain JSON, the form quantmaps/ uses)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(document, indent=2) + "\n")


def assignment_of_map(path: Path, space: SearchSpace) -> tuple[tuple[str, ...] | None, str]:
    """The per-layer assignment a mix map file gives this space's model, or None with why.

    Used to put a hand-made map on the same summed per-layer proxy the search ranks its
    candidates by. A map has one only when it is expressible in the search space: every layer
    at one allowed type, no per-tensor overrides, and the space's non-block types (the proxy
    does not see the embedding or output tensors).
    """
    from host.quant.mixmap import assign_layers, load_mixmap

    mixmap = load_mixmap(path)
    if any(g.overrides for g in mixmap.groups) or mixmap.moe:
        return None, "per-tensor overrides"
    if dict(mixmap.non_block) != dict(space.non_block):
        return None, f"non-block types {mixmap.non_block} differ from the space's"
    types: dict[str, str] = {g.name: g.type for g in mixmap.groups}
    assignment: list[str | None] = [None] * space.n_layers
    for name, layers in assign_layers(mixmap, space.n_layers):
        for layer in layers:
            assignment[layer] = types[name]
    outside = sorted({t for t in assignment if t not in space.types}, key=str)
    if outside:
        return None, f"types {', '.join(map(str, outside))} are not in the allowed set"
    return tuple(t for t in assignment if t is not None), ""
