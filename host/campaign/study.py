"""The study file (TOML): what a campaign runs, read and checked before anything starts.

Every problem is one `UserError` line naming the file, the field and the problem. Paths in the
file (maps, prompts, base models, the campaign directory) are relative to the study file.
docs/campaign.md documents every field; `examples/study-demo.toml` and
`hardware/study-paper-llama-3.1-8b.toml` are complete examples.
"""

from __future__ import annotations

import glob
import math
import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TypeVar, cast, overload
from urllib.parse import urlsplit

from epi.core.errors import UserError
from epi.core.limits import DAY_S, MAX_SEED, MAX_THREADS
from epi.core.vocabulary import Word, one_of
from epi.formats.fields import check_id, read_toml_file
from host.analysis.model import Options
from host.analysis.vocabulary import EnergyBasis, EnergyMethod, LagMode
from host.campaign.adaptive import MAX_REMEASURE, TARGETS, DecisionRules
from host.campaign.analysis_rules import ANALYSIS_REALS, GUIDANCE_REALS, MIN_SAMPLES
from host.campaign.meter import ACTIVITIES

T = TypeVar("T")


class ThermalRule(Word):
    """How the campaign lets a node settle before each run (host/campaign/thermal.py)."""

    FIXED = "fixed"  # wait a fixed time
    STABLE = "stable"  # wait until every meter's idle power holds still


THERMAL_RULES = ThermalRule.values()
KNOWN_SECTIONS = {"study", "models", "run", "meter", "accuracy", "thermal", "analysis",
                  "estimate", "decide"}


@dataclass(frozen=True)
class ModelSpec:
    """One base model and the maps it is quantized with."""

    name: str  # a prepared model name (`epi model prepare`) or a label for `path`
    path: Path | None  # an F16/BF16 base GGUF; None: the prepared model `name`
    maps: tuple[Path, ...]
    include_base: bool
    splits: tuple[SplitSpec, ...] = ()


@dataclass(frozen=True)
class SplitSpec:
    """A split configuration (docs/campaign.md): one model's prefill on one of its
    configurations, its decode on another (both quantizations of the same base)."""

    config_id: str
    prefill: str  # a configuration id of the same [[models]] entry (a map id, or the base)
    decode: str


@dataclass(frozen=True)
class RunSpec:
    tokens: int = 16
    repeats_per_run: int = 3
    warmups: int = 1
    warmup_tokens: int | None = None  # tokens per warm-up request (None: `tokens`)
    prompts: Path | None = None
    threads: int | None = None
    idle_s: float = 3.0
    cooldown_s: float = 1.0
    workers: str | None = None
    split: str | None = None
    node: str | None = None


@dataclass(frozen=True)
class MeterSpec:
    """One meter daemon of the study: a running one (`url`, `trace`) or one the campaign
    starts (`emulate`); `nodes` are the nodes its channels meter (required with several)."""

    url: str | None = None
    trace: Path | None = None  # where this host reads the trace of a meter at `url`
    emulate: bool = False
    rate_hz: float | None = None
    activity: str = "process_tree"  # what the emulated channel 0 follows (host/campaign/meter.py)
    nodes: tuple[str, ...] = ()  # node names on this meter's channels, in channel order


@dataclass(frozen=True)
class AccuracySpec:
    benchmarks: dict[str, int] = field(default_factory=dict)  # name -> items (seeded subset)
    ppl: str | None = None
    ppl_windows: int | None = 10
    threads: int = 1
    seed: int = 0
    # few-shot examples per benchmark (a study file without `shots` gets the study's counts)
    shots: dict[str, int] = field(default_factory=dict)
    shot_seed: int = 1234
    cluster: str | None = None  # score on Dask workers: "tcp://HOST:PORT" or "local:N"
    cluster_workers: int | None = None  # a scheduler's worker count, for the time estimate
    store: Path | None = None  # the accuracy store every scorer shares (EPI_ACCURACY_STORE)


@dataclass(frozen=True)
class ThermalSpec:
    rule: ThermalRule = ThermalRule.FIXED
    wait_s: float = 0.0  # fixed rule
    tolerance: float = 0.02  # stable rule: every reading within ±tolerance of the window mean
    window_s: float = 10.0
    timeout_s: float = 120.0
    poll_s: float = 0.5


