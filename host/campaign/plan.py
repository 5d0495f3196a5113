"""A campaign's plan: its configurations, every step in execution order, and a time estimate.

The plan is a pure function of the study file (and its seed), so a resumed campaign rebuilds
exactly the same step list and finds its place in it through the journal.

Order: prepare/quantize every configuration, score accuracy (cached), then the measured runs,
*round by round*: round k runs every configuration once, in an order drawn from
`random.Random(f"{seed}:{k}")`. Slow drift (temperature, background load) therefore spreads
over all configurations instead of biasing the one that happened to run last.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from epi.core.errors import UserError
from epi.core.text import format_duration
from epi.core.vocabulary import Word
from epi.formats.fields import check_id
from host.campaign.accuracy_projection import AccuracyProjection, assumed
from host.campaign.adaptive import plan_lines, round_order, spread_from_analysis
from host.campaign.adaptive_round import decided_rounds
from host.campaign.sizing import (
    SIZING_JSON,
    RunShape,
    SpeedProbe,
    read_sizing,
    size_runs,
)
from host.campaign.study import Study, ThermalRule


@dataclass(frozen=True)
class Config:
    """One configuration: a model file to quantize (or the base itself) and measure."""

    config_id: str  # the analysis' label: the map id, or the base file's stem
    model: str  # the [[models]] name
    map_path: Path | None  # None: the base model itself, or a split
    gguf: Path  # where the measured model file is (or will be); a split's prefill model
    decode_gguf: Path | None = None  # a split configuration's decode model
    parents: tuple[str, str] | None = None  # a split's (prefill, decode) configuration ids

    @property
    def is_split(self) -> bool:
        return self.decode_gguf is not None


class StepKind(Word):
    """What a campaign step does (a run step settles the node first, then measures)."""

    PREPARE = "prepare"
    QUANTIZE = "quantize"
    DATA = "data"
    ACCURACY = "accuracy"
    RUN = "run"
    ANALYSIS = "analysis"
    REPORT = "report"


# the steps that close a campaign from what its other steps left: run in-process, in this order
CLOSING_STEPS = (StepKind.ANALYSIS, StepKind.REPORT)


@dataclass(frozen=True)
class Step:
    step_id: str
    kind: StepKind
    config: str | None = None
    round: int | None = None
    estimate_s: float = 0.0
    detail: str = ""
    estimate_known: bool = True  # False: no basis for a figure (estimate_s is 0), said so
    take: int = 1  # a run step's take in its round: > 1 re-measures a refused run


@dataclass
class Plan:
    study: Study
    configs: list[Config]
    steps: list[Step] = field(default_factory=list)
    accuracy: AccuracyProjection | None = None  # per configuration; measured or assumed

    def config(self, config_id: str) -> Config:
        return next(c for c in self.configs if c.config_id == config_id)

    @property
    def run_steps(self) -> list[Step]:
        return [s for s in self.steps if s.kind == StepKind.RUN]


def scoring_workers(cluster: str | None, stated: int | None) -> int | None:
    """How many workers score accuracy: N for `local:N`, the study's `cluster_workers` for a
    scheduler address (its workers are not known until connected), None without a cluster.
    The accuracy stage's items split evenly over them (host/accuracy/distributed.py)."""
    if cluster is None:
        return None
    if cluster.startswith("local:"):
        return int(cluster.removeprefix("local:"))
    return stated


def base_path(study: Study, model_name: str) -> Path:
    """The base GGUF of a [[models]] entry (a prepared model's path when no path is given)."""
    spec = next(m for m in study.models if m.name == model_name)
    if spec.path is not None:
        return spec.path
    from host.quant.models import model_path

    return model_path(spec.name)


