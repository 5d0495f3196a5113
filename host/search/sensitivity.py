"""The accuracy proxy: how far quantizing one layer moves the model's next-token distributions.

For every layer L and allowed type T, a probe model is quantized with layer L at T and every
other tensor left as in the base (F16), and scored on a fixed held-out text. The proxy is the
mean KL divergence KL(p_base ‖ p_probe) per scored token, in nats. A candidate's proxy is the sum
of its layers' KLs (an additivity assumption; `additivity_check` measures how well it holds on
real candidates). Results are cached per base model, text, layer, type and llama.cpp build, so
a search that is stopped and started again never repeats a probe.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from epi.core.errors import UserError
from epi.core.files import write_json_atomic
from host.gguf_io.file import sha256_file
from host.llama.install import llama_info
from host.quant.gguf_info import ModelInfo

KL_FORMAT = "epi-search-sensitivity"
KL_FORMAT_VERSION = 1


@dataclass(frozen=True)
class HeldOutText:
    """The fixed token windows every model is scored on."""

    windows: tuple[tuple[int, ...], ...]
    source: str
    sha256: str

    @property
    def n_scored(self) -> int:
        return sum(len(w) - 1 for w in self.windows)


def held_out_windows(tokens: Sequence[int], n_ctx: int, n_windows: int, source: str,
                     bos: int | None) -> HeldOutText:
    """`n_windows` windows of `n_ctx` tokens taken from the END of the text, so they do not
    overlap the perplexity windows, which `epi accuracy` takes from its start."""
    need = n_ctx * n_windows
    if len(tokens) < need:
        raise UserError(
            f"{source}: {len(tokens)} tokens, the sensitivity proxy needs {need} "
            f"({n_windows} windows of {n_ctx})"
        )
    tail = list(tokens[len(tokens) - need:])
    windows = []
    for k in range(n_windows):
        w = tail[k * n_ctx:(k + 1) * n_ctx]
        if bos is not None:
            w[0] = bos
        windows.append(tuple(w))
    digest = hashlib.sha256(json.dumps(windows).encode()).hexdigest()
    return HeldOutText(tuple(windows), source, digest)


def log_softmax(rows: np.ndarray) -> np.ndarray:
    """Row-wise log-softmax in float64."""
    x = rows.astype(np.float64)
    x -= x.max(axis=1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=1, keepdims=True))


def mean_kl(base_logp: np.ndarray, probe_logp: np.ndarray) -> float:
    """Mean over rows of KL(p ‖ q) = Σ p (log p − log q), in nats."""
    if base_logp.shape != probe_logp.shape:
        raise ValueError(f"shape {base_logp.shape} vs {probe_logp.shape}")
    p = np.exp(base_logp)
    return float(np.mean(np.sum(p * (base_logp - probe_logp), axis=1)))


def model_logprobs(model_path: Path, text: HeldOutText, threads: int) -> np.ndarray:
    """Log-probabilities of every next token over the held-out windows, stacked (float32)."""
    from host.accuracy.scorer import Scorer

    n_ctx = len(text.windows[0])
    rows = []
    with Scorer(model_path, n_ctx=n_ctx, threads=threads) as scorer:
        for w in text.windows:
            scorer.reset()
            scorer._evaluate(w)
            rows.append(log_softmax(np.asarray(scorer.llm.scores[: len(w) - 1])).astype(np.float32))
    return np.concatenate(rows)


class SensitivityCache:
    """Per (layer, type) KL values on disk: one JSON file, rewritten atomically per probe."""

    def __init__(self, path: Path, key: dict) -> None:
        self.path = path
        self.key = key
        self.values: dict[str, float] = {}
        if path.exists():
            try:
                doc = json.loads(path.read_text())
            except (OSError, ValueError) as exc:
                raise UserError(f"{path}: unreadable sensitivity cache ({exc}); delete it") from exc
            if doc.get("format") != KL_FORMAT or doc.get("key") != key:
                self.values = {}  # another model, text or build: start afresh
            else:
                self.values = {k: float(v) for k, v in doc.get("kl_nats", {}).items()}

    @staticmethod
    def name(layer: int, type_name: str) -> str:
        return f"{layer}:{type_name}"

    def get(self, layer: int, type_name: str) -> float | None:
        return self.values.get(self.name(layer, type_name))

    def put(self, layer: int, type_name: str, kl: float) -> None:
        self.values[self.name(layer, type_name)] = kl
        self.path.parent.mkdir(parents=True, exist_ok=True)
        write_json_atomic(self.path, {
            "format": KL_FORMAT, "format_version": KL_FORMAT_VERSION,
            "key": self.key, "kl_nats": self.values,
        })


def probe_map_document(layer: int, type_name: str) -> dict:
    """A mix map with one layer at `type_name` and everything else unquantized (F16)."""
    return {
        "format": "epi-mixmap", "format_version": 1,
        "id": f"probe_l{layer}_{type_name.lower()}",
        "description": f"sensitivity probe: layer {layer} at {type_name}, the rest F16",
        # llama-quantize ignores per-tensor overrides when the file type is F16, so the file
        # type is the probe's type and everything else is overridden back to F16.
        "base_type": type_name,
        "groups": [{"name": "probe", "layers": [layer], "type": type_name}],
        "non_block": {"token_embd": "F16", "output": "F16"},
        "rest_type": "F16",
    }


def quantize_document(document: dict, base: ModelInfo, base_sha: str, out_dir: Path,
                      threads: int) -> Path:
    """Quantize `base` with a mix-map document (layers not named in it stay F16)."""
    from host.quant.mixmap import parse_mixmap
    from host.quant.quantize import quantize_map

    doc = dict(document)
    rest = doc.pop("rest_type", None)
    named = {x for g in doc["groups"] for x in g["layers"]}
    others = [i for i in range(base.shape.n_layers) if i not in named]
    if rest and others:
        doc["groups"] = [*doc["groups"], {"name": "rest", "layers": others, "type": rest}]
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{doc['id']}.json"
    path.write_text(json.dumps(doc))
    mixmap = parse_mixmap(doc, path)
    result = quantize_map(mixmap, base, base_sha, out_dir, threads=threads)
    odd = result.manifest.unpredicted
    if odd:
        raise UserError(f"{path}: the probe file does not hold the requested types "
                        f"({len(odd)} tensors differ); see {result.manifest_path}")
    return result.output


def measure_sensitivity(
    base: ModelInfo,
    types: Sequence[str],
    text: HeldOutText,
    work_dir: Path,
    threads: int,
    progress: Callable[[str], None] = lambda s: None,
) -> dict[tuple[int, str], float]:
    """KL (nats per token) of every (layer, type) probe; cached in `work_dir`."""
    base_sha = sha256_file(base.path)
    info = llama_info()
    key = {"base_sha256": base_sha, "text_sha256": text.sha256,
           "llama_cpp": info.get("llama_cpp_python"), "build_flags": info.get("build_flags")}
    cache = SensitivityCache(work_dir / "sensitivity.json", key)
    todo = [(i, t) for i in range(base.shape.n_layers) for t in types if cache.get(i, t) is None]
    base_logp = None
    if todo:
        progress(f"sensitivity: {len(todo)} probe(s) to quantize and score "
                 f"({len(cache.values)} cached)")
        base_logp = model_logprobs(base.path, text, threads)
    for k, (layer, type_name) in enumerate(todo, 1):
        gguf_path = quantize_document(probe_map_document(layer, type_name), base, base_sha,
                                      work_dir / "probes", threads)
        assert base_logp is not None  # scored above whenever there is a probe to do
        kl = mean_kl(base_logp, model_logprobs(gguf_path, text, threads))
        cache.put(layer, type_name, kl)
        gguf_path.unlink(missing_ok=True)  # probes are many and big; the KL is what we keep
        progress(f"  [{k}/{len(todo)}] layer {layer} {type_name}: KL {kl:.3e} nats/token")
    table: dict[tuple[int, str], float] = {}
    for i in range(base.shape.n_layers):
        for t in types:
            kl_nats = cache.get(i, t)
            assert kl_nats is not None  # every missing probe was measured above
            table[(i, t)] = float(kl_nats)
    return table


def candidate_kl(assignment: Sequence[str], table: dict[tuple[int, str], float]) -> float:
    """The additive proxy of a whole candidate: Σ over layers of its layer's KL."""
    return float(sum(table[(i, t)] for i, t in enumerate(assignment)))