@dataclass(frozen=True)
class DecideSpec:
    """The [decide] table: adaptive rounds (host/campaign/adaptive.py)."""

    rules: DecisionRules
    assumed_spread_pct: float = 3.0  # the dry-run's power analysis until a spread is measured
    size_runs: bool = True  # with a time budget: tokens per request sized to this machine
    size_for_pct: float = 10.0  # the difference the sizing gives enough rounds to decide


@dataclass(frozen=True)
class Estimate:
    """Rates the dry-run time estimate uses until measured ones exist (docs/campaign.md)."""

    decode_tok_s: float = 20.0
    prefill_tok_s: float = 200.0
    load_s: float = 3.0
    quantize_mb_s: float = 40.0
    accuracy_s_per_item: float = 1.0


# [analysis] keys that are things the campaign does before analysing, not `epi analyze` options
CAMPAIGN_ACTIONS = ("compute_probe",)


@dataclass(frozen=True)
class AnalysisSpec:
    """The [analysis] table: the analysis options a study sets (None: the analysis'
    default, host.analysis.model.Options)."""

    energy_basis: EnergyBasis | None = None
    energy_method: EnergyMethod | None = None
    lag: LagMode | None = None
    cv_threshold: float | None = None
    max_offset_frac: float | None = None
    max_lag_error_frac: float | None = None
    ppl_tolerance: float | None = None
    max_resolution_frac: float | None = None
    min_samples: int | None = None
    reference_map: str | None = None
    guidance_accuracy_loss: float | None = None
    guidance_j_budget: float | None = None
    # measure this node's per-type compute cost before the analysis (host/run/compute_probe.py)
    compute_probe: bool | None = None

    def given(self) -> dict[str, str | float | int]:
        """The fields the study file sets."""
        return {k: v for k, v in vars(self).items() if v is not None}

    def options(self, baseline: str | None) -> Options:
        """The analysis options: the study's fields over the analysis' defaults."""
        d = Options()
        return Options(
            baseline=baseline,
            energy_basis=_or(self.energy_basis, d.energy_basis),
            energy_method=_or(self.energy_method, d.energy_method),
            lag=_or(self.lag, d.lag),
            cv_threshold=_or(self.cv_threshold, d.cv_threshold),
            max_offset_frac=_or(self.max_offset_frac, d.max_offset_frac),
            max_lag_error_frac=_or(self.max_lag_error_frac, d.max_lag_error_frac),
            ppl_tolerance=_or(self.ppl_tolerance, d.ppl_tolerance),
            max_resolution_frac=_or(self.max_resolution_frac, d.max_resolution_frac),
            min_samples=_or(self.min_samples, d.min_samples),
            reference_map=self.reference_map,
            guidance_accuracy_loss=_or(self.guidance_accuracy_loss, d.guidance_accuracy_loss),
            guidance_j_budget=_or(self.guidance_j_budget, d.guidance_j_budget))


def _or(value: T | None, default: T) -> T:
    return default if value is None else value


WordT = TypeVar("WordT", bound=Word)


def _word(table: _Reader, key: str, vocab: type[WordT]) -> WordT | None:
    """The table's `key` as a word of `vocab` (None when absent), refused outside it."""
    text = table.get(key, str)
    if text is None:
        return None
    word = vocab.parse(text)
    if word is None:
        raise table.fail(key, "expected " + one_of(vocab.values()))
    return word


@dataclass(frozen=True)
class Study:
    path: Path
    name: str
    seed: int
    repeats: int
    out: Path
    baseline: str | None
    models: tuple[ModelSpec, ...]
    run: RunSpec
    meters: tuple[MeterSpec, ...]  # one or more daemons, in `epi run --meter` order
    accuracy: AccuracySpec
    thermal: ThermalSpec
    analysis: AnalysisSpec
    estimate: Estimate
    decide: DecideSpec | None = None  # None: the fixed protocol, `repeats` rounds

    @property
    def meter(self) -> MeterSpec:
        """The first meter (the only one of a study with a single `[meter]` table)."""
        return self.meters[0]