def configurations(study: Study) -> list[Config]:
    from host.quant.mixmap import load_mixmap

    configs: list[Config] = []
    seen: dict[str, str] = {}
    maps = {spec.name: [(p, load_mixmap(p).id) for p in spec.maps] for spec in study.models}
    # a map measured on several models (to see whether its rank transfers) is one
    # configuration per model: MAP.MODEL, so the ids stay distinct and the analysis pairs them
    # by the map id their manifests record
    owners: dict[str, set[str]] = {}
    for name, entries in maps.items():
        for _, map_id in entries:
            owners.setdefault(map_id, set()).add(name)
    for spec in study.models:
        models_dir = study.out / "models" / spec.name
        if spec.include_base:
            base = base_path(study, spec.name)
            configs.append(Config(base.stem, spec.name, None, base))
        for p, map_id in maps[spec.name]:
            shared = len(owners[map_id]) > 1
            cid = check_id(f"{map_id}.{spec.name}", f"{p}: configuration id") if shared \
                else map_id
            configs.append(Config(cid, spec.name, p, models_dir / f"{map_id}.gguf"))
        own = {c.config_id: c for c in configs if c.model == spec.name}
        for k, sp in enumerate(spec.splits):
            for part in ("prefill", "decode"):
                name = getattr(sp, part)
                if name not in own:
                    raise UserError(f"{study.path}: field 'models.splits[{k}].{part}': "
                                    f"{name!r} is not a configuration of model {spec.name!r} "
                                    f"({', '.join(own)})")
            configs.append(Config(sp.config_id, spec.name, None, own[sp.prefill].gguf,
                                  decode_gguf=own[sp.decode].gguf,
                                  parents=(sp.prefill, sp.decode)))
    for c in configs:
        if c.config_id in seen:
            raise UserError(f"{c.map_path or c.gguf}: configuration id {c.config_id!r} is used "
                            f"twice (also {seen[c.config_id]}): give the maps distinct ids")
        seen[c.config_id] = str(c.map_path or c.gguf)
    if study.baseline is not None and study.baseline not in seen:
        raise UserError(f"{study.path}: field 'study.baseline': {study.baseline!r} is not one of "
                        f"the configurations ({', '.join(seen)})")
    return configs


def trace_dirs(study: Study) -> list[Path]:
    """Each meter's trace directory, in the study's meter order (the analysis pairs the k-th
    with the runs' k-th meter): `trace` of a running daemon; OUT/trace (the first) or
    OUT/trace-K of a daemon the campaign emulates."""
    return [m.trace if m.trace is not None else
            study.out / ("trace" if k == 0 else f"trace-{k + 1}")
            for k, m in enumerate(study.meters)]


def meter_lines(study: Study) -> list[str]:
    """With several meters: each one, its trace and its nodes (each node is on one meter;
    every run syncs clocks with all of them, the analysis reads every trace)."""
    if len(study.meters) < 2:
        return []
    lines = [f"meters: {len(study.meters)} daemons; every run syncs clocks with each, the "
             "analysis joins their traces in meter 1's clock"]
    for k, (m, d) in enumerate(zip(study.meters, trace_dirs(study), strict=True)):
        what = m.url if m.url else "emulated (started by the campaign)"
        lines.append(f"  meter {k + 1}: {what}, trace {d}, nodes {', '.join(m.nodes)}")
    return lines


def run_seconds(study: Study, n_prompts: int, prompt_tokens: int) -> float:
    """Projected seconds of one `epi run` with the study's settings (estimate rates)."""
    r, e = study.run, study.estimate
    warm = min(r.warmup_tokens or r.tokens, r.tokens)

    def per_pass(tokens: int) -> float:
        return prompt_tokens / e.prefill_tok_s + n_prompts * tokens / e.decode_tok_s

    return (e.load_s + r.warmups * per_pass(warm) + r.repeats_per_run * per_pass(r.tokens)
            + r.repeats_per_run * (r.idle_s + r.cooldown_s))


DEFAULT_METER_RATE_HZ = 20.0  # the emulated daemon's default sweep rate (4 chips, 160 kHz)


def run_shape(study: Study) -> RunShape:
    """What one run of the study does besides its tokens (host/campaign/sizing.py)."""
    from host.run.prompts import load_prompt_set

    r = study.run
    prompts = load_prompt_set(r.prompts).prompts
    return RunShape(n_prompts=len(prompts), prompt_tokens=sum(p.n_tokens for p in prompts),
                    warmups=r.warmups, repeats=r.repeats_per_run,
                    warmup_tokens=r.warmup_tokens,
                    pause_s=r.idle_s + r.cooldown_s, settle_s=settle_seconds(study))


def meter_rate_hz(study: Study) -> float:
    """The sweep rate the sizing assumes: the study's meter rate_hz, else the emulator's
    default (20 Hz for 4 chips at 160 kHz)."""
    return study.meters[0].rate_hz or DEFAULT_METER_RATE_HZ


def settle_seconds(study: Study) -> float:
    t = study.thermal
    return t.wait_s if t.rule == ThermalRule.FIXED else t.window_s


def accuracy_seconds(study: Study) -> float:
    """Assumed scoring time of one model: every item of every benchmark, plus perplexity, at
    the study file's `accuracy_s_per_item` (host.campaign.accuracy_projection measures it)."""
    return assumed(study).seconds


