"""Mix maps: which quantization type each layer group of a model gets.

A mix map (`quantmaps/*.json`, schema in docs/mixmaps.md) names layer groups either by explicit
layer lists or by fractions of the model's depth, so one map applies to any layer count. This
module loads and validates maps (every problem is one line naming file, field and problem) and
expands a map against a concrete model into one requested type per tensor.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from epi.core.errors import UserError
from epi.core.text import ranges_text
from host.quant.quant_types import (
    FILE_TYPES,
    KIND_FAMILIES,
    TENSOR_KINDS,
    TENSOR_TYPES,
    ModelShape,
    apply_fallback,
    known_type,
    rule_type,
    split_tensor_name,
)

FORMAT = "epi-mixmap"
FORMAT_VERSION = 1
TOP_KEYS = {"format", "format_version", "id", "description", "base_type", "groups", "non_block"}
REQUIRED_TOP = ("format", "format_version", "id", "base_type", "groups", "non_block")
GROUP_KEYS = {"name", "layers", "fraction", "type", "overrides"}
NON_BLOCK_KEYS = {"token_embd", "output"}
OVERRIDE_KEYS = set(TENSOR_KINDS) | set(KIND_FAMILIES)
FRACTION_TOLERANCE = 1e-6


@dataclass(frozen=True)
class Group:
    """One layer group of a map, before it is applied to a model."""

    name: str
    type: str
    layers: tuple[int, ...] | None  # explicit layers, or None when given as a fraction
    fraction: float | None
    overrides: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class MixMap:
    """A validated mix map."""

    id: str
    description: str
    base_type: str
    groups: tuple[Group, ...]
    non_block: dict[str, str]
    path: Path
    raw: dict[str, Any]

    def content_key(self) -> str:
        """Hash of what the map does (not its id or description): equal maps, equal keys."""
        content = {k: v for k, v in self.raw.items() if k not in ("id", "description")}
        return hashlib.sha256(json.dumps(content, sort_keys=True).encode()).hexdigest()

    def describe_groups(self) -> str:
        """'early 25%: Q6_K · middle 50%: Q4_K_M · ...' for tables."""
        parts = []
        for g in self.groups:
            where = f"{g.fraction:.0%}" if g.fraction is not None else ranges_text(g.layers or ())
            parts.append(f"{g.name} {where}: {g.type}")
        return " · ".join(parts)


def _fail(path: Path, where: str, problem: str) -> UserError:
    return UserError(f"{path}: {where}: {problem}")


def _check_type(path: Path, where: str, value: Any) -> str:
    if not isinstance(value, str):
        raise _fail(path, where, f"expected a quant type name, got {value!r}")
    if not known_type(value):
        known = ", ".join(sorted(set(TENSOR_TYPES) | set(FILE_TYPES)))
        raise _fail(path, where, f"unknown quant type {value!r} (known: {known})")
    return value


def _parse_layers(path: Path, where: str, value: Any) -> tuple[int, ...]:
    if not isinstance(value, list):
        raise _fail(path, where, "expected a list of layer numbers or 'a-b' ranges")
    layers: list[int] = []
    for item in value:
        if isinstance(item, bool):
            raise _fail(path, where, f"{item!r} is not a layer number")
        if isinstance(item, int):
            layers.append(item)
        elif isinstance(item, str) and "-" in item:
            lo, _, hi = item.partition("-")
            if not (lo.strip().isdigit() and hi.strip().isdigit()) or int(lo) > int(hi):
                raise _fail(path, where, f"bad layer range {item!r} (expected 'a-b' with a <= b)")
            layers.extend(range(int(lo), int(hi) + 1))
        else:
            raise _fail(path, where, f"{item!r} is not a layer number or 'a-b' range")
    if any(n < 0 for n in layers):
        raise _fail(path, where, "layer numbers must be >= 0")
    if len(set(layers)) != len(layers):
        raise _fail(path, where, "a layer is listed twice")
    return tuple(sorted(layers))


def _parse_group(path: Path, i: int, raw: Any) -> Group:
    where = f"groups[{i}]"
    if not isinstance(raw, dict):
        raise _fail(path, where, "expected an object")
    unknown = sorted(set(raw) - GROUP_KEYS)
    if unknown:
        raise _fail(
            path, where, f"unknown key {unknown[0]!r} (allowed: {', '.join(sorted(GROUP_KEYS))})"
        )
    name = raw.get("name", f"group{i}")
    if not isinstance(name, str) or not name:
        raise _fail(path, f"{where}.name", "expected a non-empty string")
    if "type" not in raw:
        raise _fail(path, where, "missing key 'type'")
    qtype = _check_type(path, f"{where}.type", raw["type"])
    has_layers, has_fraction = "layers" in raw, "fraction" in raw
    if has_layers == has_fraction:
        raise _fail(path, where, "give exactly one of 'layers' or 'fraction'")
    layers = fraction = None
    if has_layers:
        layers = _parse_layers(path, f"{where}.layers", raw["layers"])
        if not layers:
            raise _fail(path, f"{where}.layers", "empty group (no layers)")
    else:
        fraction = raw["fraction"]
        if isinstance(fraction, bool) or not isinstance(fraction, (int, float)):
            raise _fail(path, f"{where}.fraction", f"expected a number, got {fraction!r}")
        if not 0 < fraction <= 1:
            raise _fail(path, f"{where}.fraction", f"must be in (0, 1], got {fraction}")
        fraction = float(fraction)
    overrides = raw.get("overrides", {})
    if not isinstance(overrides, dict):
        raise _fail(path, f"{where}.overrides", "expected an object {tensor kind: type}")
    for kind, otype in overrides.items():
        if kind not in OVERRIDE_KEYS:
            raise _fail(
                path,
                f"{where}.overrides",
                f"unknown tensor kind {kind!r} (allowed: {', '.join(sorted(OVERRIDE_KEYS))})",
            )
        _check_type(path, f"{where}.overrides.{kind}", otype)
    return Group(name, qtype, layers, fraction, dict(overrides))


def parse_mixmap(raw: Any, path: Path) -> MixMap:
    """Validate a decoded map; raise UserError naming file, field and problem."""
    if not isinstance(raw, dict):
        raise _fail(path, "top level", "expected a JSON object")
    unknown = sorted(set(raw) - TOP_KEYS)
    if unknown:
        raise _fail(path, unknown[0], f"unknown key (allowed: {', '.join(sorted(TOP_KEYS))})")
    for key in REQUIRED_TOP:
        if key not in raw:
            raise _fail(path, key, "missing")
    if raw["format"] != FORMAT:
        raise _fail(path, "format", f"expected {FORMAT!r}, got {raw['format']!r}")
    if raw["format_version"] != FORMAT_VERSION:
        raise _fail(
            path,
            "format_version",
            f"unsupported version {raw['format_version']!r} (this epi reads {FORMAT_VERSION})",
        )
    map_id = raw["id"]
    if (
        not isinstance(map_id, str)
        or not map_id
        or not map_id.replace("_", "").replace("-", "").replace(".", "").isalnum()
    ):
        raise _fail(
            path, "id", f"expected a name of letters, digits, '_', '-', '.', got {map_id!r}"
        )
    base_type = raw["base_type"]
    if base_type not in FILE_TYPES:
        raise _fail(
            path,
            "base_type",
            f"unknown llama.cpp file type {base_type!r} (known: {', '.join(FILE_TYPES)})",
        )
    if not isinstance(raw["groups"], list) or not raw["groups"]:
        raise _fail(path, "groups", "expected a non-empty list of groups")
    groups = tuple(_parse_group(path, i, g) for i, g in enumerate(raw["groups"]))
    names = [g.name for g in groups]
    for name in names:
        if names.count(name) > 1:
            raise _fail(path, "groups", f"group name {name!r} is used twice")
    styles = {g.fraction is None for g in groups}
    if len(styles) > 1:
        raise _fail(path, "groups", "mixes 'layers' and 'fraction' groups; use one style per map")
    if groups[0].fraction is not None:
        total = sum(g.fraction or 0.0 for g in groups)
        if abs(total - 1.0) > FRACTION_TOLERANCE:
            raise _fail(path, "groups", f"fractions sum to {total:g}, not 1")
    else:
        seen: dict[int, str] = {}
        for i, g in enumerate(groups):
            for layer in g.layers or ():
                if layer in seen:
                    raise _fail(
                        path,
                        f"groups[{i}].layers",
                        f"layer {layer} is also in group {seen[layer]!r}",
                    )
                seen[layer] = g.name
    non_block = raw["non_block"]
    if not isinstance(non_block, dict):
        raise _fail(path, "non_block", "expected an object {token_embd: type, output: type}")
    for key in sorted(NON_BLOCK_KEYS - set(non_block)):
        raise _fail(path, "non_block", f"missing {key!r} (non-block tensors must be explicit)")
    for key, value in non_block.items():
        if key not in NON_BLOCK_KEYS:
            raise _fail(path, f"non_block.{key}", "unknown tensor (allowed: token_embd, output)")
        _check_type(path, f"non_block.{key}", value)
    description = raw.get("description", "")
    if not isinstance(description, str):
        raise _fail(path, "description", "expected a string")
    return MixMap(map_id, description, base_type, groups, dict(non_block), path, raw)


def load_mixmap(path: Path | str) -> MixMap:
    """Read and validate one map file."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UserError(f"{path}: no such mix map file") from None
    except OSError as exc:
        raise UserError(f"{path}: cannot read: {exc.strerror}") from None
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UserError(
            f"{path}: invalid JSON at line {exc.lineno} column {exc.colno}: {exc.msg}"
        ) from None
    return parse_mixmap(raw, path)