class _Reader:
    """Typed access to one TOML table; every error names file and field."""

    def __init__(self, path: Path, table: dict[str, object], prefix: str) -> None:
        self.path, self.table, self.prefix = path, table, prefix
        self.used: set[str] = set()

    def fail(self, key: str, problem: str) -> UserError:
        where = f"{self.prefix}.{key}" if self.prefix else key
        return UserError(f"{self.path}: field {where!r}: {problem}")

    def _value(self, key: str, kinds: tuple[type, ...]) -> object:
        """The field's value when present (None when absent), of one of `kinds`."""
        self.used.add(key)
        if key not in self.table:
            return None
        value = self.table[key]
        if (isinstance(value, bool) and bool not in kinds) or not isinstance(value, kinds):
            raise self.fail(key, f"expected {_kind_text(kinds)}, got {value!r}")
        return value

    @overload
    def get(self, key: str, kind: type[T], default: T) -> T: ...
    @overload
    def get(self, key: str, kind: type[T], default: None = None) -> T | None: ...
    def get(self, key: str, kind: type[T], default: T | None = None) -> T | None:
        value = self._value(key, (kind,))
        return default if value is None else cast(T, value)  # checked by _value

    def need(self, key: str, kind: type[T]) -> T:
        value = self.get(key, kind)
        if value is None:
            raise self.fail(key, "missing")
        return value

    def _number(self, key: str, low: float, kinds: tuple[type, ...], strict: bool,
                high: float | None) -> float | int | None:
        value = self._value(key, kinds)
        if not isinstance(value, (int, float)):
            return None
        if not math.isfinite(value):
            raise self.fail(key, f"{value} is not a finite number")
        if value < low or (strict and value == low):
            raise self.fail(key, f"{value} must be {'above' if strict else 'at least'} {low}")
        if high is not None and value > high:
            raise self.fail(key, f"{value} must be at most {high}")
        return value

    @overload
    def integer(self, key: str, default: int, low: int, *, high: int | None = None) -> int: ...
    @overload
    def integer(self, key: str, default: None, low: int, *, high: int | None = None
                ) -> int | None: ...
    def integer(self, key: str, default: int | None, low: int, *, high: int | None = None
                ) -> int | None:
        """A whole number in [low, high] (the default when absent)."""
        value = self._number(key, low, (int,), False, high)
        return default if value is None else int(value)

    @overload
    def real(self, key: str, default: float, low: float, *, strict: bool = False,
             high: float | None = None) -> float: ...
    @overload
    def real(self, key: str, default: None, low: float, *, strict: bool = False,
             high: float | None = None) -> float | None: ...
    def real(self, key: str, default: float | None, low: float, *, strict: bool = False,
             high: float | None = None) -> float | None:
        """A finite number in [low, high] ((low, high] with strict; the default when absent)."""
        value = self._number(key, low, (int, float), strict, high)
        return default if value is None else float(value)

    def finish(self) -> None:
        unknown = sorted(set(self.table) - self.used)
        if unknown:
            raise self.fail(unknown[0], "unknown field (see docs/campaign.md)")


def _kind_text(kinds: tuple[type, ...]) -> str:
    names = {int: "an integer", float: "a number", str: "a string", bool: "true or false",
             list: "a list", dict: "a table"}
    return " or ".join(names.get(k, k.__name__) for k in kinds)


def _table(path: Path, doc: dict[str, object], name: str) -> _Reader:
    value = doc.get(name, {})
    if not isinstance(value, dict):
        raise UserError(f"{path}: field {name!r}: expected a table [{name}]")
    return _Reader(path, value, name)


