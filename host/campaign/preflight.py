"""What a campaign needs before it starts, checked in seconds instead of found hours in.

`epi campaign --dry-run` prints every finding; a campaign that starts refuses to when one
fails, with one line per problem and its fix. The checks:

- **meters**: each running meter daemon the study names (`[meter] url`) answers `/status`
  (an emulated meter is started by the campaign itself);
- **RPC workers**: each worker of `[run] workers` answers llama.cpp's RPC HELLO;
- **model files**: each base model file exists (a prepared model is made by the campaign's
  `prepare` step, so only a named path must exist beforehand);
- **disk space**: the quantized models still to be written fit on the campaign directory's
  file system, with an upper bound of the base file's size × the map's widest type's bits per
  weight / 16 each (a map is never larger than all of its weights in its widest type);
- **evaluation data**: each benchmark plans no more items than the offline data holds (when
  the data is prepared; otherwise the campaign's `data` step prepares it and this check waits
  for it).
"""

from __future__ import annotations

import json
import shutil
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from epi.core.errors import UserError
from host.campaign.plan import Config, base_path, configurations
from host.campaign.study import Study
from host.cluster.rpc import Endpoint

#: bits per weight of the F16 base the quantized sizes are scaled from
BASE_BITS = 16.0


@dataclass(frozen=True)
class Finding:
    """One preflight line: `ok` True (fine), False (would stop the campaign), None (not
    checked here, with why)."""

    check: str
    ok: bool | None
    detail: str
    fix: str = ""

    def line(self) -> str:
        mark = {True: "ok ", False: "FAIL", None: "-- "}[self.ok]
        fix = f"; fix: {self.fix}" if self.fix and self.ok is False else ""
        return f"  {mark:4} {self.check}: {self.detail}{fix}"


def _meter_status(url: str) -> str | None:
    """None when the daemon at `url` answers /status with JSON, else why not."""
    from epi.core.net import split_daemon_url

    try:
        host, port, base = split_daemon_url(url)
        with urllib.request.urlopen(f"http://{host}:{port}{base}/status", timeout=3) as resp:
            json.loads(resp.read().decode("utf-8", "replace"))
    except UserError as exc:
        return str(exc)
    except (OSError, ValueError, urllib.error.URLError) as exc:
        reason = getattr(exc, "reason", None) or exc
        return f"no answer ({reason})"
    return None


def meter_findings(study: Study, status: Callable[[str], str | None] = _meter_status
                   ) -> list[Finding]:
    out = []
    for i, m in enumerate(study.meters):
        name = f"meter {i + 1}"
        if m.emulate:
            out.append(Finding(name, True, "emulated: the campaign starts it"))
            continue
        if m.url is None:
            continue
        problem = status(m.url)
        if problem is None:
            out.append(Finding(name, True, f"{m.url} answers"))
        else:
            out.append(Finding(name, False, f"{m.url}: {problem}",
                               "start `epi meter run` on the meter Pi (hardware/pi5-setup.md), "
                               "or correct [meter] url"))
    return out


def _probe_worker(endpoint: Endpoint) -> object:
    from host.cluster.rpc import probe

    return probe(endpoint, timeout_s=3.0)


def worker_findings(study: Study, probe: Callable[[Endpoint], object] = _probe_worker
                    ) -> list[Finding]:
    if not study.run.workers:
        return []
    from host.cluster.rpc import parse_workers

    check = probe
    out = []
    for ep in parse_workers(study.run.workers, "[run] workers"):
        try:
            check(ep)
        except UserError as exc:
            out.append(Finding(f"worker {ep.node}", False, str(exc),
                               f"start `epi worker --port {ep.port}` on {ep.node}, or correct "
                               "[run] workers"))
        else:
            out.append(Finding(f"worker {ep.node}", True, f"{ep.address} answers"))
    return out


def model_findings(study: Study) -> list[Finding]:
    out = []
    for spec in study.models:
        if spec.path is None:
            out.append(Finding(f"model {spec.name}", True,
                               "prepared by the campaign (`epi model prepare`)"))
        elif spec.path.is_file():
            out.append(Finding(f"model {spec.name}", True, str(spec.path)))
        else:
            out.append(Finding(f"model {spec.name}", False, f"{spec.path}: no such file",
                               "copy the base GGUF there (docs/reproduce.md), or correct "
                               "[[models]] path"))
    return out


