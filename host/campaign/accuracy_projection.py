"""The accuracy stage's projected time: measured on this machine where it can be, else assumed.

Accuracy scoring is the slowest stage of a study at the paper's item counts, and the study
file's `[estimate] accuracy_s_per_item` is a guess. Where a model file of the study is on this
machine and the evaluation data are prepared, a short probe (host.accuracy.estimate: one model
load, a few items per benchmark, scaled by the KV tokens of the very items the stage scores)
measures it instead. Every projection says which it is (`measured`), and how it was obtained
(`basis`), so the plan never presents an assumption as a measurement.

The campaign measures it before its accuracy stage starts and keeps the result in
`DIR/accuracy-projection.json`; a later `--dry-run` or a resumed session reuses it while the
study's accuracy settings are unchanged. `epi campaign --dry-run --probe-accuracy` measures
it without running anything else.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from epi.core.files import write_json_atomic
from epi.formats.json_types import JSONObject
from host.campaign.study import Study

FILE = "accuracy-projection.json"
#: the probe never takes more than this share of the stage's items (it stays cheap beside it)
PROBE_SHARE = 20
#: a campaign probes only a stage of at least this many items (all configurations together):
#: below, the probe's model load and items would be a large share of the stage itself
MIN_STAGE_ITEMS = 100


@dataclass(frozen=True)
class AccuracyProjection:
    """Projected scoring time of one configuration (one model): every benchmark item, plus
    perplexity windows."""

    seconds: float
    measured: bool
    basis: str  # one line: where the figure comes from
    settings: JSONObject | None = None  # the accuracy settings it is valid for


def stage_items(study: Study) -> int:
    """Items (and perplexity windows) one configuration's accuracy step scores."""
    a = study.accuracy
    return sum(a.benchmarks.values()) + ((a.ppl_windows or 0) if a.ppl else 0)


def _ppl_windows(study: Study) -> int:
    a = study.accuracy
    return (a.ppl_windows or 0) if a.ppl else 0


def settings_key(study: Study) -> JSONObject:
    """What a measured projection depends on (a change makes it stale)."""
    a = study.accuracy
    return {"benchmarks": dict(a.benchmarks), "ppl": a.ppl, "ppl_windows": a.ppl_windows,
            "threads": a.threads, "seed": a.seed, "shots": dict(a.shots),
            "shot_seed": a.shot_seed}


def assumed(study: Study, why_not_measured: str = "") -> AccuracyProjection:
    """items × the study file's `accuracy_s_per_item` (an assumption, said as such)."""
    rate = study.estimate.accuracy_s_per_item
    items = stage_items(study)
    basis = (f"ASSUMED, not measured: {items} items × the study file's [estimate] "
             f"accuracy_s_per_item = {rate:g} s")
    if why_not_measured:
        basis += f" ({why_not_measured})"
    return AccuracyProjection(items * rate, False, basis)