def build_plan(study: Study, accuracy: AccuracyProjection | None = None) -> Plan:
    """The plan; `accuracy` is the projected scoring time per configuration (default: the
    study file's assumption)."""
    from host.run.prompts import load_prompt_set

    configs = configurations(study)
    acc = accuracy or assumed(study)
    plan = Plan(study, configs, accuracy=acc)
    prompts = load_prompt_set(study.run.prompts)
    n_prompts = len(prompts.prompts)
    prompt_tokens = sum(p.n_tokens for p in prompts.prompts)
    e = study.estimate
    steps = plan.steps
    for spec in study.models:
        if spec.path is None:
            steps.append(Step(f"prepare:{spec.name}", StepKind.PREPARE, detail=spec.name,
                              estimate_s=30.0))
    for c in configs:
        if c.map_path is not None:
            base = base_path(study, c.model)
            if base.is_file() or spec_prepared(study, c.model):
                # a prepared model's file appears with its `prepare` step: size unknown yet
                size_mb = base.stat().st_size / 1e6 if base.is_file() else 0.0
                steps.append(Step(f"quantize:{c.config_id}", StepKind.QUANTIZE, c.config_id,
                                  estimate_s=size_mb / e.quantize_mb_s + 1.0,
                                  detail=c.map_path.name))
            else:  # no size to scale by: say so instead of a made-up 1 s
                steps.append(Step(f"quantize:{c.config_id}", StepKind.QUANTIZE, c.config_id,
                                  detail=f"{c.map_path.name} (time unknown: base {base} "
                                  "not on this host)", estimate_known=False))
    a = study.accuracy
    if a.benchmarks or a.ppl:
        steps.append(Step("data", StepKind.DATA, estimate_s=5.0,
                          detail="evaluation data (offline)"))
        workers = scoring_workers(a.cluster, a.cluster_workers)
        where = "" if a.cluster is None else (
            f"; on {workers} Dask worker(s) ({a.cluster})" if workers
            else f"; on {a.cluster} (time not divided: set [accuracy] cluster_workers)")
        for c in configs:
            steps.append(Step(f"accuracy:{c.config_id}", StepKind.ACCURACY, c.config_id,
                              estimate_s=acc.seconds / (workers or 1),
                              detail=", ".join(f"{b} {n}" for b, n in a.benchmarks.items())
                              + where))
    sized = read_sizing(study.out, study.run.tokens) if study.decide else None
    per_run = (sized.per_run_s if sized is not None
               else run_seconds(study, n_prompts, prompt_tokens) + settle_seconds(study))
    all_ids = tuple(c.config_id for c in configs)
    rounds = [(k, all_ids, f"round {k}/{rounds_text(study)}")
              for k in range(1, planned_rounds(study) + 1)]
    if study.decide is not None:  # rounds a recorded decision added (host/campaign/adaptive_loop)
        rounds += [(k, ids, f"round {k} (adaptive, decided after round {k - 1})")
                   for k, ids in decided_rounds(study.out, study.decide.rules.min_rounds)]
    for k, ids, detail in rounds:
        for cid in round_order(ids, study.seed, k):
            steps.append(Step(f"run:{cid}:{k}", StepKind.RUN, cid, k, estimate_s=per_run,
                              detail=detail))
    steps.append(Step("analysis", StepKind.ANALYSIS, estimate_s=10.0 + 2.0 * len(plan.run_steps)))
    steps.append(Step("report", StepKind.REPORT, estimate_s=15.0))
    return plan


def planned_rounds(study: Study) -> int:
    """Rounds every configuration runs: `repeats`, or [decide]'s minimum (more may follow
    for the configurations of undecided comparisons, host/campaign/adaptive.py)."""
    return study.decide.rules.min_rounds if study.decide else study.repeats


def rounds_text(study: Study) -> str:
    """'2', or '3–8 (adaptive)'."""
    if study.decide is None:
        return str(study.repeats)
    r = study.decide.rules
    return f"{r.min_rounds}–{r.max_rounds} (adaptive)"


def power_analysis_lines(study: Study) -> list[str]:
    """[decide]'s rules and the power analysis at the spread this campaign measured last
    (its analysis directory), else the study's assumed spread — said which."""
    if study.decide is None:
        return []
    sd, basis = spread_and_basis(study)
    return plan_lines(study.decide.rules, sd, basis)


def spread_and_basis(study: Study) -> tuple[float, str]:
    """The per-round spread of paired savings (%) the power analysis uses, and whose it is:
    measured by this campaign's last analysis, else the study's assumed_spread_pct."""
    assert study.decide is not None
    sd, n = spread_from_analysis(study.out / "analysis")
    if math.isfinite(sd):
        return sd, f"measured by this campaign's last analysis ({n} rounds)"
    return study.decide.assumed_spread_pct, "assumed (decide.assumed_spread_pct; nothing " \
        "measured yet)"


