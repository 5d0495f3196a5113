"""Mix maps: which quantization type each layer group of a model gets.

A mix map (`quantmaps/*.json`, schema in docs/mixmaps.md) names layer groups either by explicit
layer lists or by fractions of the model's depth, so one map applies to any layer count. Two
forms are read: epi's own (`format: "epi-mixmap"`) and the study paper's (`config_id`, `model`,
`layer_groups: [{"layers": [...], "quant": ...}]`), both into one `MixMap` with the same checks.
This module loads and validates maps (every problem is one line naming file, field and problem)
and expands a map against a concrete model into one requested type per tensor, expert tensors
of mixture-of-experts models included.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

from epi.core.errors import UserError
from epi.core.text import ranges_text
from epi.formats.json_types import JSON
from host.quant.quant_types import (
    FILE_TYPES,
    KIND_FAMILIES,
    ROUTER_KIND,
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
TOP_KEYS = {
    "format",
    "format_version",
    "id",
    "description",
    "base_type",
    "groups",
    "non_block",
    "moe",
}
REQUIRED_TOP = ("format", "format_version", "id", "base_type", "groups", "non_block")
GROUP_KEYS = {"name", "layers", "fraction", "type", "overrides"}
NON_BLOCK_KEYS = {"token_embd", "output"}
OVERRIDE_KEYS = set(TENSOR_KINDS) | set(KIND_FAMILIES)
MOE_KEYS = ("router", "shared_experts")  # map-wide types of the non-expert MoE tensors
FRACTION_TOLERANCE = 1e-6
# The study paper's own map form.
PAPER_TOP_KEYS = {"config_id", "model", "layer_groups"}
PAPER_GROUP_KEYS = {"layers", "quant"}
# Layer numbers are below this (the deepest GGUF models have a few hundred layers); it bounds
# what a range such as "0-999999999999" may expand to.
MAX_LAYERS = 10_000
MAX_MAP_BYTES = 1 << 20  # a map is a few hundred bytes; refuse anything absurd before parsing
UNQUANTIZED = ("F32", "F16", "BF16")
ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}", re.ASCII)
_RANGE_RE = re.compile(r"^\s*(\d{1,6})\s*-\s*(\d{1,6})\s*$", re.ASCII)
# A tensor-only type in the paper form still needs a quantized llama.cpp file type to label the
# file (and llama-quantize applies per-tensor types only under a quantized file type).
_FILE_TYPE_OF_TENSOR_TYPE = {
    "Q3_K": "Q3_K_S",
    "Q4_K": "Q4_K_S",
    "Q5_K": "Q5_K_S",
    "IQ4_NL": "Q4_0",
    "F32": "Q8_0",
}


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
    raw: dict[str, object]
    moe: dict[str, str] = field(default_factory=dict)
    form: str = "epi"  # "epi" or "paper": the form the file was written in

    def canonical(self, *, compact_layers: bool = False) -> dict[str, JSON]:
        """The map in epi's own form, whatever form it came in; `compact_layers` writes layer
        runs as "a-b" ranges (what `epi maps import` writes)."""
        groups: list[JSON] = []
        for g in self.groups:
            entry: dict[str, JSON] = {"name": g.name}
            if g.fraction is not None:
                entry["fraction"] = g.fraction
            else:
                layers = list(g.layers or ())
                entry["layers"] = (list(_compact_layers(layers)) if compact_layers
                                   else list(layers))
            entry["type"] = g.type
            if g.overrides:
                entry["overrides"] = dict(sorted(g.overrides.items()))
            groups.append(entry)
        out: dict[str, JSON] = {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "id": self.id,
            "description": self.description,
            "base_type": self.base_type,
            "groups": groups,
            "non_block": dict(sorted(self.non_block.items())),
        }
        if self.moe:
            out["moe"] = dict(sorted(self.moe.items()))
        return out

    def content_key(self) -> str:
        """Hash of what the map does (not its id, description or form): equal maps, equal keys."""
        content = {k: v for k, v in self.canonical().items() if k not in ("id", "description")}
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


def _check_type(path: Path, where: str, value: object) -> str:
    if not isinstance(value, str):
        raise _fail(path, where, f"expected a quant type name, got {value!r:.40}")
    if not known_type(value):
        known = ", ".join(sorted(set(TENSOR_TYPES) | set(FILE_TYPES)))
        raise _fail(path, where, f"unknown quant type {value!r:.40} (known: {known})")
    return value


def _layer_number(path: Path, where: str, item: object) -> int:
    if isinstance(item, bool) or not isinstance(item, int):
        raise _fail(path, where, f"{item!r:.40} is not a layer number or 'a-b' range")
    if not 0 <= item < MAX_LAYERS:
        raise _fail(path, where, f"layer {str(item)[:20]} is outside 0-{MAX_LAYERS - 1}")
    return item


def _parse_layers(path: Path, where: str, value: object) -> tuple[int, ...]:
    """Layer numbers and 'a-b' ranges, bounded by MAX_LAYERS before anything is expanded."""
    if not isinstance(value, list):
        raise _fail(path, where, "expected a list of layer numbers or 'a-b' ranges")
    if len(value) > MAX_LAYERS:
        raise _fail(path, where, f"{len(value)} entries; a model has fewer than {MAX_LAYERS}")
    layers: list[int] = []
    for item in value:
        if isinstance(item, str):
            m = _RANGE_RE.fullmatch(item)
            if not m:
                raise _fail(path, where, f"bad layer range {item!r:.40} (expected 'a-b', two "
                                         "whole numbers of up to 6 digits)")
            if int(m.group(1)) > int(m.group(2)):
                raise _fail(path, where, f"bad layer range {item!r:.40}: it runs backwards "
                                         f"({m.group(1)} > {m.group(2)}; write 'a-b' with "
                                         "a <= b)")
            lo, hi = int(m.group(1)), int(m.group(2))
            if hi >= MAX_LAYERS:
                raise _fail(path, where, f"range {item!r} goes beyond layer {MAX_LAYERS - 1}")
            layers.extend(range(lo, hi + 1))
        else:
            layers.append(_layer_number(path, where, item))
        if len(layers) > MAX_LAYERS:
            raise _fail(path, where, f"more than {MAX_LAYERS} layers")
    if len(set(layers)) != len(layers):
        raise _fail(path, where, "a layer is listed twice")
    return tuple(sorted(layers))


def _check_id(path: Path, where: str, map_id: object) -> str:
    """Ids become file names (ID.gguf): a letter or digit first, then letters, digits, _ - ."""
    if not isinstance(map_id, str) or not ID_RE.fullmatch(map_id):
        raise _fail(
            path,
            where,
            "expected 1-128 ASCII letters, digits, '_', '-', '.', starting with a letter or "
            f"digit, got {map_id!r:.60}",
        )
    return map_id


def _check_overrides(path: Path, where: str, overrides: object, allowed: set[str]
                     ) -> dict[str, str]:
    if not isinstance(overrides, dict):
        raise _fail(path, where, "expected an object {tensor kind: type}")
    for kind, otype in overrides.items():
        if kind not in allowed:
            raise _fail(
                path,
                where,
                f"unknown tensor kind {kind!r:.40} (allowed: {', '.join(sorted(allowed))})",
            )
        _check_type(path, f"{where}.{kind}", otype)
    return dict(overrides)


def _parse_group(path: Path, i: int, raw: object) -> Group:
    where = f"groups[{i}]"
    if not isinstance(raw, dict):
        raise _fail(path, where, "expected an object")
    _check_unknown(path, where, raw, GROUP_KEYS)
    name = raw.get("name", f"group{i}")
    if not isinstance(name, str) or not name or len(name) > 64 or not name.isprintable():
        raise _fail(
            path,
            f"{where}.name",
            f"expected a printable name of 1-64 characters, got {name!r:.40}",
        )
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
        if not 0 < fraction <= 1:  # also refuses NaN and infinities
            raise _fail(path, f"{where}.fraction", f"must be in (0, 1], got {fraction}")
        fraction = float(fraction)
    overrides = _check_overrides(
        path, f"{where}.overrides", raw.get("overrides", {}), OVERRIDE_KEYS
    )
    return Group(name, qtype, layers, fraction, overrides)


def _key_text(key: str) -> str:
    """A key as it goes into a one-line error: plain when simple, else a short repr."""
    return key if re.fullmatch(r"[A-Za-z0-9_.-]{1,40}", key) else repr(key)[:42]


def _check_unknown(path: Path, where: str | None, raw: dict, allowed: set[str]) -> None:
    unknown = sorted(set(raw) - allowed)
    if unknown:
        field_name = _key_text(unknown[0]) if where is None else where
        detail = "" if where is None else f" {_key_text(unknown[0])!r}"
        raise _fail(
            path, field_name, f"unknown key{detail} (allowed: {', '.join(sorted(allowed))})"
        )


def _check_layer_overlap(path: Path, groups: tuple[Group, ...], list_key: str) -> None:
    seen: dict[int, str] = {}
    for i, g in enumerate(groups):
        for layer in g.layers or ():
            if layer in seen:
                raise _fail(
                    path,
                    f"{list_key}[{i}].layers",
                    f"layer {layer} is also in group {seen[layer]!r}",
                )
            seen[layer] = g.name


def is_paper_form(raw: object) -> bool:
    """True for the study paper's form (`config_id`, `layer_groups`), not epi's own."""
    return isinstance(raw, dict) and "format" not in raw and bool(
        {"config_id", "layer_groups"} & set(raw)
    )


def parse_mixmap(raw: object, path: Path) -> MixMap:
    """Validate a decoded map in either form; raise UserError naming file, field and problem."""
    if not isinstance(raw, dict):
        raise _fail(path, "top level", "expected a JSON object")
    if is_paper_form(raw):
        return parse_paper_map(raw, path)
    _check_unknown(path, None, raw, TOP_KEYS)
    for key in REQUIRED_TOP:
        if key not in raw:
            raise _fail(path, key, "missing")
    if raw["format"] != FORMAT:
        raise _fail(path, "format", f"expected {FORMAT!r}, got {raw['format']!r:.40}")
    version = raw["format_version"]
    if isinstance(version, bool) or not isinstance(version, int) or version != FORMAT_VERSION:
        raise _fail(
            path,
            "format_version",
            f"unsupported version {version!r:.40} (this epi reads {FORMAT_VERSION})",
        )
    map_id = _check_id(path, "id", raw["id"])
    base_type = raw["base_type"]
    if not isinstance(base_type, str) or base_type not in FILE_TYPES:
        raise _fail(
            path,
            "base_type",
            f"unknown llama.cpp file type {base_type!r:.40} (known: {', '.join(FILE_TYPES)})",
        )
    if not isinstance(raw["groups"], list) or not raw["groups"]:
        raise _fail(path, "groups", "expected a non-empty list of groups")
    groups = tuple(_parse_group(path, i, g) for i, g in enumerate(raw["groups"]))
    names = [g.name for g in groups]
    for name in names:
        if names.count(name) > 1:
            raise _fail(path, "groups", f"group name {name!r:.40} is used twice")
    styles = {g.fraction is None for g in groups}
    if len(styles) > 1:
        raise _fail(path, "groups", "mixes 'layers' and 'fraction' groups; use one style per map")
    if groups[0].fraction is not None:
        total = sum(g.fraction or 0.0 for g in groups)
        if abs(total - 1.0) > FRACTION_TOLERANCE:
            raise _fail(path, "groups", f"fractions sum to {total:g}, not 1")
    else:
        _check_layer_overlap(path, groups, "groups")
    non_block = raw["non_block"]
    if not isinstance(non_block, dict):
        raise _fail(path, "non_block", "expected an object {token_embd: type, output: type}")
    for key in sorted(NON_BLOCK_KEYS - set(non_block)):
        raise _fail(path, "non_block", f"missing {key!r} (non-block tensors must be explicit)")
    for key, value in non_block.items():
        if key not in NON_BLOCK_KEYS:
            raise _fail(
                path, f"non_block.{_key_text(key)}", "unknown tensor (allowed: token_embd, output)"
            )
        _check_type(path, f"non_block.{key}", value)
    moe = _check_overrides(path, "moe", raw.get("moe", {}), set(MOE_KEYS))
    if base_type in UNQUANTIZED:
        named = [g.type for g in groups] + [t for g in groups for t in g.overrides.values()]
        named += [*non_block.values(), *moe.values()]
        quantized = sorted({t for t in named if t not in UNQUANTIZED})
        if quantized:
            raise _fail(
                path,
                "base_type",
                f"{base_type} is not a quantized file type, and llama-quantize applies per-tensor "
                f"types only under one; {', '.join(quantized)} would be written as {base_type} "
                "(use e.g. Q8_0)",
            )
    description = raw.get("description", "")
    if not isinstance(description, str):
        raise _fail(path, "description", "expected a string")
    return MixMap(map_id, description, base_type, groups, dict(non_block), path, raw, moe)


def _paper_group_names(n: int) -> list[str]:
    """The study's group names: one group is 'all', three are early / middle / late."""
    if n == 1:
        return ["all"]
    if n == 3:
        return ["early", "middle", "late"]
    return [f"group{i}" for i in range(n)]