def collect_map_files(items: list[Path]) -> list[Path]:
    """Expand directories into their *.json maps, keeping the given order."""
    files: list[Path] = []
    for item in items:
        if item.is_dir():
            found = sorted(item.glob("*.json"))
            if not found:
                raise UserError(f"{item}: directory holds no *.json mix maps")
            files.extend(found)
        else:
            files.append(item)
    return files


def load_mixmaps(items: list[Path]) -> tuple[list[MixMap], list[str]]:
    """Load several maps; duplicate ids are an error, duplicate contents a notice."""
    maps = [load_mixmap(p) for p in collect_map_files(items)]
    notices: list[str] = []
    by_id: dict[str, MixMap] = {}
    by_content: dict[str, MixMap] = {}
    for m in maps:
        if m.id in by_id:
            raise UserError(f"{m.path}: id: duplicate id {m.id!r} (also in {by_id[m.id].path})")
        by_id[m.id] = m
        key = m.content_key()
        if key in by_content:
            other = by_content[key]
            notices.append(
                f"{m.path}: same content as {other.path} ({m.id} = {other.id}): "
                "one quantization serves both"
            )
        else:
            by_content[key] = m
    return maps, notices


# ---------------------------------------------------------------- expansion against a model


@dataclass(frozen=True)
class TensorInfo:
    """A tensor of the base model as the expansion needs it."""

    name: str
    row_len: int  # ne[0]
    n_elements: int
    n_dims: int