def expand_maps(study_path: Path, where: str, items: list[object]) -> tuple[Path, ...]:
    """Map entries (files, folders, globs; relative to the study file) → map files, in order.
    A file named twice (by any two entries) is refused: it would be one configuration."""
    out: list[Path] = []
    base = study_path.parent
    for i, item in enumerate(items):
        if not isinstance(item, str) or not item:
            raise UserError(f"{study_path}: field '{where}[{i}]': expected a path or glob")
        pattern = str(base / item) if not Path(item).is_absolute() else item
        if any(ch in item for ch in "*?["):
            found = sorted(Path(p) for p in glob.glob(pattern) if p.endswith(".json"))
            if not found:
                raise UserError(f"{study_path}: field '{where}[{i}]': {item!r} matches no "
                                "*.json map")
            out += found
            continue
        p = Path(pattern)
        if p.is_dir():
            found = sorted(p.glob("*.json"))
            if not found:
                raise UserError(f"{study_path}: field '{where}[{i}]': directory {item!r} "
                                "holds no *.json map")
            out += found
        elif p.is_file():
            out.append(p)
        else:
            raise UserError(f"{study_path}: field '{where}[{i}]': {item!r} not found")
    seen: set[Path] = set()
    for p in out:
        if p.resolve() in seen:
            raise UserError(f"{study_path}: field '{where}': {p} is listed twice (one map, "
                            "one configuration)")
        seen.add(p.resolve())
    return tuple(out)


def _models(path: Path, doc: dict[str, object]) -> tuple[ModelSpec, ...]:
    raw = doc.get("models")
    if not isinstance(raw, list) or not raw:
        raise UserError(f"{path}: field 'models': expected one or more [[models]] tables")
    out = []
    names: dict[str, int] = {}
    for i, entry in enumerate(raw):
        if not isinstance(entry, dict):
            raise UserError(f"{path}: field 'models[{i}]': expected a table")
        r = _Reader(path, entry, f"models[{i}]")
        name = r.need("name", str)
        check_id(name, f"{path}: field 'models[{i}].name'")  # becomes OUT/models/NAME
        if name in names:  # one name, one base model: a second would quantize from the first
            raise r.fail("name", f"{name!r} is already the name of models[{names[name]}]; "
                         "give each [[models]] entry its own name")
        names[name] = i
        p = r.get("path", str)
        maps = r.get("maps", list, [])
        include_base = r.get("include_base", bool, False)
        splits = _splits(path, r.get("splits", list, []), f"models[{i}].splits")
        r.finish()
        if not maps and not include_base:
            raise r.fail("maps", "no maps and include_base = false: nothing to run")
        base_path = None
        if p is not None:
            base_path = Path(p) if Path(p).is_absolute() else path.parent / p
        out.append(ModelSpec(name, base_path, expand_maps(path, f"models[{i}].maps", maps),
                             include_base, splits))
    return tuple(out)


def _splits(path: Path, raw: list[object], field: str) -> tuple[SplitSpec, ...]:
    """`splits = [{ id = "...", prefill = "MAP_ID", decode = "MAP_ID" }, ...]`; whether the
    two name configurations of the model is checked with the configurations (plan.py)."""
    out = []
    for k, entry in enumerate(raw):
        if not isinstance(entry, dict):
            raise UserError(f"{path}: field '{field}[{k}]': expected a table "
                            "{ id = ..., prefill = ..., decode = ... }")
        r = _Reader(path, entry, f"{field}[{k}]")
        ids = {key: r.need(key, str) for key in ("id", "prefill", "decode")}
        r.finish()
        for key, value in ids.items():
            check_id(value, f"{path}: field '{field}[{k}].{key}'")
        if ids["prefill"] == ids["decode"]:
            raise r.fail("decode", f"the same configuration as prefill ({ids['decode']!r}): a "
                         "split needs two (measure that one as itself)")
        out.append(SplitSpec(ids["id"], ids["prefill"], ids["decode"]))
    return tuple(out)


MAX_NODES_EMULATED = 4  # an epi-meter board has 4 chips: the emulated board the campaign writes