def _file_type_for(quant: str) -> str:
    return quant if quant in FILE_TYPES else _FILE_TYPE_OF_TENSOR_TYPE.get(quant, "Q8_0")


def parse_paper_map(raw: dict, path: Path) -> MixMap:
    """The study paper's map form, validated like epi's own and read into the same MixMap.

    `{"config_id": ID, "model": NAME, "layer_groups": [{"layers": [0, 1, ...], "quant": T}]}`.
    The paper does not say what the token embedding and output get; epi gives them the type of
    the group holding most layers (the middle group of the study's 25/50/25 maps, as in epi's
    shipped maps), and uses it as the file type.
    """
    _check_unknown(path, None, raw, PAPER_TOP_KEYS)
    for key in ("config_id", "layer_groups"):
        if key not in raw:
            raise _fail(path, key, "missing")
    map_id = _check_id(path, "config_id", raw["config_id"])
    model = raw.get("model", "")
    if not isinstance(model, str) or len(model) > 200 or not model.isprintable():
        raise _fail(path, "model", f"expected a short model name, got {model!r:.40}")
    items = raw["layer_groups"]
    if not isinstance(items, list) or not items:
        raise _fail(path, "layer_groups", "expected a non-empty list of groups")
    if len(items) > MAX_LAYERS:
        raise _fail(path, "layer_groups", f"{len(items)} groups; at most {MAX_LAYERS}")
    names = _paper_group_names(len(items))
    groups = []
    for i, item in enumerate(items):
        where = f"layer_groups[{i}]"
        if not isinstance(item, dict):
            raise _fail(path, where, "expected an object {layers, quant}")
        _check_unknown(path, where, item, PAPER_GROUP_KEYS)
        for key in ("layers", "quant"):
            if key not in item:
                raise _fail(path, where, f"missing key {key!r}")
        quant = _check_type(path, f"{where}.quant", item["quant"])
        layers = _parse_layers(path, f"{where}.layers", item["layers"])
        if not layers:
            raise _fail(path, f"{where}.layers", "empty group (no layers)")
        groups.append(Group(names[i], quant, layers, None))
    group_tuple = tuple(groups)
    _check_layer_overlap(path, group_tuple, "layer_groups")
    widest = max(groups, key=lambda g: len(g.layers or ()))  # first one on ties
    # llama-quantize applies per-tensor types only under a quantized file type: when the widest
    # group is unquantized (F16) but others are not, the umbrella is the widest quantized one
    quantized = [g for g in groups if g.type not in UNQUANTIZED]
    umbrella = widest if widest.type not in UNQUANTIZED or not quantized else \
        max(quantized, key=lambda g: len(g.layers or ()))
    description = f"study paper map {map_id}" + (f" for {model}" if model else "")
    return MixMap(
        map_id,
        description,
        _file_type_for(umbrella.type),
        group_tuple,
        {"token_embd": widest.type, "output": widest.type},
        path,
        raw,
        form="paper",
    )


