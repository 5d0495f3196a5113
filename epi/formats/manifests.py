"""The manifests written next to a GGUF, as typed records with one checking reader each: the
quantization manifest (`epi quantize`, docs/formats.md §3, every key in docs/mixmaps.md) and
the model manifest (`epi model prepare`).

Both are named `STEM.manifest.json` beside the model, so a reader that looks beside a model
tells them apart by `format`. Every field is checked here (type, range, finiteness); anything
else is a one-line `UserError` naming the file and the field. Keys a writer may leave out
(older or hand-made manifests) read as their empty value. `to_json()` writes the same
document back, so writer and reader share one definition. Standard library only.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path

from epi.core.errors import UserError
from epi.formats.fields import (
    check_bool,
    check_float,
    check_format,
    check_id,
    check_int,
    check_object,
    check_object_list,
    check_str,
    check_str_list,
    read_json_object,
)
from epi.formats.json_types import JSONDict, JSONObject

QUANT_FORMAT = "epi-quant-manifest"
QUANT_VERSION = 1
MODEL_FORMAT = "epi-model-manifest"
MODEL_VERSION = 1
MAX_BPW = 64  # no ggml type stores more than 32 bits per weight; 64 leaves room
MAX_LAYER = 1_000_000



def manifest_beside(model: Path) -> Path:
    """`STEM.manifest.json` next to `model`."""
    model = Path(model)
    return model.with_name(model.stem + ".manifest.json")


def _bpw(value: object, where: str) -> float | None:
    return check_float(value, where, lo=0, hi=MAX_BPW, null_ok=True)


def _opt_object(data: JSONObject, key: str, where: str) -> JSONDict:
    """An optional object field ({} when absent), copied: the record keeps it as read."""
    return dict(check_object(data.get(key, {}), f"{where}: field {key}"))


@dataclass(frozen=True)
class LayerGroup:
    """One group of the map as applied: its layers, weights, bits per weight, and the types
    llama.cpp actually wrote (type → tensor count). The last group, `non_block`, has no layers
    and its `map_type` is the map's `{tensor role: type}`."""

    name: str
    layers: list[int]
    n_weights: int
    bits_per_weight: float | None
    map_type: str | dict[str, str] | None
    effective_types: dict[str, int] = field(default_factory=dict)
    layers_text: str = ""

    @classmethod
    def read(cls, g: JSONObject, at: str) -> LayerGroup:
        layers = g.get("layers")
        if not isinstance(layers, list):
            raise UserError(f"{at}.layers: expected a list of layer numbers, got {layers!r:.40}")
        raw_type = g.get("map_type")
        map_type: str | dict[str, str] | None
        if isinstance(raw_type, dict):  # non_block: {tensor role: type}
            map_type = {str(r): check_str(t, f"{at}.map_type.{r}") for r, t in raw_type.items()}
        else:
            map_type = check_str(raw_type, f"{at}.map_type", null_ok=True)
        eff = check_object(g.get("effective_types", {}), f"{at}.effective_types")
        text = g.get("layers_text", "")
        if not isinstance(text, str):
            raise UserError(f"{at}.layers_text: expected a string, got {text!r:.40}")
        return cls(
            name=check_str(g.get("name"), f"{at}.name"),
            layers=[check_int(x, f"{at}.layers", lo=0, hi=MAX_LAYER) for x in layers],
            n_weights=check_int(g.get("n_weights"), f"{at}.n_weights", lo=0),
            bits_per_weight=_bpw(g.get("bits_per_weight"), f"{at}.bits_per_weight"),
            map_type=map_type,
            # a type name from the file goes into a message: repr keeps it on one line
            effective_types={k: check_int(c, f"{at}.effective_types[{k!r}]", lo=0)
                             for k, c in eff.items()},
            layers_text=text,
        )