def _map_bits(config: Config) -> float | None:
    from host.quant.mixmap import load_mixmap
    from host.quant.quant_types import bits_per_weight

    if config.map_path is None:
        return None
    m = load_mixmap(config.map_path)
    types = {m.base_type, *(g.type for g in m.groups), *m.non_block.values(), *m.moe.values()}
    types |= {t for g in m.groups for t in g.overrides.values()}
    bits = []
    for t in types:
        try:
            bits.append(bits_per_weight(t))
        except (KeyError, ValueError, UserError):
            # a llama-quantize file type (Q4_K_M, Q3_K_S: a mix of tensor types of its own):
            # bounded by the base's own width, since no tensor is stored wider than F16
            bits.append(BASE_BITS)
    return max(bits) if bits else None


def _free_bytes(path: Path) -> int:
    probe = path
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    return shutil.disk_usage(probe).free


def disk_findings(study: Study, free_bytes: Callable[[Path], int] = _free_bytes
                  ) -> list[Finding]:
    need, unknown = 0.0, []
    for c in configurations(study):
        if c.map_path is None or c.gguf.is_file():
            continue
        base = base_path(study, c.model)
        bits = _map_bits(c)
        if not base.is_file() or bits is None:
            unknown.append(c.config_id)
            continue
        need += base.stat().st_size * bits / BASE_BITS
    free = free_bytes(study.out)
    if unknown and not need:
        return [Finding("disk space", None,
                        f"cannot be bounded here: the base model of {len(unknown)} "
                        f"configuration(s) is not on this host ({free / 1e9:.2f} GB free at "
                        f"{study.out})")]
    what = f"quantized models up to {need / 1e9:.2f} GB, {free / 1e9:.2f} GB free at {study.out}"
    if unknown:
        what += f" ({len(unknown)} more whose base is not on this host yet)"
    if need > free:
        return [Finding("disk space", False, what,
                        "free space there, or put the campaign directory (`out`) on a larger "
                        "disk")]
    return [Finding("disk space", True, what)]


def data_findings(study: Study, data_root: Path | None = None) -> list[Finding]:
    from host.accuracy.evaldata import data_dir, read_manifest

    benches = study.accuracy.benchmarks
    if not benches:
        return []
    root = data_root or data_dir()
    manifest = read_manifest(root)
    prepared = manifest.get("benchmarks") or {}
    out = []
    for bench, n in benches.items():
        entry = prepared.get(bench)
        if entry is None:
            out.append(Finding(f"data {bench}", None,
                               f"{n} items planned; data not prepared yet (the campaign's data "
                               "step prepares it; `epi data prepare` checks the count now)"))
            continue
        have = int(entry["n_items"])
        if n > have:
            out.append(Finding(f"data {bench}", False,
                               f"{n} items planned, the offline data holds {have}",
                               f"set [accuracy] benchmarks {bench} = {have} or fewer"))
        else:
            out.append(Finding(f"data {bench}", True, f"{n} of {have} items"))
    return out


def preflight(study: Study) -> list[Finding]:
    """Every check, in the order a campaign would meet them."""
    return (model_findings(study) + disk_findings(study) + data_findings(study)
            + meter_findings(study) + worker_findings(study))


def lines(findings: list[Finding]) -> list[str]:
    failed = [f for f in findings if f.ok is False]
    head = (f"preflight: {len(failed)} problem(s) would stop the campaign at start"
            if failed else "preflight: nothing found that would stop the campaign")
    return [head, *(f.line() for f in findings)]


def require(findings: list[Finding]) -> None:
    """Refuse to start when a check failed: one line per problem, with its fix."""
    failed = [f for f in findings if f.ok is False]
    if failed:
        raise UserError("the campaign cannot start: " + "; ".join(
            f"{f.check}: {f.detail} (fix: {f.fix})" for f in failed))
