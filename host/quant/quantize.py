"""Per-tensor quantization of a base GGUF from a mix map, verified by reading the result back.

One code path: llama.cpp's own `llama-quantize` tool (built with the bindings, same source) in
`--pure` mode with one anchored `--tensor-type-file` entry per tensor, so the map is exactly
what is requested. llama.cpp may still write another type where a row length does not fit the
requested type; the result is read back with `gguf` and every tensor's effective type recorded
in a manifest (docs/mixmaps.md) next to the output.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from epi import __version__ as epi_version
from epi.core.errors import UserError
from epi.core.files import write_json_atomic
from epi.core.text import ranges_text
from epi.formats.json_types import JSONDict
from epi.formats.manifests import (
    BaseModel,
    Fallback,
    LayerGroup,
    QuantManifest,
    QuantOutput,
    QuantTotal,
    TensorRow,
    read_quant_manifest,
)
from host.gguf_io.file import sha256_file
from host.llama.install import llama_info, tool_env, tool_path
from host.quant.gguf_info import ModelInfo, read_model
from host.quant.mixmap import Expansion, MixMap, expand
from host.quant.quant_types import FILE_TYPES, llama_keeps_type, tensor_role

# Bump when the expansion rules change, so outputs made by older rules are redone.
RULES_VERSION = 2  # 2: mixture-of-experts tensors and llama.cpp's 8-expert rules


@dataclass(frozen=True)
class QuantResult:
    """Outcome of quantizing one map."""

    map_id: str
    output: Path
    manifest_path: Path
    manifest: QuantManifest
    skipped: bool  # up to date: nothing was done


def output_paths(out_dir: Path, map_id: str) -> tuple[Path, Path, Path]:
    """(gguf, manifest, log) paths for a map's output."""
    return (
        out_dir / f"{map_id}.gguf",
        out_dir / f"{map_id}.manifest.json",
        out_dir / f"{map_id}.quantize.log",
    )


def _tensor_type_file(expansion: Expansion) -> str:
    # One anchored regex per tensor: llama.cpp takes the first match, so anchoring keeps
    # blk.1 from matching blk.10 and makes the request exact.
    # The router is left out: llama-quantize never applies a type to it.
    lines = []
    for plan in expansion.tensors:
        if llama_keeps_type(plan.name):
            continue
        pattern = "^" + plan.name.replace(".", r"\.") + "$"
        lines.append(f"{pattern}={plan.requested.lower()}")
    return "\n".join(lines) + "\n"


def _is_up_to_date(manifest_path: Path, gguf_path: Path, inputs: JSONDict) -> bool:
    if not (manifest_path.is_file() and gguf_path.is_file()):
        return False
    try:
        old = read_quant_manifest(manifest_path)
    except UserError:
        return False  # corrupt: quantize again, which rewrites it
    if old.inputs != inputs:
        return False
    out = old.output
    return out.size_bytes == gguf_path.stat().st_size and out.sha256 == sha256_file(gguf_path)


def quantize_map(
    mixmap: MixMap,
    base: ModelInfo,
    base_sha256: str,
    out_dir: Path,
    *,
    threads: int | None = None,
    force: bool = False,
) -> QuantResult:
    """Quantize `base` with `mixmap` into `out_dir`, verify, and write the manifest."""
    expansion = expand(mixmap, base.shape, base.tensors)
    return quantize_expansion(expansion, base, base_sha256, out_dir, threads=threads, force=force)


def quantize_expansion(
    expansion: Expansion,
    base: ModelInfo,
    base_sha256: str,
    out_dir: Path,
    *,
    threads: int | None = None,
    force: bool = False,
) -> QuantResult:
    """Quantize `base` as `expansion` (a map already applied to `base`, e.g. to show its
    warnings first) into `out_dir`, verify, and write the manifest."""
    mixmap = expansion.mixmap
    gguf_path, manifest_path, log_path = output_paths(out_dir, mixmap.id)
    info = llama_info()
    inputs: JSONDict = {
        "map_sha256": mixmap.content_key(),
        "base_sha256": base_sha256,
        "llama_cpp": dict(info),
        "rules_version": RULES_VERSION,
    }
    if not force and _is_up_to_date(manifest_path, gguf_path, inputs):
        manifest = read_quant_manifest(manifest_path)
        return QuantResult(mixmap.id, gguf_path, manifest_path, manifest, skipped=True)

    out_dir.mkdir(parents=True, exist_ok=True)
    requantize = any(t not in ("F32", "F16", "BF16") for t in base.tensor_types.values())
    tmp_out = gguf_path.with_name(gguf_path.name + ".partial")
    with tempfile.NamedTemporaryFile("w", suffix=".tensor-types.txt", delete=False) as f:
        f.write(_tensor_type_file(expansion))
        types_file = Path(f.name)
    argv = [str(tool_path("llama-quantize")), "--pure"]
    if requantize:
        argv.append("--allow-requantize")
    argv += ["--tensor-type-file", str(types_file), str(base.path), str(tmp_out), mixmap.base_type]
    argv.append(str(threads or os.cpu_count() or 1))
    start = time.perf_counter()
    try:
        with log_path.open("w") as log:
            proc = subprocess.run(argv, stdout=log, stderr=subprocess.STDOUT, env=tool_env())
    finally:
        types_file.unlink(missing_ok=True)
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        tmp_out.unlink(missing_ok=True)
        tail = log_path.read_text(errors="replace").strip().splitlines()[-1:] or ["(no output)"]
        raise UserError(
            f"{mixmap.path}: llama-quantize failed (exit {proc.returncode}): {tail[0]} "
            f"— full log in {log_path}"
        )
    os.replace(tmp_out, gguf_path)
    manifest = build_manifest(expansion, base, base_sha256, gguf_path, inputs, seconds, requantize)
    write_json_atomic(manifest_path, manifest.to_json())
    return QuantResult(mixmap.id, gguf_path, manifest_path, manifest, skipped=False)