@dataclass(frozen=True)
class BaseModel:
    """The model that was quantized."""

    path: str
    sha256: str
    n_layers: int
    n_params: int
    requantized: bool  # the base was already quantized (llama-quantize --allow-requantize)

    @classmethod
    def read(cls, b: JSONObject, at: str) -> BaseModel:
        return cls(
            path=check_str(b.get("path"), f"{at}.path"),
            sha256=check_str(b.get("sha256"), f"{at}.sha256"),
            n_layers=check_int(b.get("n_layers"), f"{at}.n_layers", lo=1, hi=MAX_LAYER),
            n_params=check_int(b.get("n_params"), f"{at}.n_params", lo=0),
            requantized=check_bool(b.get("requantized"), f"{at}.requantized"),
        )


@dataclass(frozen=True)
class QuantOutput:
    """The written GGUF: null fields in a hand-made manifest mean "not recorded"."""

    path: str | None = None
    sha256: str | None = None
    size_bytes: int | None = None

    @classmethod
    def read(cls, o: JSONObject, at: str) -> QuantOutput:
        return cls(
            path=check_str(o.get("path"), f"{at}.path", null_ok=True),
            sha256=check_str(o.get("sha256"), f"{at}.sha256", null_ok=True),
            size_bytes=check_int(o.get("size_bytes"), f"{at}.size_bytes", lo=0, null_ok=True),
        )


@dataclass(frozen=True)
class QuantTotal:
    """The whole file's weights, bits per weight and tensor bytes."""

    n_weights: int | None = None
    bits_per_weight: float | None = None
    tensor_bytes: int | None = None

    @classmethod
    def read(cls, t: JSONObject, at: str) -> QuantTotal:
        return cls(
            n_weights=check_int(t.get("n_weights"), f"{at}.n_weights", lo=0, null_ok=True),
            bits_per_weight=_bpw(t.get("bits_per_weight"), f"{at}.bits_per_weight"),
            tensor_bytes=check_int(t.get("tensor_bytes"), f"{at}.tensor_bytes", lo=0,
                                   null_ok=True),
        )


@dataclass(frozen=True)
class Fallback:
    """A tensor llama.cpp wrote in another type than requested."""

    name: str
    requested: str
    effective: str

    @classmethod
    def read(cls, f: JSONObject, at: str) -> Fallback:
        return cls(check_str(f.get("name"), f"{at}.name"),
                   check_str(f.get("requested"), f"{at}.requested"),
                   check_str(f.get("effective"), f"{at}.effective"))


@dataclass(frozen=True)
class TensorRow:
    """One tensor: what the map said, what was requested, what was written (docs/mixmaps.md)."""

    name: str
    role: str
    group: str
    map_type: str | None  # as written in the map; None for tensors the map does not set
    requested: str | None  # after llama.cpp's file-type rules; None for norms
    effective: str  # read back from the file
    fallback: bool
    predicted: str | None  # epi's prediction of llama.cpp's fallback
    n_weights: int
    bits_per_weight: float | None

    @classmethod
    def read(cls, t: JSONObject, at: str) -> TensorRow:
        return cls(
            name=check_str(t.get("name"), f"{at}.name"),
            role=check_str(t.get("role"), f"{at}.role"),
            group=check_str(t.get("group"), f"{at}.group"),
            map_type=check_str(t.get("map_type"), f"{at}.map_type", null_ok=True),
            requested=check_str(t.get("requested"), f"{at}.requested", null_ok=True),
            effective=check_str(t.get("effective"), f"{at}.effective"),
            fallback=check_bool(t.get("fallback"), f"{at}.fallback"),
            predicted=check_str(t.get("predicted"), f"{at}.predicted", null_ok=True),
            n_weights=check_int(t.get("n_weights"), f"{at}.n_weights", lo=0),
            bits_per_weight=_bpw(t.get("bits_per_weight"), f"{at}.bits_per_weight"),
        )