@dataclass(frozen=True)
class TensorPlan:
    """The type a map requests for one tensor, and what llama.cpp is expected to write."""

    name: str
    group: str  # group name, or "non_block"
    map_type: str  # the name written in the map (tensor type or file type)
    requested: str  # tensor type after llama.cpp's file-type rules
    expected: str  # after llama.cpp's block-size fallback


@dataclass
class Expansion:
    """A map applied to a concrete model."""

    mixmap: MixMap
    n_layers: int
    layer_groups: list[tuple[str, list[int]]]
    tensors: list[TensorPlan]
    warnings: list[str]

    def group_of_layer(self) -> dict[int, str]:
        return {layer: name for name, layers in self.layer_groups for layer in layers}




def assign_layers(mixmap: MixMap, n_layers: int) -> list[tuple[str, list[int]]]:
    """Layers of each group for a model of `n_layers` (fractions: contiguous, rounded)."""
    path = mixmap.path
    if mixmap.groups[0].fraction is not None:
        result = []
        edge_prev = 0
        cumulative = 0.0
        for i, g in enumerate(mixmap.groups):
            cumulative += g.fraction or 0.0
            edge = (
                n_layers if i == len(mixmap.groups) - 1 else math.floor(cumulative * n_layers + 0.5)
            )
            layers = list(range(edge_prev, edge))
            if not layers:
                raise _fail(
                    path,
                    f"groups[{i}].fraction",
                    f"empty group: {g.fraction:g} of {n_layers} layers rounds to no layer",
                )
            result.append((g.name, layers))
            edge_prev = edge
        return result
    result = []
    covered: set[int] = set()
    for i, g in enumerate(mixmap.groups):
        layers = list(g.layers or ())
        beyond = [n for n in layers if n >= n_layers]
        if beyond:
            raise _fail(
                path,
                f"groups[{i}].layers",
                f"layer {beyond[0]} is beyond the model's {n_layers} layers (0-{n_layers - 1})",
            )
        covered.update(layers)
        result.append((g.name, layers))
    missing = sorted(set(range(n_layers)) - covered)
    if missing:
        raise _fail(
            path,
            "groups",
            f"layers {ranges_text(missing)} of the {n_layers}-layer model are in no group",
        )
    return result