def _bpw(nbytes: int, n_weights: int) -> float | None:
    return round(nbytes * 8 / n_weights, 4) if n_weights else None


@dataclass
class _GroupSum:
    """Running totals of one layer group while the written tensors are read back."""

    layers: list[int]
    n_weights: int = 0
    nbytes: int = 0
    effective_types: dict[str, int] = field(default_factory=dict)

    def add(self, n_weights: int, nbytes: int, effective: str) -> None:
        self.n_weights += n_weights
        self.nbytes += nbytes
        self.effective_types[effective] = self.effective_types.get(effective, 0) + 1

    def group(self, name: str, map_type: str | dict[str, str] | None) -> LayerGroup:
        return LayerGroup(name, self.layers, self.n_weights, _bpw(self.nbytes, self.n_weights),
                          map_type, self.effective_types, ranges_text(self.layers))


def build_manifest(
    expansion: Expansion,
    base: ModelInfo,
    base_sha256: str,
    gguf_path: Path,
    inputs: JSONDict,
    seconds: float,
    requantized: bool,
) -> QuantManifest:
    """Requested vs effective type of every tensor, read back from the written file."""
    result = read_model(gguf_path)
    plans = {p.name: p for p in expansion.tensors}
    group_of_layer = expansion.group_of_layer()
    sums = {name: _GroupSum(list(layers)) for name, layers in expansion.layer_groups}
    sums["non_block"] = _GroupSum([])
    tensors = []
    for t in result.tensors:
        effective = result.tensor_types[t.name]
        plan = plans.get(t.name)
        if plan is not None:
            group = plan.group
        elif t.name.startswith("blk."):  # norms and biases of a layer belong to its group
            group = group_of_layer[int(t.name.split(".")[1])]
        else:
            group = "non_block"
        sums[group].add(t.n_elements, result.tensor_bytes[t.name], effective)
        tensors.append(TensorRow(
            name=t.name,
            role=tensor_role(t.name, t.n_dims),
            group=group,
            map_type=plan.map_type if plan else None,
            requested=plan.requested if plan else None,
            effective=effective,
            fallback=plan is not None and effective != plan.requested,
            predicted=plan.expected if plan else None,
            n_weights=t.n_elements,
            bits_per_weight=_bpw(result.tensor_bytes[t.name], t.n_elements),
        ))
    fallbacks = [Fallback(t.name, t.requested, t.effective)
                 for t in tensors if t.fallback and t.requested is not None]
    total_bytes = sum(result.tensor_bytes.values())
    m = expansion.mixmap
    map_types = {g.name: g.type for g in m.groups}
    llama = inputs.get("llama_cpp")
    return QuantManifest(
        map_id=m.id,
        map_file=str(m.path),
        map_form=m.form,
        map=m.raw,
        inputs=inputs,
        epi_version=epi_version,
        base=BaseModel(str(base.path), base_sha256, base.shape.n_layers, base.n_params,
                       requantized),
        output=QuantOutput(str(gguf_path), sha256_file(gguf_path), gguf_path.stat().st_size),
        llama_cpp=llama if isinstance(llama, dict) else {},
        file_type=m.base_type,
        quantize_seconds=round(seconds, 3),
        layer_groups=[sums[name].group(name, map_types[name]) for name, _ in expansion.layer_groups]
        + [sums["non_block"].group("non_block", dict(m.non_block))],
        total=QuantTotal(result.n_params, _bpw(total_bytes, result.n_params), total_bytes),
        differs_from_request=bool(fallbacks),
        fallbacks=fallbacks,
        unpredicted=[t.name for t in tensors if t.predicted and t.predicted != t.effective],
        warnings=list(expansion.warnings),
        moe=_moe_summary(tensors, result.shape.n_expert),
        tensors=tensors,
    )


def _moe_summary(tensors: list[TensorRow], n_expert: int) -> JSONDict | None:
    """Per role (expert, shared_expert, router): 'requested→effective' type counts; None if dense.

    The same facts as the per-tensor rows, gathered so a reader sees at a glance what the
    expert tensors got.
    """
    if n_expert <= 0:
        return None
    out: JSONDict = {"n_expert": n_expert}
    for role in ("expert", "shared_expert", "router"):
        counts: dict[str, int] = {}
        for t in tensors:
            if t.role == role:
                key = f"{t.requested or 'as stored'}→{t.effective}"
                counts[key] = counts.get(key, 0) + 1
        out[role] = dict(sorted(counts.items()))
    return out


def fallback_summary(manifest: QuantManifest) -> str:
    """'12 tensors: Q4_K→Q5_0 ×10, Q6_K→Q8_0 ×2' or '' when the file is as requested."""
    counts: dict[str, int] = {}
    for f in manifest.fallbacks:
        key = f"{f.requested}→{f.effective}"
        counts[key] = counts.get(key, 0) + 1
    if not counts:
        return ""
    parts = ", ".join(f"{k} ×{v}" for k, v in sorted(counts.items()))
    return f"{len(manifest.fallbacks)} tensors: {parts}"


def file_type_names() -> list[str]:
    """llama.cpp file types a map's base_type may name."""
    return list(FILE_TYPES)