def load_mixmap(path: Path | str) -> MixMap:
    """Read and validate one map file (either form)."""
    path = Path(path)
    try:
        with path.open("rb") as fh:
            data = fh.read(MAX_MAP_BYTES + 1)
    except FileNotFoundError:
        raise UserError(f"{path}: no such mix map file") from None
    except IsADirectoryError:
        raise UserError(f"{path}: is a directory, not a mix map file") from None
    except OSError as exc:
        raise UserError(f"{path}: cannot read: {exc.strerror}") from None
    if len(data) > MAX_MAP_BYTES:
        raise UserError(f"{path}: larger than {MAX_MAP_BYTES} bytes; not a mix map")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UserError(
            f"{path}: not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start})"
        ) from None
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UserError(
            f"{path}: invalid JSON at line {exc.lineno} column {exc.colno}: {exc.msg}"
        ) from None
    except RecursionError:
        raise UserError(f"{path}: invalid JSON: nested too deeply") from None
    except ValueError as exc:  # e.g. an integer of more digits than Python converts
        raise UserError(f"{path}: invalid JSON: {str(exc)[:80]}") from None
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


def import_maps(items: list[Path], out_dir: Path, *, force: bool = False) -> list[Path]:
    """Write each map (either form) in epi's own form as OUT_DIR/ID.json; the written paths.

    Every map is read and every output checked before anything is written, so a bad map or an
    existing output (without `force`) leaves the directory untouched.
    """
    from epi.core.files import write_json_atomic

    maps, _ = load_mixmaps(items)
    if out_dir.exists() and not out_dir.is_dir():
        raise UserError(f"{out_dir}: --out exists and is not a directory")
    targets = [out_dir / f"{m.id}.json" for m in maps]
    for m, target in zip(maps, targets, strict=True):
        # what is written must pass the reader `epi maps check` and `epi quantize` use: a map
        # the paper's form allows but epi's refuses (an unquantized base type) stops here
        try:
            parse_mixmap(m.canonical(compact_layers=True), target)
        except UserError as exc:
            raise UserError(f"{m.path}: cannot be imported: {exc}") from None
        if target.resolve() == m.path.resolve():
            raise UserError(f"{target}: --out would overwrite the map being imported")
        if target.exists() and not force:
            raise UserError(f"{target}: exists; pass --force to replace it")
    out_dir.mkdir(parents=True, exist_ok=True)
    for m, target in zip(maps, targets, strict=True):
        write_json_atomic(target, m.canonical(compact_layers=True))
    return targets


