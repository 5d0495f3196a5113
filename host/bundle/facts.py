"""What a comparison needs from one bundle: its configurations (joined on model and map
hashes) with their figures, and every fact that must match for a comparison to be fair.

Everything is read from the bundle's verified members (host/bundle/archive.py), never from
its manifest's own summary, so an edited summary cannot hide a difference.
"""

from __future__ import annotations

import csv
import io
import json
from dataclasses import dataclass, field

from epi.formats.json_types import JSON, JSONObject, as_json
from host.analysis.headline import is_headline
from host.bundle.archive import Bundle

#: facts whose value is a list of flags: a difference shows only the flags not shared
FLAG_ASPECTS = ("llama.cpp build flags", "CPU features of the build")
#: the fairness facts, in report order: name → what a difference means
ASPECTS = {
    "llama.cpp build flags": "different compiler flags change speed and energy",
    "llama.cpp version": "a different llama.cpp computes differently",
    "CPU features of the build": "a build without a CPU's features is slower on it",
    "power source": "measured and modelled power, or different meters, are not comparable",
    "calibration": "different calibration or CTs scale energy differently",
    "accuracy item sets": "accuracy on different items (or a different seed) differs by chance",
    "accuracy metric": "a different accuracy metric or weighting changes EPI",
    "accuracy protocol": "a different shot count or prompt template changes accuracy",
    "energy basis": "gross and net J/token differ by the idle draw: never compare them",
    "validity thresholds": "different gates accept different runs, so the figures are of "
                           "different populations",
    "analysis method": "a different edge model, energy method or lag correction changes "
                       "each window's energy",
    "run protocol": "different tokens per request, repeats, warm-ups or prompts change "
                    "J/token",
}
#: results.json `options` that decide which runs are valid (the validity gates)
THRESHOLD_OPTIONS = ("cv_threshold", "max_offset_frac", "min_samples", "max_gap_periods",
                     "max_resolution_frac", "max_instrument_u_pct", "max_lag_error_frac",
                     "single_sync_drift_ppm", "ci_level")
#: results.json `options` that decide how a window's energy is computed
METHOD_OPTIONS = ("edge", "energy_method", "lag")
#: run.json `settings` that make up a run's protocol
RUN_SETTINGS = ("tokens_per_request", "repeats", "warmups", "prompts_sha256", "n_ctx",
                "sampling")
#: the per-benchmark keys of accuracy.json that make up the scoring protocol
ACCURACY_PROTOCOL_KEYS = ("shots", "shot_seed", "template_version", "fewshot_split")


@dataclass(frozen=True)
class Config:
    """One configuration's headline figures (J per generated token on the analysis's own
    basis, whole requests)."""

    config: str
    model_sha256: str | None
    map_sha256: str | None
    j_per_token: float | None
    accuracy: float | None
    epi: float | None
    power_source: str | None
    reason: str | None = None  # why a figure is null (results.csv's `reason`)


@dataclass
class Facts:
    label: str
    energy_basis: str = "gross"  # the basis the analysis reports (results.json options)
    configs: dict[tuple[str | None, str | None], Config] = field(default_factory=dict)
    aspects: dict[str, str] = field(default_factory=dict)  # aspect → canonical value text


def _num(text: str | None) -> float | None:
    if not text:
        return None
    try:
        return float(text)
    except ValueError:
        return None


def _obj(bundle: Bundle, name: str) -> JSONObject:
    data = bundle.json(name)
    return data if isinstance(data, dict) else {}


def _dicts(value: object) -> list[JSONObject]:
    return [v for v in value if isinstance(v, dict)] if isinstance(value, list) else []


def _text(values: set[str]) -> str:
    return "; ".join(sorted(values)) if values else "(not recorded)"


def _runs(bundle: Bundle) -> list[JSONObject]:
    return [_obj(bundle, n) for n in sorted(bundle.members)
            if n.startswith("runs/") and n.endswith("/run.json")]


def _map_sha(bundle: Bundle, map_id: object) -> str | None:
    name = f"manifests/{map_id}.manifest.json"
    if name not in bundle.members:
        return None
    inputs = _obj(bundle, name).get("inputs")
    sha = inputs.get("map_sha256") if isinstance(inputs, dict) else None
    return str(sha) if sha else None


def _build_aspects(runs: list[JSONObject]) -> dict[str, str]:
    flags, versions, features = set(), set(), set()
    for r in runs:
        llama = r.get("llama_cpp")
        if not isinstance(llama, dict):
            continue
        bf = llama.get("build_flags")
        flags.add(" ".join(str(f) for f in bf) if isinstance(bf, list) else str(bf or ""))
        versions.add(str(llama.get("version")))
        cf = llama.get("cpu_features")
        if isinstance(cf, dict) and isinstance(cf.get("build"), list):
            features.add(" ".join(str(f) for f in cf["build"]))
    return {"llama.cpp build flags": _text({f or "(none)" for f in flags}),
            "llama.cpp version": _text(versions),
            "CPU features of the build": _text(features)}