def probe_items(study: Study, n_configs: int) -> int:
    """Timed probe items per benchmark: 8 (host.accuracy.estimate's default), fewer where the
    whole stage is small, so the probe stays a small share of it (at least 2)."""
    from host.accuracy.estimate import PROBE_ITEMS

    total = sum(study.accuracy.benchmarks.values()) * max(n_configs, 1)
    return max(2, min(PROBE_ITEMS, total // PROBE_SHARE))


def measure(study: Study, model: Path, n_configs: int) -> AccuracyProjection:
    """Probe `model` on this machine (host.accuracy.estimate.projected_seconds): every
    benchmark as the stage scores it (few-shot items with their prefix resident), and the
    perplexity windows (the text's tokenization and two windows, timed)."""
    from host.accuracy import evaldata
    from host.accuracy.estimate import projected_seconds

    a = study.accuracy
    n_probe = probe_items(study, n_configs)
    windows = _ppl_windows(study)
    text = evaldata.resolve_ppl(a.ppl, None)[0] if windows else None
    t0 = time.monotonic()
    p = projected_seconds(model, list(a.benchmarks), dict(a.benchmarks),
                          a.threads or 1, seed=a.seed, probe_items=n_probe,
                          shots=a.shots, shot_seed=a.shot_seed, ppl_text=text,
                          ppl_windows=windows)
    took = time.monotonic() - t0
    seconds = float(p["seconds"])
    parts = ", ".join(f"{b} {v['n']} items {v['seconds']:.0f} s"
                      for b, v in p["benches"].items())
    basis = (f"MEASURED on this machine: a {n_probe}-item probe per benchmark on "
             f"{model.name}, {p['threads']} threads, took {took:.0f} s (load "
             f"{p['load_s']:.1f} s, {parts}")
    if p["ppl"] is not None:
        basis += (f", {windows} perplexity windows {p['ppl']['seconds']:.0f} s "
                  f"(tokenizing the text {p['ppl']['tokenize_s']:.1f} s)")
    basis += ")"
    if any(a.shots.values()):
        basis += (f"; few-shot prompts ({', '.join(f'{b} {k}' for b, k in a.shots.items())} "
                  "shots): each shot prefix decoded once and shared by its items, the items "
                  "probed with it resident")
    basis += "; the other configurations are assumed to score as fast as this model"
    return AccuracyProjection(seconds, True, basis, settings_key(study))


def save(root: Path, projection: AccuracyProjection) -> None:
    """Keep a projection in the campaign directory (atomically), for later sessions."""
    root.mkdir(parents=True, exist_ok=True)
    write_json_atomic(root / FILE, {"format": "epi-accuracy-projection", "format_version": 1,
                                    "t_real_ns": time.time_ns(), **asdict(projection)})


def load(study: Study) -> AccuracyProjection | None:
    """The measured projection kept in the campaign directory, if it is for these settings."""
    try:
        doc = json.loads((study.out / FILE).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(doc, dict) or doc.get("settings") != settings_key(study):
        return None
    try:
        return AccuracyProjection(float(doc["seconds"]), bool(doc["measured"]),
                                  str(doc["basis"]), doc["settings"])
    except (KeyError, TypeError, ValueError):
        return None


def probe_model(models: list[Path]) -> Path | None:
    """The first of `models` (the configurations' files, then the base files) on this host."""
    return next((m for m in models if m.is_file()), None)


def measured_or_assumed(study: Study, models: list[Path], n_configs: int
                        ) -> AccuracyProjection:
    """Measure with the first model file present; fall back to the assumption, saying why."""
    from epi.core.errors import UserError

    if not study.accuracy.benchmarks:
        return assumed(study, "no benchmark to probe")
    model = probe_model(models)
    if model is None:
        return assumed(study, "no model file of the study on this host yet")
    try:
        return measure(study, model, n_configs)
    except (UserError, OSError, ValueError, RuntimeError) as exc:
        return assumed(study, f"the probe failed: {exc}")


def offload_lines(projection: AccuracyProjection, stage_s: float, runs_s: float,
                  total_s: float, workers: int) -> list[str]:
    """The plan's time with the accuracy stage on `workers` Dask workers (`epi accuracy
    --cluster`), run beside the metered runs: the stage's items split evenly, each worker as
    fast as `projection`'s per-item time (measured here or assumed, said which); scheduling
    and transfer are not included."""
    from epi.core.text import format_duration as fmt

    on_n = stage_s / workers
    offloaded = total_s - stage_s - runs_s + max(on_n, runs_s)
    basis = ("MEASURED on this machine" if projection.measured
             else "ASSUMED (the study file's rate)")
    return [
        f"accuracy on {workers} Dask worker(s) (epi accuracy --cluster, docs/accuracy.md): "
        f"stage {fmt(stage_s)} → {fmt(on_n)} (items split evenly; each worker at the per-item "
        f"time above, {basis}; scheduling not included)",
        f"study with accuracy offloaded beside the metered runs ({fmt(runs_s)}): "
        f"{fmt(total_s)} → {fmt(offloaded)} (critical path: "
        f"{'accuracy' if on_n > runs_s else 'the metered runs'})",
    ]