def _meter(path: Path, m: _Reader) -> MeterSpec:
    """One meter table ([meter] or one [[meter]] entry), checked on its own."""
    trace = m.get("trace", str)
    raw_nodes = m.get("nodes", list, [])
    meter = MeterSpec(url=m.get("url", str), emulate=m.get("emulate", bool, False),
                      rate_hz=m.real("rate_hz", None, 0.0, strict=True, high=1000.0),
                      trace=(path.parent / trace) if trace else None,
                      activity=m.get("activity", str, "process_tree"))
    m.finish()
    nodes: list[str] = []
    for i, node in enumerate(raw_nodes):
        if not isinstance(node, str):
            raise m.fail(f"nodes[{i}]", f"expected a node name, got {node!r}")
        check_id(node, f"{path}: field '{m.prefix}.nodes[{i}]'")
        if node in nodes:
            raise m.fail(f"nodes[{i}]", f"{node!r} is listed twice")
        nodes.append(node)
    if meter.activity not in ACTIVITIES:
        raise m.fail("activity", f"{meter.activity!r} is not one of {', '.join(ACTIVITIES)}")
    if "activity" in m.table and not meter.emulate:
        raise m.fail("activity", "only for emulate = true (a real meter measures the node)")
    if bool(meter.url) == meter.emulate:
        raise m.fail("url", "give either url = \"http://meter:8757\" or emulate = true "
                     "(exactly one)")
    if meter.url:
        u = urlsplit(meter.url)
        if u.scheme not in ("http", "https") or not u.hostname:
            raise m.fail("url", f"{meter.url!r} is not a daemon URL such as "
                         "\"http://epi-meter.local:8757\"")
    if meter.url and meter.trace is None:
        raise m.fail("trace", "missing: with url, say where this host reads the meter's trace "
                     "directory (e.g. a copy or a network mount)")
    if meter.emulate and meter.trace is not None:
        raise m.fail("trace", "only with url (an emulated daemon writes its trace in the "
                     "campaign directory)")
    if meter.trace is not None and meter.trace.exists() and not meter.trace.is_dir():
        raise m.fail("trace", f"{meter.trace} is not a directory")
    if meter.rate_hz is not None and not meter.emulate:
        raise m.fail("rate_hz", "only for emulate = true (a real meter's rate is its board's)")
    if meter.emulate and len(nodes) > MAX_NODES_EMULATED:
        raise m.fail("nodes", f"{len(nodes)} nodes: an emulated board has at most "
                     f"{MAX_NODES_EMULATED} channels")
    return replace(meter, nodes=tuple(nodes))


def _url_key(url: str) -> str:
    """A daemon URL as compared for duplicates: scheme, lower-case host, port, no slash."""
    u = urlsplit(url)
    try:
        port = u.port or (443 if u.scheme == "https" else 80)
    except ValueError:  # a port out of range: compare the text
        return url.rstrip("/").lower()
    return f"{u.scheme}://{(u.hostname or '').lower()}:{port}{u.path.rstrip('/')}"


def _meters(path: Path, doc: dict[str, object]) -> tuple[MeterSpec, ...]:
    """`[meter]` (one daemon) or `[[meter]]` (one table per daemon, in `--meter` order).

    With several, every meter names its `nodes`; no URL, trace directory or node twice."""
    raw = doc.get("meter", {})
    if isinstance(raw, dict):
        return (_meter(path, _Reader(path, raw, "meter")),)
    if not isinstance(raw, list) or not raw:
        raise UserError(f"{path}: field 'meter': expected a [meter] table or one or more "
                        "[[meter]] tables")
    out: list[MeterSpec] = []
    urls: dict[str, int] = {}
    traces: dict[Path, int] = {}
    nodes: dict[str, int] = {}
    for i, entry in enumerate(raw):
        if not isinstance(entry, dict):
            raise UserError(f"{path}: field 'meter[{i}]': expected a table")
        r = _Reader(path, entry, f"meter[{i}]")
        m = _meter(path, r)
        if len(raw) > 1 and not m.nodes:
            raise r.fail("nodes", "missing: with several meters, name the nodes each one "
                         "meters, e.g. nodes = [\"pi1\", \"pi2\"]")
        if m.url:
            key = _url_key(m.url)
            if key in urls:
                raise r.fail("url", f"{m.url!r} is also meter[{urls[key]}]'s: one daemon, "
                             "one [[meter]] table")
            urls[key] = i
        if m.trace is not None:
            t = m.trace.resolve()
            if t in traces:
                raise r.fail("trace", f"{m.trace} is also meter[{traces[t]}]'s trace: each "
                             "daemon writes its own")
            traces[t] = i
        for j, node in enumerate(m.nodes):
            if node in nodes:
                raise r.fail(f"nodes[{j}]", f"node {node!r} is also on meter[{nodes[node]}]: "
                             "a node is metered by one meter")
            nodes[node] = i
        out.append(m)
    return tuple(out)