@dataclass(frozen=True)
class QuantManifest:
    """What `epi quantize` made from one map: requested vs effective type of every tensor.

    `map`, `inputs`, `llama_cpp` and `moe` are recorded documents kept as read (the map as
    written, the up-to-date key, the llama.cpp build, per-role MoE counts)."""

    map_id: str
    map_file: str | None = None
    map_form: str | None = None
    map: JSONDict = field(default_factory=dict)
    inputs: JSONDict = field(default_factory=dict)
    epi_version: str | None = None
    base: BaseModel | None = None
    output: QuantOutput = field(default_factory=QuantOutput)
    llama_cpp: JSONDict = field(default_factory=dict)
    file_type: str | None = None
    quantize_seconds: float | None = None
    layer_groups: list[LayerGroup] = field(default_factory=list)
    total: QuantTotal = field(default_factory=QuantTotal)
    differs_from_request: bool = False
    fallbacks: list[Fallback] = field(default_factory=list)
    unpredicted: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    moe: JSONDict | None = None
    tensors: list[TensorRow] = field(default_factory=list)

    def to_json(self) -> JSONDict:
        """The manifest document (`format`, `format_version`, then every field)."""
        return {"format": QUANT_FORMAT, "format_version": QUANT_VERSION, **asdict(self)}

    def block_groups(self) -> list[LayerGroup]:
        """The map's groups of transformer layers (the `non_block` group left out)."""
        return [g for g in self.layer_groups if g.layers]


def check_quant_manifest(data: JSONObject, where: str) -> QuantManifest:
    """The typed quantization manifest, or a one-line `UserError` naming `where` and the field."""
    check_format(data, where, QUANT_FORMAT, QUANT_VERSION)
    f = f"{where}: field"
    base = data.get("base")
    moe = data.get("moe")
    return QuantManifest(
        map_id=check_id(data.get("map_id"), f"{f} map_id"),
        map_file=check_str(data.get("map_file"), f"{f} map_file", null_ok=True),
        map_form=check_str(data.get("map_form"), f"{f} map_form", null_ok=True),
        map=_opt_object(data, "map", where),
        inputs=_opt_object(data, "inputs", where),
        epi_version=check_str(data.get("epi_version"), f"{f} epi_version", null_ok=True),
        base=None if base is None else BaseModel.read(check_object(base, f"{f} base"),
                                                      f"{f} base"),
        output=QuantOutput.read(_opt_object(data, "output", where), f"{f} output"),
        llama_cpp=_opt_object(data, "llama_cpp", where),
        file_type=check_str(data.get("file_type"), f"{f} file_type", null_ok=True),
        quantize_seconds=check_float(data.get("quantize_seconds"), f"{f} quantize_seconds",
                                     lo=0, null_ok=True),
        layer_groups=[LayerGroup.read(g, at) for at, g in
                      check_object_list(data.get("layer_groups", []), f"{f} layer_groups")],
        total=QuantTotal.read(_opt_object(data, "total", where), f"{f} total"),
        differs_from_request=check_bool(data.get("differs_from_request", False),
                                        f"{f} differs_from_request"),
        fallbacks=[Fallback.read(x, at) for at, x in
                   check_object_list(data.get("fallbacks", []), f"{f} fallbacks")],
        unpredicted=check_str_list(data.get("unpredicted", []), f"{f} unpredicted"),
        warnings=check_str_list(data.get("warnings", []), f"{f} warnings"),
        moe=None if moe is None else dict(check_object(moe, f"{f} moe")),
        tensors=[TensorRow.read(x, at) for at, x in
                 check_object_list(data.get("tensors", []), f"{f} tensors")],
    )


@dataclass(frozen=True)
class ModelProvenance:
    """Where `epi model prepare` took a base model from (a PyPI wheel, never a hub)."""

    package: str
    version: str
    member: str
    wheel_sha256: str
    source_gguf_sha256: str


