"""The node's own compute cost per weight for each quantization type, cache-resident.

RQ5 (bandwidth or compute?) needs a compute term that bandwidth plays no part in. This probe
measures, on this node and build, what one weight of each type costs to decode through
llama.cpp's real kernels while the weights stay in the CPU caches:

- two small test models of the same width (`n_embd` = `n_ff` = 256, so every type's blocks fit
  a row) are written, `small_layers` and `small_layers + extra_layers` blocks, and quantized
  `--pure` to the type (every weight that type);
- both decode the same prompt, `repeats` times interleaved; each repeat's decode seconds per
  token of the larger less the smaller's, over the extra blocks' weights, is one estimate:
  everything the two models share (the embedding lookup, the output matrix, sampling,
  llama.cpp's per-token overhead) cancels in the difference;
- the cost is the median of those estimates with its order-statistic interval.

The extra blocks' bytes (the working set that must stay cached) are recorded beside the node's
largest CPU cache, and `cache_resident` says whether they fit; where they do not (F16 on a
Pi 5's 2 MB L3), the figure includes memory traffic and says so. Recorded per node, build and
thread count.
"""

from __future__ import annotations

import json
import socket
import subprocess
import tempfile
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from epi.core.errors import UserError
from epi.core.files import write_json_atomic
from epi.formats.json_types import JSON
from host.analysis.intervals import median_interval

FORMAT = "epi-compute-probe"
WIDTH = 256
PROMPT = [1, 2, 3, 4, 5, 6, 7, 8]
# llama-quantize's file type whose --pure output is every weight of the tensor type
PURE_FILE_TYPE = {"Q2_K": "Q2_K", "Q3_K": "Q3_K_M", "Q4_K": "Q4_K_M", "Q5_K": "Q5_K_M",
                  "Q6_K": "Q6_K", "Q4_0": "Q4_0", "Q4_1": "Q4_1", "Q5_0": "Q5_0",
                  "Q5_1": "Q5_1", "Q8_0": "Q8_0", "F16": "F16", "BF16": "BF16"}


@dataclass(frozen=True)
class TypeCost:
    """Seconds per weight per decoded token for one tensor type, with its interval."""

    type_name: str
    s_per_weight: float
    ci_lo: float
    ci_hi: float
    ci_coverage: float
    n_repeats: int
    extra_weights: int
    working_set_bytes: int
    cache_resident: bool | None  # None: the node's cache size is unknown


@dataclass(frozen=True)
class ComputeProbe:
    """One node's probe: per-type costs, and where and how they were measured."""

    node: str
    build: str
    threads: int
    cache_bytes: int | None
    costs: dict[str, TypeCost]

    def to_json(self) -> dict[str, JSON]:
        return {"format": FORMAT, "format_version": 1, "node": self.node, "build": self.build,
                "threads": self.threads, "cache_bytes": self.cache_bytes,
                "costs": {k: asdict(v) for k, v in self.costs.items()}}

    @classmethod
    def from_json(cls, doc: object, where: str) -> ComputeProbe:
        if not isinstance(doc, dict) or doc.get("format") != FORMAT:
            raise UserError(f"{where}: not an {FORMAT} file")
        try:
            costs = {str(k): TypeCost(**v) for k, v in dict(doc["costs"]).items()}
            return cls(str(doc["node"]), str(doc["build"]), int(doc["threads"]),
                       None if doc.get("cache_bytes") is None else int(doc["cache_bytes"]),
                       costs)
        except (KeyError, TypeError, ValueError) as exc:
            raise UserError(f"{where}: malformed compute probe ({exc})") from None

    def compute_s_per_token(self, weights_by_type: Mapping[str, int]) -> float | None:
        """Σ weights × cost of their type: a model's compute per decoded token on this node;
        None when a type it uses was not probed."""
        if any(t not in self.costs for t in weights_by_type):
            return None
        return float(sum(n * self.costs[t].s_per_weight for t, n in weights_by_type.items()))


def largest_cache_bytes() -> int | None:
    """The largest CPU cache of cpu0 (sysfs), in bytes; None where the kernel does not say."""
    sizes = []
    for d in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*"):
        try:
            text = (d / "size").read_text().strip()
        except OSError:
            continue
        mult = {"K": 1024, "M": 1024 ** 2, "G": 1024 ** 3}.get(text[-1:], 1)
        digits = text.rstrip("KMG")
        if digits.isdigit():
            sizes.append(int(digits) * mult)
    return max(sizes) if sizes else None