def _check_run_nodes(path: Path, run: RunSpec, meters: tuple[MeterSpec, ...]) -> None:
    """With several meters, the run's named nodes (`node`, workers NAME=HOST:PORT) must each
    be on one of them: a node no meter meters would stop the analysis after the runs."""
    if len(meters) < 2:
        return
    known = {n for m in meters for n in m.nodes}
    named: list[tuple[str, str]] = []
    if run.node:
        named.append(("run.node", run.node))
    for i, part in enumerate((run.workers or "").split(",")):
        name, eq, _ = part.strip().partition("=")
        if eq and name.strip():
            named.append((f"run.workers[{i}]", name.strip()))
    for where, name in named:
        if name not in known:
            raise UserError(f"{path}: field {where!r}: node {name!r} is on no meter (nodes: "
                            f"{', '.join(sorted(known))})")


def load_study(path: Path | str) -> Study:
    """Read and check a study file; raise one-line UserErrors. Each table has its reader
    below; they run in the file's documented order, so the first problem reported is the
    same whatever else is wrong."""
    path = Path(path)
    doc = read_toml_file(path, "study file")
    unknown = sorted(set(doc) - KNOWN_SECTIONS)
    if unknown:
        raise UserError(f"{path}: field {unknown[0]!r}: unknown section (see docs/campaign.md)")
    head = _study_table(path, doc)
    run = _run_table(path, doc)
    meters = _meters(path, doc)
    _check_run_nodes(path, run, meters)
    accuracy = _accuracy_table(path, doc)
    thermal = _thermal_table(path, doc)
    analysis = _analysis_table(path, doc)
    estimate = _estimate_table(path, doc)
    decide = _decide(path, doc, repeats_given=head.repeats_given)
    return Study(path=path, name=head.name, seed=head.seed, repeats=head.repeats,
                 out=head.out, baseline=head.baseline, models=_models(path, doc), run=run,
                 meters=meters, accuracy=accuracy, thermal=thermal, analysis=analysis,
                 estimate=estimate, decide=decide)


@dataclass(frozen=True)
class _StudyHead:
    """`[study]`: what names the campaign and where it writes."""

    name: str
    seed: int
    repeats: int
    out: Path
    baseline: str | None
    repeats_given: bool  # `repeats` written (a [decide] table then refuses it)


def _study_table(path: Path, doc: dict[str, object]) -> _StudyHead:
    """`[study]`: the name (a directory name), seed, repeats, output directory, baseline."""
    s = _table(path, doc, "study")
    name = s.get("name", str, path.stem)
    # The name becomes a directory name (out/campaign-NAME); the default is the file's stem.
    check_id(name, f"{path}: field 'study.name'" + ("" if "name" in s.table else
                                                    " (default: the file's name)"))
    seed = s.integer("seed", 0, 0, high=MAX_SEED)
    repeats = s.integer("repeats", 3, 1, high=1000)
    out_text = s.get("out", str, f"out/campaign-{name}")
    baseline = s.get("baseline", str)
    s.finish()
    out = Path(os.path.normpath(Path(out_text) if Path(out_text).is_absolute()
                                else path.parent / out_text))
    return _StudyHead(name, seed, repeats, out, baseline, "repeats" in s.table)


def _run_table(path: Path, doc: dict[str, object]) -> RunSpec:
    """`[run]`: the settings every `epi run` of the campaign gets."""
    r = _table(path, doc, "run")
    prompts = r.get("prompts", str)
    run = RunSpec(
        tokens=r.integer("tokens", 16, 2, high=1_000_000),
        repeats_per_run=r.integer("repeats_per_run", 3, 2, high=10_000),
        warmups=r.integer("warmups", 1, 0, high=1000),
        warmup_tokens=r.integer("warmup_tokens", None, 1, high=1_000_000),
        prompts=(path.parent / prompts) if prompts else None,
        threads=r.integer("threads", None, 1, high=MAX_THREADS),
        idle_s=r.real("idle_s", 3.0, 0.0, high=DAY_S),
        cooldown_s=r.real("cooldown_s", 1.0, 0.0, high=DAY_S),
        workers=r.get("workers", str), split=r.get("split", str), node=r.get("node", str))
    r.finish()
    return run