def sizing_lines(study: Study) -> list[str]:
    """The dry-run's word on run sizing: the kept decision, or what a probe would decide at
    the study file's [estimate] rates."""
    dec = study.decide
    if dec is None or dec.rules.time_budget_s is None:
        return []
    if not dec.size_runs:
        return ["run sizing: off (decide.size_runs = false): runs keep the study's tokens"]
    kept = read_sizing(study.out, study.run.tokens)
    if kept is not None:
        return [f"run sizing (kept in {study.out / SIZING_JSON}):", *kept.lines()]
    e = study.estimate
    guess = SpeedProbe(model="[estimate] rates", threads=study.run.threads or 1,
                       prompt_tokens=0, decode_tokens=0, prefill_tok_s=e.prefill_tok_s,
                       decode_tok_s=e.decode_tok_s, load_s=e.load_s)
    sd, basis = spread_and_basis(study)
    sized = size_runs(study_tokens=study.run.tokens, shape=run_shape(study), probe=guess,
                      n_configs=len(configurations(study)), budget_s=dec.rules.time_budget_s,
                      rate_hz=meter_rate_hz(study), spread_pct=sd, spread_basis=basis,
                      size_for_pct=dec.size_for_pct, min_rounds=dec.rules.min_rounds,
                      max_rounds=dec.rules.max_rounds, alpha=dec.rules.alpha)
    return ["run sizing: before round 1 the campaign times the baseline on this machine and "
            "sizes the tokens per request; at the study file's [estimate] rates it would be:",
            *sized.lines()[1:]]


UNKNOWN_WHY = {"quantize": "the base model file is not on this host: no size to scale by"}


def spec_prepared(study: Study, model_name: str) -> bool:
    """Whether a [[models]] entry is a model the campaign prepares itself (no `path`)."""
    return next(m for m in study.models if m.name == model_name).path is None


def plan_text(plan: Plan, done: set[str] | None = None) -> list[str]:
    """The plan as lines: configurations, the ordered steps, and the time estimate."""
    done = done or set()
    st = plan.study
    lines = [f"study {st.name!r} ({st.path}): {len(plan.configs)} configurations × "
             f"{rounds_text(st)} rounds, seed {st.seed}; campaign directory {st.out}"]
    for c in plan.configs:
        src = c.map_path.name if c.map_path else "base model, not quantized"
        lines.append(f"  {c.config_id:<28} {c.model}: {src}")
    lines.append("steps (in order; * = already finished):")
    for i, s in enumerate(plan.steps, 1):
        mark = "*" if s.step_id in done else " "
        est = format_duration(s.estimate_s) if s.estimate_known else "?"
        lines.append(f" {mark}{i:>4}. {s.step_id:<40} ~{est:>8}"
                     + (f"  {s.detail}" if s.detail else ""))
    by_kind: dict[str, float] = {}
    unknown: dict[str, int] = {}
    for s in plan.steps:
        if s.step_id not in done:
            by_kind[s.kind] = by_kind.get(s.kind, 0.0) + s.estimate_s
            if not s.estimate_known:
                unknown[s.kind] = unknown.get(s.kind, 0) + 1
    total = sum(by_kind.values())
    parts = ", ".join(
        f"{k} ?" if v == 0 and k in unknown else
        f"{k} {format_duration(v)}" + (" + ?" if k in unknown else "") for k, v in by_kind.items())
    lines.append(f"estimate: {format_duration(total)} left ({parts})"
                 + ("" if not unknown else "; NOT included: " + ", ".join(
                     f"{n} {k} step(s) ({UNKNOWN_WHY.get(k, 'no basis for an estimate')})"
                     for k, n in unknown.items())))
    if plan.accuracy is not None and any(s.kind == StepKind.ACCURACY for s in plan.steps):
        lines.append(f"accuracy scoring: ~{format_duration(plan.accuracy.seconds)} per "
                     f"configuration, {plan.accuracy.basis}; cached results take no time")
    t = st.thermal
    rule = (f"fixed wait {t.wait_s:g} s" if t.rule == ThermalRule.FIXED else
            f"idle power stable within ±{t.tolerance:.1%} for {t.window_s:g} s "
            f"(timeout {t.timeout_s:g} s)")
    lines.append(f"thermal settle before every run: {rule}"
                 + (" (every meter's idle power)" if t.rule == ThermalRule.STABLE
                    and len(st.meters) > 1 else ""))
    return lines + meter_lines(st) + power_analysis_lines(st)