def _compact_layers(layers: list[int]) -> list[int | str]:
    """[0, 1, 2, 3, 7] -> ["0-3", 7]: the 'a-b' range form the epi schema reads."""
    runs: list[list[int]] = []  # [first, last] of each run of consecutive layers
    for n in layers:
        if runs and n == runs[-1][1] + 1:
            runs[-1][1] = n
        else:
            runs.append([n, n])
    return [a if a == b else f"{a}-{b}" for a, b in runs]


# ---------------------------------------------------------------- expansion against a model


@dataclass(frozen=True)
class TensorInfo:
    """A tensor of the base model as the expansion needs it."""

    name: str
    row_len: int  # ne[0]
    n_elements: int
    n_dims: int
    stored_type: str | None = None  # ggml type in the base file, where known


@dataclass(frozen=True)
class TensorPlan:
    """The type a map requests for one tensor, and what llama.cpp is expected to write."""

    name: str
    group: str  # group name, or "non_block"
    map_type: str  # the name written in the map (tensor type or file type)
    requested: str  # tensor type after llama.cpp's file-type rules
    expected: str  # after llama.cpp's block-size fallback (and its never-quantized tensors)


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
    list_key = "layer_groups" if mixmap.form == "paper" else "groups"
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
                f"{list_key}[{i}].layers",
                f"layer {beyond[0]} is beyond the model's {n_layers} layers (0-{n_layers - 1})",
            )
        covered.update(layers)
        result.append((g.name, layers))
    missing = sorted(set(range(n_layers)) - covered)
    if missing:
        raise _fail(
            path,
            list_key,
            f"layers {ranges_text(missing)} of the {n_layers}-layer model are in no group",
        )
    return result