def _accuracy_table(path: Path, doc: dict[str, object]) -> AccuracySpec:
    """`[accuracy]`: benchmarks and item counts, perplexity, shots, where scoring runs."""
    a = _table(path, doc, "accuracy")
    benches = a.get("benchmarks", dict, {})
    for b, n in benches.items():
        if isinstance(n, bool) or not isinstance(n, int) or not 10 <= n <= 1_000_000:
            raise a.fail(f"benchmarks.{b}", f"item count must be an integer from 10 to "
                         f"1000000, got {n!r}")
    from host.accuracy.items import BENCHMARKS

    for b in benches:
        if b not in BENCHMARKS:
            raise a.fail(f"benchmarks.{b}", f"unknown benchmark (known: {', '.join(BENCHMARKS)})")
    accuracy = AccuracySpec(benchmarks=dict(benches), ppl=a.get("ppl", str),
                            ppl_windows=a.integer("ppl_windows", 10, 1,
                                                 high=100_000),
                            threads=a.integer("threads", 1, 1, high=MAX_THREADS),
                            seed=a.integer("seed", 0, 0, high=MAX_SEED),
                            shots=_shots(a, benches),
                            shot_seed=a.integer("shot_seed", 1234, 0, high=MAX_SEED),
                            cluster=_cluster(a),
                            cluster_workers=a.integer("cluster_workers", None, 1,
                                                      high=100_000),
                            store=_store(path, a))
    if accuracy.cluster_workers is not None and not (accuracy.cluster or "").startswith(
            "tcp://"):
        raise a.fail("cluster_workers", "only with cluster = \"tcp://HOST:PORT\" (local:N "
                     "names its own count)")
    a.finish()
    return accuracy


def _thermal_table(path: Path, doc: dict[str, object]) -> ThermalSpec:
    """`[thermal]`: how the node settles before each run."""
    t = _table(path, doc, "thermal")
    rule_word = t.get("rule", str, ThermalRule.FIXED)
    rule = ThermalRule.parse(rule_word)
    if rule is None:
        raise t.fail("rule", f"{rule_word!r} is not one of {', '.join(THERMAL_RULES)}")
    thermal = ThermalSpec(rule=rule, wait_s=t.real("wait_s", 0.0, 0.0, high=DAY_S),
                          tolerance=t.real("tolerance", 0.02, 0.0, strict=True, high=1.0),
                          window_s=t.real("window_s", 10.0, 0.0, strict=True, high=DAY_S),
                          timeout_s=t.real("timeout_s", 120.0, 0.0, high=DAY_S),
                          poll_s=t.real("poll_s", 0.5, 0.0, strict=True, high=DAY_S))
    t.finish()
    return thermal


def _analysis_table(path: Path, doc: dict[str, object]) -> AnalysisSpec:
    """`[analysis]`: `epi analyze`'s options, refused by the same rules
    (host/campaign/analysis_rules.py)."""
    an = _table(path, doc, "analysis")
    fracs = {key: an.real(key, None, r.lo, strict=r.lo_open, high=r.hi)  # as `epi analyze`
             for key, r in {**ANALYSIS_REALS, **GUIDANCE_REALS}.items()}
    analysis = AnalysisSpec(_word(an, "energy_basis", EnergyBasis),
                            _word(an, "energy_method", EnergyMethod), _word(an, "lag", LagMode),
                            fracs["cv_threshold"], fracs["max_offset_frac"],
                            fracs["max_lag_error_frac"], fracs["ppl_tolerance"],
                            fracs["max_resolution_frac"],
                            an.integer("min_samples", None, MIN_SAMPLES.lo,
                                       high=MIN_SAMPLES.hi),
                            an.get("reference_map", str),
                            fracs["guidance_accuracy_loss"], fracs["guidance_j_budget"],
                            an.get("compute_probe", bool))
    if analysis.reference_map is not None:
        check_id(analysis.reference_map, f"{path}: [analysis] reference_map")
    an.finish()
    return analysis


