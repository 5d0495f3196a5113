"""`epi search`'s one library entry point: from a checked request to the written search
directory (summary.json, OUT/maps, figure, page) and the lines the command prints.

Composition only: the space (host.search.space), the sensitivity proxy
(host.search.sensitivity), the loop (host.search.driver) measuring through the campaign
library (host.search.measure), the figure and the page. The command parses options into a
`SearchRequest` and calls `run`.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlparse

import numpy as np

from epi.core.errors import UserError
from epi.core.files import write_json_atomic
from epi.core.text import format_table
from epi.formats.json_types import JSON
from host.search.optimizer import Budget
from host.search.records import Prediction
from host.search.summary import ConfigRow, SearchSummary, SearchVerdict

Echo = Callable[[str], None]


@dataclass(frozen=True)
class SearchRequest:
    """Everything `epi search` was asked for (docs/search.md)."""

    base: Path
    out: Path
    against: tuple[Path, ...]
    types: list[str] | None = None
    budget: Budget = field(default_factory=Budget)
    candidates: int = 4
    per_round: int = 2
    objective: str = "epi"
    text: str = "lambada"
    kl_windows: int = 2
    kl_ctx: int = 256
    meter_url: str | None = None
    meter_trace: Path | None = None
    meter_rate_hz: float | None = None
    lag: str | None = None
    cv_threshold: float | None = None
    max_resolution_frac: float | None = None
    prompts: Path | None = None
    tokens: int = 256
    repeats: int = 3  # round 0's fixed rounds of the hand-made maps
    cooldown_s: float | None = None  # each repeat's cool-down, s (None: the campaign's)
    idle_s: float | None = None  # each repeat's idle-baseline window, s (None: the campaign's)
    min_rounds: int = 3  # a candidate round's campaign: [decide] min_rounds
    max_rounds: int = 8  # … and max_rounds, each candidate's budget
    margin_pct: float = 2.0  # the smallest J/token difference worth resolving, %
    items: int = 50
    threads: int | None = None
    run_threads: int | None = None
    seed: int = 0
    phase_split: bool = False  # also measure each pick split with the baseline, both ways


@dataclass(frozen=True)
class SearchOutcome:
    summary: SearchSummary  # host.search.driver.summary's result (summary.json)
    figure: Path
    pages: tuple[Path, Path]


def parse_types(value: str | None) -> list[str] | None:
    """`Q8_0,Q5_0` → ['Q8_0', 'Q5_0'] (None: every type that fits)."""
    if value is None:
        return None
    types = [t.strip().upper() for t in value.split(",") if t.strip()]
    if not types:
        raise UserError("--types: give at least two types, e.g. Q8_0,Q5_0,Q4_0")
    return types


def check_meter_options(meter_url: str | None, meter_trace: Path | None,
                        meter_rate_hz: float | None) -> None:
    """Refuse meter options the campaign would refuse, before any probe or round runs."""
    if meter_url is None:
        if meter_trace is not None:
            raise UserError("--trace: only with --meter URL (the emulated meter's trace "
                            "is the campaign's own)")
        return
    parsed = urlparse(meter_url)
    if parsed.scheme not in ("http", "https") or not parsed.netloc:
        raise UserError(f"--meter: {meter_url!r} is not a daemon URL such as "
                        "http://meter:8757")
    if meter_rate_hz is not None:
        raise UserError("--meter-rate-hz: only for the emulated meter (a real meter's rate is "
                        "its board's); leave it out with --meter")
    if meter_trace is None:
        raise UserError("--meter: also give --trace DIR, where this host reads that "
                        "daemon's trace (the campaign cuts each run from it)")
    if not meter_trace.is_dir():
        raise UserError(f"--trace: {meter_trace}: no such directory")


def check_request(req: SearchRequest) -> None:
    """What can be refused before the model is read."""
    if req.prompts is not None and not req.prompts.is_file():
        raise UserError(f"--prompts: {req.prompts}: no such file")
    if req.min_rounds < 3:
        raise UserError(f"--min-rounds: {req.min_rounds} is below 3 (the confidence sequence "
                        "has no finite interval before round 3)")
    if req.max_rounds < req.min_rounds:
        raise UserError(f"--max-rounds: {req.max_rounds} is below --min-rounds "
                        f"({req.min_rounds})")
    check_meter_options(req.meter_url, req.meter_trace, req.meter_rate_hz)


def bound_options(req: SearchRequest, types: list[str] | tuple[str, ...],
                  run_threads: int) -> dict[str, JSON]:
    """The options whose change would make an earlier round's figures another search's: the
    space, the proxy's text and windows, what and how each map is measured. Budget, candidates
    and per-round count are left out: raising them is how a finished search is continued."""
    prompts = (hashlib.sha256(req.prompts.read_bytes()).hexdigest()
               if req.prompts is not None else None)
    return {"types": list(types), "text": req.text, "kl_windows": req.kl_windows,
            "kl_ctx": req.kl_ctx, "objective": req.objective,
            "meter": req.meter_url or "emulated", "meter_rate_hz": req.meter_rate_hz,
            "lag": req.lag, "cv_threshold": req.cv_threshold, "prompts_sha256": prompts,
            "tokens": req.tokens, "repeats": req.repeats, "items": req.items,
            "min_rounds": req.min_rounds, "margin_pct": req.margin_pct,
            "run_threads": run_threads, "seed": req.seed,
            # bound only when given, so a state written before these options existed (the
            # campaign's defaults) still resumes
            **{k: v for k, v in (("cooldown_s", req.cooldown_s), ("idle_s", req.idle_s),
                                 ("max_resolution_frac", req.max_resolution_frac))
               if v is not None},
            # bound only when on: a search without splits keeps the identity it had
            **({"phase_split": True} if req.phase_split else {})}


def _held_out_text(name: str, echo: Echo) -> Path:
    from host.accuracy.evaldata import TEXTS, data_dir, ensure_prepared, text_file

    if Path(name).is_file():
        return Path(name)
    if name in TEXTS:
        ensure_prepared(texts=[name], echo=echo)
        return text_file(data_dir(), name)[0]
    raise UserError(f"--text: {name!r} is neither a file nor a prepared text name "
                    f"({', '.join(TEXTS)})")


def run(req: SearchRequest, echo: Echo) -> SearchOutcome:
    """Search, measure, write OUT (resumable: a second call continues where one stopped)."""
    from host.accuracy.perplexity import read_text
    from host.accuracy.scorer import Scorer
    from host.campaign.adaptive import DecisionRules
    from host.llama.install import llama_info
    from host.quant.gguf_info import read_model
    from host.quant.mixmap import collect_map_files
    from host.search.driver import SearchSettings, check_state, map_id_of, run_search, summary
    from host.search.figure import plot_search
    from host.search.identity import check_unquantized, search_identity
    from host.search.measure import CampaignSettings, campaign_measurer, check_study
    from host.search.page import write_page
    from host.search.sensitivity import (
        held_out_windows,
        mean_kl,
        measure_sensitivity,
        model_logprobs,
    )
    from host.search.space import build_space

    check_request(req)
    model = read_model(req.base)
    check_unquantized(model.tensor_types, req.base)
    if model.shape.n_layers < 1:
        raise UserError(f"{req.base}: no transformer layers to search over")
    space = build_space(model, req.types)
    against_files = collect_map_files(list(req.against))
    if not against_files:
        raise UserError("--against: no hand-made maps found to compare with")
    threads = req.threads or os.cpu_count() or 1
    run_threads = req.run_threads
    if run_threads is None:
        run_threads = 1 if req.meter_url is None else threads
    campaign = CampaignSettings(
        base=req.base, emulate=req.meter_url is None, meter_url=req.meter_url,
        meter_trace=req.meter_trace, rate_hz=req.meter_rate_hz, lag=req.lag,
        cv_threshold=req.cv_threshold, max_resolution_frac=req.max_resolution_frac,
        repeats=req.repeats, prompts=req.prompts,
        cooldown_s=req.cooldown_s, idle_s=req.idle_s,
        tokens=req.tokens, threads=run_threads, seed=req.seed,
        benchmarks={"mmlu": req.items, "arc_challenge": req.items, "hellaswag": req.items},
        accuracy_threads=os.cpu_count() or 1, min_rounds=req.min_rounds,
        max_rounds=req.max_rounds, margin_pct=req.margin_pct,
    )
    out = req.out
    out.mkdir(parents=True, exist_ok=True)
    check_study(campaign, against_files, out)  # round 0: fixed rounds
    check_study(campaign, against_files, out, map_id_of(against_files[0]))  # later: [decide]
    identity = search_identity(req.base, against_files,
                               bound_options(req, space.types, run_threads), llama_info())
    check_state(out / "search.json", identity)  # before the proxy's minutes of work
    echo(f"search space: {space.n_layers} layers × {len(space.types)} types "
         f"({', '.join(space.types)}); non-block {space.non_block}")

    text_path = _held_out_text(req.text, echo)
    with Scorer(req.base, n_ctx=req.kl_ctx, threads=threads) as scorer:
        toks = scorer.tokenize(read_text(text_path))
        held = held_out_windows(toks, req.kl_ctx, req.kl_windows, str(text_path),
                                scorer.bos if scorer.add_bos else None)
    kl_table = measure_sensitivity(model, space.types, held, out / "sensitivity", threads,
                                   progress=echo)
    base_logp: list[np.ndarray] = []

    def direct_kl(gguf_path: Path) -> float:
        if not base_logp:
            base_logp.append(model_logprobs(req.base, held, threads))
        return mean_kl(base_logp[0], model_logprobs(gguf_path, held, threads))

    settings = SearchSettings(
        out=out, budget=req.budget, candidates=req.candidates, per_round=req.per_round,
        objective=req.objective, against=against_files, seed=req.seed,
        identity=identity, phase_split=req.phase_split,
        rules=DecisionRules(("baseline",), req.min_rounds, req.max_rounds,
                            margin_pct=req.margin_pct),
    )
    state, path, predictor = run_search(space, kl_table, settings,
                                        campaign_measurer(campaign, echo), direct_kl,
                                        echo=echo)
    hand_ids = {map_id_of(p) for p in against_files}
    doc = summary(state, path, predictor, space, hand_ids)
    write_json_atomic(out / "summary.json", doc.to_json())
    rows_by_cfg = {r.config: r for r in doc.configs}
    for cfg in state.search_maps:
        src = next(out.glob(f"round*/maps/{cfg}.json"), None)
        if src is not None:
            write_found_map(src, out / "maps" / src.name, rows_by_cfg.get(cfg))
    figures = plot_search(doc, out)
    pages = write_page(doc, out, figures[0])
    return SearchOutcome(doc, figures[0], pages)


def _fmt(x: object) -> str:
    return (f"{x:.4g}" if isinstance(x, (int, float)) and not isinstance(x, bool)
            and math.isfinite(x) else "null")


def _ci(v: object, lo: object, hi: object) -> str:
    """'1.23 [1.1, 1.4]', or the value alone where the interval is unknown."""
    if _fmt(lo) == "null" or _fmt(hi) == "null":
        return _fmt(v)
    return f"{_fmt(v)} [{_fmt(lo)}, {_fmt(hi)}]"


def result_lines(o: SearchOutcome, out: Path) -> list[str]:
    """The table and model lines `epi search` prints at the end."""
    doc = o.summary
    rows = []
    for r in doc.configs:
        m, p = r.measured, r.prediction
        rows.append([r.config, r.kind, r.assignment or "",
                     _fmt(r.proxy_kl_nats),
                     _fmt(p.j_per_token if p is not None else None),
                     _ci(m.j_per_token, *m.j_per_token_ci),
                     _fmt(r.energy_residual_j),
                     _fmt(p.accuracy if p is not None else None), _fmt(m.accuracy),
                     _predicted_epi(p), _ci(m.epi, *m.epi_ci),
                     m.power_source or "?", m.reason])
    pr, verdict = doc.predictor, doc.verdict
    em, am = pr.energy, pr.accuracy
    return [
        format_table(["config", "kind", "layers:type", "proxy KL", "J/tok pred",
                      "J/tok meas [CI]", "J resid", "acc pred", "acc meas", "EPI pred [PI]",
                      "EPI meas [CI]", "power", "note"], rows),
        "pred = predicted when picked, before measuring (from the fit to every map measured "
        "before); J resid = measured − final energy fit",
        f"energy model: J/token = {_fmt(em.intercept)} + {_fmt(em.slope)}·GB "
        f"(n={em.n}, residual sd {_fmt(em.residual_sd)} J; prefill is in the "
        f"intercept); accuracy model: acc = {_fmt(am.intercept)} + "
        f"{_fmt(am.slope)}·KL (n={am.n}, KL of the whole file"
        + ("; slope held at 0: the free fit's was positive" if am.clamped else "")
        + ")",
        f"rank correlation with the composite: summed per-layer proxy "
        f"{_fmt(pr.proxy_rank_correlation)} (n={pr.proxy_n}), "
        f"direct whole-file KL {_fmt(pr.direct_kl_rank_correlation)}; with the "
        f"perplexity: direct KL {_fmt(pr.direct_kl_ppl_rank_correlation)}, summed "
        f"proxy {_fmt(pr.proxy_ppl_rank_correlation)} "
        f"(n={pr.ppl_n})",
        f"frontier: {verdict.frontier.text}",
        *comparison_lines(verdict),
        f"verdict: {verdict.text}",
        f"wrote {out}/summary.json, {out}/maps/, {o.figure}, {o.pages[0]}, {o.pages[1]}",
    ]


def _predicted_epi(p: Prediction | None) -> str:
    """The pick-time EPI with its prediction interval ('null' where there was none)."""
    return _ci(p.epi, *p.epi_interval) if p is not None else _ci(None, None, None)


def comparison_lines(verdict: SearchVerdict) -> list[str]:
    """Each candidate's settled comparison with the best hand-made map, one line each."""
    comps = verdict.comparisons
    counts = verdict.comparison_counts
    head = ("against the best hand-made map, per candidate ("
            + ", ".join(f"{n} {s}" for s, n in sorted(counts.items())) + "):"
            if comps else "against the best hand-made map: no candidate compared yet")
    out = [head] + [f"  {c['config']}: {c['text']}" for c in comps]
    out += [f"  {c}: not compared (measured before comparisons were recorded)"
            for c in verdict.not_compared]
    return out


def write_found_map(src: Path, dst: Path, row: ConfigRow | None) -> None:
    """Copy a found map into OUT/maps with its measured and pick-time predicted EPI appended to
    its free-text `description` (the only free-text field the map format has), so the file
    carries its own figures. The round's copy, which the campaign measured, is left as it is."""
    doc = json.loads(src.read_text())
    if row is not None:
        m = row.measured
        doc["description"] = (
            f"{doc.get('description', '')}. Measured EPI {_ci(m.epi, *m.epi_ci)} "
            f"(J/token {_ci(m.j_per_token, *m.j_per_token_ci)}, accuracy "
            f"{_fmt(m.accuracy)}; power: {m.power_source or 'not stated'}"
            + (f"; {m.reason}" if m.reason else "") + "); predicted when picked: EPI "
            f"{_predicted_epi(row.prediction)}"
        )
    dst.parent.mkdir(parents=True, exist_ok=True)
    dst.write_text(json.dumps(doc, indent=2) + "\n")