def _map_type_for(mixmap: MixMap, g: Group, kind: str) -> str | None:
    """The type the map names for `kind` in group `g`.

    Order: the group's override of the kind, then of its narrowest family (router, experts,
    shared_experts before attn, ffn), then the map-wide `moe` type, then the group's type —
    except for the router, which has no type unless the map names one (None).
    """
    if kind in g.overrides:
        return g.overrides[kind]
    for family, kinds in KIND_FAMILIES.items():
        if kind in kinds and family in g.overrides:
            return g.overrides[family]
    for family in MOE_KEYS:
        if kind in KIND_FAMILIES[family] and family in mixmap.moe:
            return mixmap.moe[family]
    return None if kind == ROUTER_KIND else g.type


def expand(mixmap: MixMap, shape: ModelShape, tensors: list[TensorInfo]) -> Expansion:
    """Apply a map to a model: one requested tensor type for every quantizable tensor.

    Expert tensors (`*_exps`, 3-D) take their group's type through llama.cpp's rules like any
    block tensor. The router (`ffn_gate_inp`) is requested in its stored type unless the map
    names one; llama.cpp keeps it as stored either way, which is what `expected` says.
    """
    from host.quant.quant_types import is_quantizable, llama_keeps_type

    layer_groups = assign_layers(mixmap, shape.n_layers)
    group_by_layer = {layer: name for name, layers in layer_groups for layer in layers}
    groups = {g.name: g for g in mixmap.groups}
    plans: list[TensorPlan] = []
    router_warnings: list[str] = []
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
            named = _map_type_for(mixmap, groups[group_name], kind)
            if named is None:  # the router, not named by the map: requested as stored
                stored = t.stored_type or "F32"
                plans.append(TensorPlan(t.name, group_name, stored, stored, stored))
                continue
            map_type = named
        requested = rule_type(map_type, t.name, shape, t.row_len)
        if llama_keeps_type(t.name):
            expected = t.stored_type or requested
            if expected != requested:
                router_warnings.append(t.name)
        else:
            expected = apply_fallback(requested, t.row_len)
        plans.append(TensorPlan(t.name, group_name, map_type, requested, expected))
    warnings = _applicability_warnings(mixmap, [p for p in plans if p.name not in router_warnings])
    if router_warnings:
        kept = sorted({p.expected for p in plans if p.name in router_warnings})
        warnings.append(
            f"{mixmap.path}: router: llama-quantize never quantizes the expert router "
            f"(ffn_gate_inp); {len(router_warnings)} router tensor(s) stay "
            f"{'/'.join(kept)} as stored, not the type the map names"
        )
    return Expansion(mixmap, shape.n_layers, layer_groups, plans, warnings)


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