@dataclass(frozen=True)
class ModelManifest:
    """A base model prepared by `epi model prepare`: identity, provenance and shape.

    Only `size_bytes`, `n_params` and `n_layers` are required of a manifest on disk (what the
    up-to-date check and the doctor use); the rest read as empty when absent."""

    size_bytes: int
    n_params: int
    n_layers: int
    name: str | None = None
    description: str | None = None
    license: str | None = None
    source: ModelProvenance | None = None
    path: str | None = None
    sha256: str | None = None
    file_type: str | None = None
    architecture: str | None = None
    n_embd: int | None = None
    n_head: int | None = None
    n_head_kv: int | None = None
    tied_output: bool | None = None
    prepare_seconds: float | None = None

    def to_json(self) -> JSONDict:
        """The manifest document (`format`, `format_version`, then every field)."""
        return {"format": MODEL_FORMAT, "format_version": MODEL_VERSION, **asdict(self)}


def check_model_manifest(data: JSONObject, where: str) -> ModelManifest:
    """The typed model manifest, or a one-line `UserError` naming `where` and the field."""
    check_format(data, where, MODEL_FORMAT, MODEL_VERSION)
    f = f"{where}: field"
    src = data.get("source")
    source = None
    if src is not None:
        s = check_object(src, f"{f} source")
        source = ModelProvenance(*(check_str(s.get(k), f"{f} source.{k}") for k in
                               ("package", "version", "member", "wheel_sha256",
                                "source_gguf_sha256")))
    tied = data.get("tied_output")
    return ModelManifest(
        size_bytes=check_int(data.get("size_bytes"), f"{f} size_bytes", lo=0),
        n_params=check_int(data.get("n_params"), f"{f} n_params", lo=1),
        n_layers=check_int(data.get("n_layers"), f"{f} n_layers", lo=1, hi=MAX_LAYER),
        name=check_str(data.get("name"), f"{f} name", null_ok=True),
        description=check_str(data.get("description"), f"{f} description", null_ok=True),
        license=check_str(data.get("license"), f"{f} license", null_ok=True),
        source=source,
        path=check_str(data.get("path"), f"{f} path", null_ok=True),
        sha256=check_str(data.get("sha256"), f"{f} sha256", null_ok=True),
        file_type=check_str(data.get("file_type"), f"{f} file_type", null_ok=True),
        architecture=check_str(data.get("architecture"), f"{f} architecture", null_ok=True),
        n_embd=check_int(data.get("n_embd"), f"{f} n_embd", lo=1, null_ok=True),
        n_head=check_int(data.get("n_head"), f"{f} n_head", lo=1, null_ok=True),
        n_head_kv=check_int(data.get("n_head_kv"), f"{f} n_head_kv", lo=1, null_ok=True),
        tied_output=None if tied is None else check_bool(tied, f"{f} tied_output"),
        prepare_seconds=check_float(data.get("prepare_seconds"), f"{f} prepare_seconds",
                                    lo=0, null_ok=True),
    )


def read_quant_manifest(path: Path) -> QuantManifest:
    """A checked quantization manifest; a missing or corrupt file is a one-line `UserError`."""
    data = read_json_object(Path(path), "quantization manifest")
    return check_quant_manifest(data, str(path))


def read_model_manifest(path: Path) -> ModelManifest:
    """A checked model manifest; a missing or corrupt file is a one-line `UserError`."""
    data = read_json_object(Path(path), "model manifest")
    return check_model_manifest(data, str(path))


def read_any_manifest(path: Path) -> QuantManifest | ModelManifest:
    """A checked quantization or model manifest (told apart by `format`)."""
    data = read_json_object(Path(path), "manifest")
    if data.get("format") == MODEL_FORMAT:
        return check_model_manifest(data, str(path))
    return check_quant_manifest(data, str(path))


def quant_manifest_beside(model: Path) -> QuantManifest | None:
    """The quantization manifest next to `model`: None when there is none or the file there is
    a model manifest (`epi model prepare` names it the same way); corrupt is a `UserError`."""
    path = manifest_beside(model)
    if not path.is_file():
        return None
    data = read_json_object(path, "quantization manifest")
    if data.get("format") == MODEL_FORMAT:
        return None
    return check_quant_manifest(data, str(path))