def _group_type_for(g: Group, kind: str) -> str:
    if kind in g.overrides:
        return g.overrides[kind]
    for family, kinds in KIND_FAMILIES.items():
        if kind in kinds and family in g.overrides:
            return g.overrides[family]
    return g.type


def expand(mixmap: MixMap, shape: ModelShape, tensors: list[TensorInfo]) -> Expansion:
    """Apply a map to a model: one requested tensor type for every quantizable tensor."""
    from host.quant.quant_types import is_quantizable

    layer_groups = assign_layers(mixmap, shape.n_layers)
    group_by_layer = {layer: name for name, layers in layer_groups for layer in layers}
    groups = {g.name: g for g in mixmap.groups}
    plans: list[TensorPlan] = []
    for t in tensors:
        if not is_quantizable(t.name, t.n_dims):
            continue
        layer, kind = split_tensor_name(t.name)
        if layer is None:
            if kind not in NON_BLOCK_KEYS:
                raise UserError(
                    f"{mixmap.path}: non_block: model tensor {t.name!r} is not covered "
                    "(epi knows token_embd and output)"
                )
            group_name, map_type = "non_block", mixmap.non_block[kind]
        else:
            group_name = group_by_layer[layer]
            map_type = _group_type_for(groups[group_name], kind)
        requested = rule_type(map_type, t.name, shape, t.row_len)
        plans.append(
            TensorPlan(
                t.name, group_name, map_type, requested, apply_fallback(requested, t.row_len)
            )
        )
    return Expansion(
        mixmap, shape.n_layers, layer_groups, plans, _applicability_warnings(mixmap, plans)
    )


def _applicability_warnings(mixmap: MixMap, plans: list[TensorPlan]) -> list[str]:
    """Warn for each (group, requested type) that no tensor of the model can hold."""
    warnings = []
    by_key: dict[tuple[str, str], list[TensorPlan]] = {}
    for p in plans:
        by_key.setdefault((p.group, p.requested), []).append(p)
    for (group, requested), items in by_key.items():
        if all(p.expected != requested for p in items):
            fallbacks = sorted({p.expected for p in items})
            warnings.append(
                f"{mixmap.path}: {group}: type {requested} applies to no tensor of this model "
                f"(row length not a multiple of its block size); llama.cpp will write "
                f"{'/'.join(fallbacks)} instead for {len(items)} tensor(s)"
            )
    return warnings
