"""The one reader of the manifests written next to a GGUF: the quantization manifest
(`epi quantize`, docs/formats.md §3) and the model manifest (`epi model prepare`).

Both are named `STEM.manifest.json` beside the model, so a reader that looks beside a model
tells them apart by `format`. Every field a caller uses is checked here (type, range,
finiteness); anything else is a one-line `UserError` naming the file and the field.
Standard library only.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from epi.core.errors import UserError
from epi.formats.fields import (
    check_float,
    check_format,
    check_id,
    check_int,
    check_object_list,
    check_str,
    read_json_object,
)

QUANT_FORMAT = "epi-quant-manifest"
QUANT_VERSION = 1
MODEL_FORMAT = "epi-model-manifest"
MODEL_VERSION = 1


def manifest_beside(model: Path) -> Path:
    """`STEM.manifest.json` next to `model`."""
    model = Path(model)
    return model.with_name(model.stem + ".manifest.json")


def _check_layer_groups(groups: Any, where: str) -> None:
    for at, g in check_object_list(groups, f"{where}: field layer_groups"):
        check_str(g.get("name"), f"{at}.name")
        layers = g.get("layers")
        if not isinstance(layers, list):
            raise UserError(f"{at}.layers: expected a list of layer numbers, got {layers!r:.40}")
        for layer in layers:
            check_int(layer, f"{at}.layers", lo=0, hi=1_000_000)
        check_int(g.get("n_weights"), f"{at}.n_weights", lo=0)
        check_float(g.get("bits_per_weight"), f"{at}.bits_per_weight", lo=0, hi=64,
                    null_ok=True)
        map_type = g.get("map_type")
        if isinstance(map_type, dict):  # non_block: {tensor role: type}
            for role, t in map_type.items():
                check_str(t, f"{at}.map_type.{role}")
        else:
            check_str(map_type, f"{at}.map_type", null_ok=True)
        eff = g.get("effective_types", {})
        if not isinstance(eff, dict):
            raise UserError(f"{at}.effective_types: expected an object, got {eff!r:.40}")
        for name, count in eff.items():
            check_int(count, f"{at}.effective_types.{name}", lo=0)


def check_quant_manifest(data: dict[str, Any], where: str) -> dict[str, Any]:
    """Refuse a quantization manifest whose used fields are off type or range."""
    check_format(data, where, QUANT_FORMAT, QUANT_VERSION)
    check_id(data.get("map_id"), f"{where}: field map_id")
    out = data.get("output", {})
    if not isinstance(out, dict):
        raise UserError(f"{where}: field output: expected an object, got {out!r:.40}")
    check_int(out.get("size_bytes"), f"{where}: field output.size_bytes", lo=0, null_ok=True)
    check_str(out.get("sha256"), f"{where}: field output.sha256", null_ok=True)
    total = data.get("total", {})
    if not isinstance(total, dict):
        raise UserError(f"{where}: field total: expected an object, got {total!r:.40}")
    check_float(total.get("bits_per_weight"), f"{where}: field total.bits_per_weight",
                lo=0, hi=64, null_ok=True)
    if not isinstance(data.get("inputs", {}), dict):
        raise UserError(f"{where}: field inputs: expected an object")
    _check_layer_groups(data.get("layer_groups", []), where)
    return data


def check_model_manifest(data: dict[str, Any], where: str) -> dict[str, Any]:
    """Refuse a model manifest whose used fields are off type or range."""
    check_format(data, where, MODEL_FORMAT, MODEL_VERSION)
    check_int(data.get("size_bytes"), f"{where}: field size_bytes", lo=0)
    check_int(data.get("n_params"), f"{where}: field n_params", lo=1)
    check_int(data.get("n_layers"), f"{where}: field n_layers", lo=1, hi=1_000_000)
    return data


def read_quant_manifest(path: Path) -> dict[str, Any]:
    """A checked quantization manifest; a missing or corrupt file is a one-line `UserError`."""
    data = read_json_object(Path(path), "quantization manifest")
    return check_quant_manifest(data, str(path))


def read_model_manifest(path: Path) -> dict[str, Any]:
    """A checked model manifest; a missing or corrupt file is a one-line `UserError`."""
    data = read_json_object(Path(path), "model manifest")
    return check_model_manifest(data, str(path))


def read_any_manifest(path: Path) -> dict[str, Any]:
    """A checked quantization or model manifest (told apart by `format`)."""
    data = read_json_object(Path(path), "manifest")
    if data.get("format") == MODEL_FORMAT:
        return check_model_manifest(data, str(path))
    return check_quant_manifest(data, str(path))


def quant_manifest_beside(model: Path) -> dict[str, Any] | None:
    """The quantization manifest next to `model`: None when there is none or the file there is
    a model manifest (`epi model prepare` names it the same way); corrupt is a `UserError`."""
    path = manifest_beside(model)
    if not path.is_file():
        return None
    data = read_json_object(path, "quantization manifest")
    if data.get("format") == MODEL_FORMAT:
        return None
    return check_quant_manifest(data, str(path))