def _quantize(base: Path, out: Path, type_name: str, threads: int) -> None:
    from host.llama.install import tool_env, tool_path

    argv = [str(tool_path("llama-quantize")), "--pure", str(base), str(out),
            PURE_FILE_TYPE[type_name], str(threads)]
    proc = subprocess.run(argv, capture_output=True, text=True, env=tool_env())
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["(no output)"]
        raise UserError(f"compute probe: llama-quantize {type_name} failed: {tail[0]}")


def _decode_s_per_token(path: Path, threads: int, tokens: int) -> Callable[[], float]:
    from host.run.engine import load_model, timed_request

    llm = load_model(path, threads=threads, n_ctx=len(PROMPT) + tokens + 8).llm

    def once() -> float:
        t = timed_request(llm, list(PROMPT), tokens)
        return (t.token_mono_ns[-1] - t.token_mono_ns[0]) / 1e9 / (tokens - 1)

    return once


def _block_weights(path: Path) -> int:
    from host.quant.gguf_info import read_model

    info = read_model(path)
    # the matrices (norm vectors are F32 whatever the type, and negligible work)
    return sum(t.n_elements for t in info.tensors if t.name.startswith("blk.") and t.n_dims >= 2)


def probe_compute(types: Iterable[str], *, threads: int, repeats: int = 7, tokens: int = 96,
                  small_layers: int = 2, extra_layers: int = 2,
                  echo: Callable[[str], None] = lambda _: None) -> ComputeProbe:
    """Measure every type in `types` (names as GGUF stores them: Q4_K, Q8_0, F16 ...)."""
    from host.llama.install import llama_info
    from host.quant.quant_types import bits_per_weight
    from host.quant.tiny_model import write_test_model

    wanted = sorted(set(types))
    unknown = [t for t in wanted if t not in PURE_FILE_TYPE]
    if unknown:
        raise UserError(f"compute probe: no pure llama-quantize type for {', '.join(unknown)} "
                        f"(known: {', '.join(PURE_FILE_TYPE)})")
    cache = largest_cache_bytes()
    costs = {}
    with tempfile.TemporaryDirectory(prefix="epi-compute-probe-") as tmp:
        d = Path(tmp)
        bases = [write_test_model(d / f"base{n}.gguf", n_layers=n, n_embd=WIDTH, n_ff=WIDTH,
                                  n_head=4, seed=7)
                 for n in (small_layers, small_layers + extra_layers)]
        for t in wanted:
            echo(f"compute probe: {t} ({repeats} repeats × {tokens} tokens, 2 models)")
            models = []
            for k, base in enumerate(bases):
                out = d / f"{t}-{k}.gguf"
                _quantize(base, out, t, threads)
                models.append(out)
            extra = _block_weights(models[1]) - _block_weights(models[0])
            small = _decode_s_per_token(models[0], threads, tokens)
            large = _decode_s_per_token(models[1], threads, tokens)
            small()
            large()  # warm-up: first-touch and thread start-up out of the figures
            per_weight = np.array([(large() - small()) / extra for _ in range(repeats)])
            ci = median_interval(per_weight)
            ws = int(extra * bits_per_weight(t) / 8)
            costs[t] = TypeCost(t, float(np.median(per_weight)), float(ci.lo), float(ci.hi),
                                float(ci.coverage), repeats, extra, ws,
                                None if cache is None else ws <= cache)
            for m in models:
                m.unlink()
    info = llama_info()
    build = f"llama-cpp-python {info['llama_cpp_python']} ({info['build_flags']})"
    return ComputeProbe(socket.gethostname(), build, threads, cache, costs)


def write_probe(probe: ComputeProbe, path: Path) -> None:
    write_json_atomic(path, probe.to_json())


def read_probe(path: Path) -> ComputeProbe:
    try:
        doc = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise UserError(f"{path}: cannot read the compute probe ({exc})") from None
    return ComputeProbe.from_json(doc, str(path))


def weights_by_type(gguf: Path) -> dict[str, int]:
    """A model's block weights by their stored type (the per-token matrix work)."""
    from host.quant.gguf_info import read_model

    info = read_model(gguf)
    out: dict[str, int] = {}
    for t in info.tensors:
        if t.name.startswith("blk.") and t.n_dims >= 2:
            typ = info.tensor_types[t.name]
            out[typ] = out.get(typ, 0) + t.n_elements
    return out