def _estimate_table(path: Path, doc: dict[str, object]) -> Estimate:
    """`[estimate]`: the rates of the time estimate, each above 0."""
    e = _table(path, doc, "estimate")
    d = Estimate()
    estimate = Estimate(**{k: e.real(k, getattr(d, k), 0.0, strict=True)
                           for k in vars(d)})
    e.finish()
    return estimate


def _decide(path: Path, doc: dict[str, object], repeats_given: bool) -> DecideSpec | None:
    """The [decide] table, or None when the study has none (a fixed number of rounds)."""
    if "decide" not in doc:
        return None
    r = _table(path, doc, "decide")
    compare = r.get("compare", list, ["baseline"])
    if not compare:
        raise r.fail("compare", f"name at least one of {', '.join(TARGETS)}")
    for i, t in enumerate(compare):
        if t not in TARGETS:
            raise r.fail(f"compare[{i}]", f"{t!r} is not one of {', '.join(TARGETS)}")
    min_rounds = r.integer("min_rounds", 3, 3, high=1000)
    max_rounds = r.integer("max_rounds", max(min_rounds, 8), min_rounds, high=1000)
    budget_min = r.real("time_budget_min", None, 0.0, strict=True, high=DAY_S / 60)
    margin = r.real("margin_pct", 2.0, 0.0, high=100.0)
    alpha = r.real("alpha", 0.05, 0.0, strict=True, high=0.5)
    spread = r.real("assumed_spread_pct", 3.0, 0.0, strict=True, high=100.0)
    remeasure = r.integer("remeasure", 0, 0, high=MAX_REMEASURE)
    size_runs = r.get("size_runs", bool, True)
    size_for = r.real("size_for_pct", 10.0, 0.0, strict=True, high=100.0)
    r.finish()
    if repeats_given:
        raise UserError(f"{path}: field 'study.repeats': with [decide] the rounds are "
                        "decide.min_rounds to decide.max_rounds; remove study.repeats")
    rules = DecisionRules(targets=tuple(dict.fromkeys(compare)), min_rounds=min_rounds,
                          max_rounds=max_rounds, margin_pct=margin, alpha=alpha,
                          time_budget_s=None if budget_min is None else budget_min * 60.0,
                          remeasure=remeasure)
    return DecideSpec(rules, spread, size_runs=size_runs, size_for_pct=size_for)


def _cluster(a: _Reader) -> str | None:
    """`[accuracy] cluster`, checked by the rule `epi accuracy --cluster` uses."""
    text = a.get("cluster", str)
    if text is None:
        return None
    from host.accuracy.distributed import parse_cluster

    try:
        parse_cluster(text)
    except UserError as exc:
        raise a.fail("cluster", str(exc).removeprefix("--cluster: ")) from None
    return text


def _store(path: Path, a: _Reader) -> Path | None:
    """`[accuracy] store`: a directory every scorer shares (relative to the study file)."""
    text = a.get("store", str)
    if text is None:
        return None
    if not text.strip():
        raise a.fail("store", "an empty path")
    return path.parent / text


def _shots(a: _Reader, benches: dict[str, int]) -> dict[str, int]:
    """`[accuracy] shots = { mmlu = 5, ... }` (absent: the study's MMLU 5, ARC-Challenge 25,
    HellaSwag 10 for the benchmarks scored; 0 for the others)."""
    from host.accuracy.fewshot import STUDY_SHOTS, check_shots

    given = a.get("shots", dict)
    if given is None:
        return {b: STUDY_SHOTS.get(b, 0) for b in benches}
    out = {}
    for b, k in given.items():
        if b not in benches:
            raise a.fail(f"shots.{b}", f"not among the benchmarks scored "
                         f"({', '.join(benches) or 'none'})")
        if isinstance(k, bool) or not isinstance(k, int):
            raise a.fail(f"shots.{b}", f"expected a whole number of shots, got {k!r}")
        try:
            check_shots(b, k)
        except UserError as exc:
            raise a.fail(f"shots.{b}", str(exc)) from None
        out[b] = k
    return out