def _calibration(bundle: Bundle) -> str:
    """Per channel: meter constant, CT, calibration; plus any qualification record."""
    seen: dict[str, JSON] = {}
    for name in sorted(bundle.members):
        if not (name.startswith("trace") and name.endswith(".meta.json")):
            continue
        meta = _obj(bundle, name)
        for ch in _dicts(meta.get("channels")):
            seen[f"ch{ch.get('channel')}"] = {
                key: as_json(ch.get(key), f"{name} {key}")
                for key in ("meter_constant_imp_per_kwh", "ct", "calibration")}
        if meta.get("qualification") is not None:
            seen["qualification"] = as_json(meta.get("qualification"), f"{name} qualification")
    return json.dumps(seen, sort_keys=True) if seen else "(not recorded)"


def _accuracy_aspects(bundle: Bundle) -> dict[str, str]:
    if "accuracy/accuracy.json" not in bundle.members:
        return {"accuracy item sets": "(no accuracy file)", "accuracy metric": "(none)",
                "accuracy protocol": "(no accuracy file)"}
    doc = _obj(bundle, "accuracy/accuracy.json")
    items, metrics, protocol = set(), set(), set()
    for m in _dicts(doc.get("models")):
        benches = m.get("benchmarks")
        for bench, res in (benches.items() if isinstance(benches, dict) else []):
            sub = res.get("subset") if isinstance(res, dict) else None
            if isinstance(sub, dict):
                items.add(f"{bench}: n={sub.get('n')} seed={sub.get('seed')} items "
                          f"{str(sub.get('items_sha256'))[:16]}")
            if isinstance(res, dict):
                # an accuracy file without a shot count was scored zero-shot (the only
                # protocol epi had before shots were recorded)
                stated = {k: res[k] for k in ACCURACY_PROTOCOL_KEYS if k in res}
                protocol.add(f"{bench}: " + (json.dumps(stated, sort_keys=True)
                                             if stated else "zero-shot (no shots recorded)"))
        comp = m.get("composite")
        if isinstance(comp, dict):
            metrics.add(f"{comp.get('metric')} weights "
                        f"{json.dumps(comp.get('weights'), sort_keys=True)}")
    return {"accuracy item sets": _text(items), "accuracy metric": _text(metrics),
            "accuracy protocol": _text(protocol)}


def _options(bundle: Bundle) -> JSONObject:
    """The analysis options results.json records (empty when it records none)."""
    options = _obj(bundle, "analysis/results.json").get("options")
    return options if isinstance(options, dict) else {}


def _settings_text(options: JSONObject, keys: tuple[str, ...]) -> str:
    return json.dumps({k: options.get(k) for k in keys}, sort_keys=True)


def _run_protocol(runs: list[JSONObject]) -> str:
    seen = set()
    for r in runs:
        settings = r.get("settings")
        if isinstance(settings, dict):
            seen.add(_settings_text(settings, RUN_SETTINGS))
    return _text(seen)


def _headline(bundle: Bundle, basis: str) -> dict[str, dict[str, str]]:
    """config → its J per generated token row of results.csv (whole requests) on `basis`."""
    if "analysis/results.csv" not in bundle.members:
        return {}
    text = bundle.members["analysis/results.csv"].decode("utf-8", "replace")
    out = {}
    for row in csv.DictReader(io.StringIO(text)):
        if is_headline(row, basis):
            out[row.get("config") or ""] = row
    return out


def facts(bundle: Bundle) -> Facts:
    """The comparison facts of one verified bundle."""
    options = _options(bundle)
    out = Facts(label=bundle.path.name, energy_basis=str(options.get("energy_basis", "gross")))
    runs = _runs(bundle)
    models: dict[str, dict[str, JSON]] = {}
    for r in runs:
        model = r.get("model")
        if isinstance(model, dict) and model.get("map_id"):
            models.setdefault(str(model["map_id"]), model)
    for config, row in _headline(bundle, out.energy_basis).items():
        model = models.get(config, {})
        sha = str(model["sha256"]) if model.get("sha256") else None
        key = (sha, _map_sha(bundle, config))
        out.configs[key] = Config(config, key[0], key[1], _num(row.get("j_per_token_median")),
                                  _num(row.get("accuracy")), _num(row.get("epi")),
                                  row.get("power_source") or None, row.get("reason") or None)
    out.aspects.update(_build_aspects(runs))
    results = _obj(bundle, "analysis/results.json")
    sources = results.get("power_sources")
    labels = {str(v) for v in sources.values()} if isinstance(sources, dict) else set()
    out.aspects["power source"] = _text(labels)
    out.aspects["calibration"] = _calibration(bundle)
    out.aspects.update(_accuracy_aspects(bundle))
    out.aspects["energy basis"] = out.energy_basis
    out.aspects["validity thresholds"] = (_settings_text(options, THRESHOLD_OPTIONS)
                                          if options else "(not recorded)")
    out.aspects["analysis method"] = (_settings_text(options, METHOD_OPTIONS)
                                      if options else "(not recorded)")
    out.aspects["run protocol"] = _run_protocol(runs)
    return out
