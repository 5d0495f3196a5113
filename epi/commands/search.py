"""`epi search BASE.gguf`: per-layer quantization maps that beat the hand-made ones on EPI."""

from __future__ import annotations

import json
import math
from pathlib import Path
from urllib.parse import urlparse

import click

from epi.commands.params import SEED, THREADS, BoundedInt, FiniteFloat, check_output_dir
from epi.core.errors import UserError
from epi.core.files import write_json_atomic
from epi.core.text import format_table


def _types(value: str | None) -> list[str] | None:
    if value is None:
        return None
    types = [t.strip().upper() for t in value.split(",") if t.strip()]
    if not types:
        raise UserError("--types: give at least two types, e.g. Q8_0,Q5_0,Q4_0")
    return types


def _fmt(x: float | None) -> str:
    return "null" if x is None or not math.isfinite(x) else f"{x:.4g}"


def _ci(v: float | None, lo: float | None, hi: float | None) -> str:
    """'1.23 [1.1, 1.4]', or the value alone where the interval is unknown."""
    if _fmt(lo) == "null" or _fmt(hi) == "null":
        return _fmt(v)
    return f"{_fmt(v)} [{_fmt(lo)}, {_fmt(hi)}]"


def check_meter_options(meter_url: str | None, meter_trace: Path | None,
                        meter_rate_hz: float | None) -> None:
    """Refuse meter options the campaign would refuse, before any probe or round runs."""
    if meter_url is None:
        if meter_trace is not None:
            raise UserError("--meter-trace: only with --meter URL (the emulated meter's trace "
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
        raise UserError("--meter: also give --meter-trace DIR, where this host reads that "
                        "daemon's trace (the campaign cuts each run from it)")
    if not meter_trace.is_dir():
        raise UserError(f"--meter-trace: {meter_trace}: no such directory")


@click.command()
@click.argument("base", type=click.Path(path_type=Path))
@click.option("--out", type=click.Path(path_type=Path), default=Path("out/search"),
              show_default=True, help="Search directory (resumable: run again to continue).")
@click.option("--against", "against", multiple=True, type=click.Path(path_type=Path),
              default=[Path("quantmaps/demo")], show_default=True,
              help="Hand-made maps to beat (files or folders); measured in round 0.")
@click.option("--types", "types_text", default=None,
              help="Allowed tensor types, comma-separated (default: all that fit every tensor).")
@click.option("--max-bpw", type=FiniteFloat(1.0, 32.0), default=None,
              help="Budget: bits per weight of a candidate at most this.")
@click.option("--max-size-mb", type=FiniteFloat(0.0, 1e9, lo_open=True), default=None,
              help="Budget: file size of a candidate at most this.")
@click.option("--min-accuracy", type=FiniteFloat(0.0, 1.0), default=None,
              help="Budget: predicted composite accuracy at least this.")
@click.option("--candidates", type=BoundedInt(1, 200), default=4, show_default=True,
              help="Budget: search candidates measured in total.")
@click.option("--per-round", type=BoundedInt(1, 50), default=2, show_default=True,
              help="Candidates measured per round before the models are refitted.")
@click.option("--objective", type=click.Choice(["epi", "pareto"]), default="epi",
              show_default=True, help="Lowest predicted EPI, or spread along the front.")
@click.option("--text", default="lambada", show_default=True,
              help="Held-out text for the sensitivity proxy: a prepared text name or a file.")
@click.option("--kl-windows", type=BoundedInt(1, 64), default=2, show_default=True,
              help="Windows of held-out text scored per probe.")
@click.option("--kl-ctx", type=BoundedInt(16, 4096), default=256, show_default=True,
              help="Tokens per held-out window.")
@click.option("--meter", "meter_url", default=None,
              help="A running meter daemon's URL (default: the campaign starts the emulator).")
@click.option("--meter-trace", type=click.Path(path_type=Path), default=None,
              help="With --meter: the directory where this host reads that daemon's trace "
                   "(a copy or a network mount); the campaign needs it to cut the runs.")
@click.option("--meter-rate-hz", type=FiniteFloat(0.0, 1000.0, lo_open=True), default=None,
              help="Sample rate of the emulated meter (default: the campaign's, 20 Hz).")
@click.option("--lag", type=click.Choice(["none", "auto"]), default=None,
              help="The analysis' meter-lag handling (`epi analyze --lag`; default: the "
                   "campaign's, none). auto estimates the meter's lag and shifts the windows.")
@click.option("--cv-threshold", type=FiniteFloat(0.0, 1.0, lo_open=True), default=None,
              help="The analysis' repeat-CV limit for a valid run (`epi analyze "
                   "--cv-threshold`; default: the campaign's, 0.03).")
@click.option("--prompts", type=click.Path(path_type=Path, dir_okay=False), default=None,
              help="Prompts file for the measured runs (default: the runner's own prompts).")
@click.option("--tokens", type=BoundedInt(1, 4096), default=256, show_default=True,
              help="Tokens generated per measured request: the decode window must span many "
                   "meter samples (256 at ~100 tok/s is ~2.5 s, ~50 samples at 20 Hz).")
@click.option("--repeats", type=BoundedInt(1, 20), default=3, show_default=True,
              help="Campaign rounds per configuration.")
@click.option("--items", type=BoundedInt(10, 100_000), default=50, show_default=True,
              help="Items per benchmark (MMLU, ARC-Challenge, HellaSwag).")
@click.option("--threads", type=THREADS, default=None,
              help="Threads for the sensitivity probes and scoring (default: every core).")
@click.option("--run-threads", type=THREADS, default=None,
              help="Threads of the metered runs (default: 1 with the emulated meter, leaving a "
                   "core to its daemon as the demo does; else --threads).")
@click.option("--seed", type=SEED, default=0, show_default=True)
def search(base: Path, out: Path, against: tuple[Path, ...], types_text: str | None,
           max_bpw: float | None, max_size_mb: float | None, min_accuracy: float | None,
           candidates: int, per_round: int, objective: str, text: str, kl_windows: int,
           kl_ctx: int, meter_url: str | None, meter_trace: Path | None,
           meter_rate_hz: float | None,
           lag: str | None, cv_threshold: float | None, prompts: Path | None, tokens: int,
           repeats: int, items: int,
           threads: int | None, run_threads: int | None, seed: int) -> None:
    """Search per-layer quantization maps of BASE (an F16 GGUF) that beat hand-made ones.

    Proxies (per-layer KL sensitivity, a fitted energy model) propose candidates; the most
    promising are measured through `epi campaign`; the models are refitted and the loop
    repeats until --candidates are measured. Only measured figures count.
    """
    import os

    from host.accuracy.evaldata import TEXTS, data_dir, ensure_prepared, text_file
    from host.accuracy.perplexity import read_text
    from host.accuracy.scorer import Scorer
    from host.quant.gguf_info import read_model
    from host.quant.mixmap import collect_map_files
    from host.search.driver import SearchSettings, run_search, summary
    from host.search.figure import plot_search
    from host.search.measure import CampaignSettings, campaign_measurer, check_study
    from host.search.optimizer import Budget
    from host.search.page import write_page
    from host.search.sensitivity import (
        held_out_windows,
        mean_kl,
        measure_sensitivity,
        model_logprobs,
    )
    from host.search.space import build_space

    check_output_dir(out, "--out")
    if prompts is not None and not prompts.is_file():
        raise UserError(f"--prompts: {prompts}: no such file")
    check_meter_options(meter_url, meter_trace, meter_rate_hz)
    model = read_model(base)
    if model.shape.n_layers < 1:
        raise UserError(f"{base}: no transformer layers to search over")
    space = build_space(model, _types(types_text))
    against_files = collect_map_files(list(against))
    if not against_files:
        raise UserError("--against: no hand-made maps found to compare with")
    threads = threads or os.cpu_count() or 1
    if run_threads is None:
        run_threads = 1 if meter_url is None else threads
    campaign = CampaignSettings(
        base=base, emulate=meter_url is None, meter_url=meter_url, meter_trace=meter_trace,
        rate_hz=meter_rate_hz, lag=lag, cv_threshold=cv_threshold,
        repeats=repeats, prompts=prompts,
        tokens=tokens, threads=run_threads, seed=seed,
        benchmarks={"mmlu": items, "arc_challenge": items, "hellaswag": items},
        accuracy_threads=os.cpu_count() or 1,
    )
    out.mkdir(parents=True, exist_ok=True)
    check_study(campaign, against_files, out)
    click.echo(f"search space: {space.n_layers} layers × {len(space.types)} types "
               f"({', '.join(space.types)}); non-block {space.non_block}")

    if Path(text).is_file():
        text_path = Path(text)
    elif text in TEXTS:
        ensure_prepared(texts=[text], echo=click.echo)
        text_path = text_file(data_dir(), text)[0]
    else:
        raise UserError(f"--text: {text!r} is neither a file nor a prepared text name "
                        f"({', '.join(TEXTS)})")
    with Scorer(base, n_ctx=kl_ctx, threads=threads) as scorer:
        toks = scorer.tokenize(read_text(text_path))
        held = held_out_windows(toks, kl_ctx, kl_windows, str(text_path),
                                scorer.bos if scorer.add_bos else None)
    kl_table = measure_sensitivity(model, space.types, held, out / "sensitivity", threads,
                                   progress=click.echo)
    base_logp = None

    def direct_kl(gguf_path: Path) -> float:
        nonlocal base_logp
        if base_logp is None:
            base_logp = model_logprobs(base, held, threads)
        return mean_kl(base_logp, model_logprobs(gguf_path, held, threads))

    settings = SearchSettings(
        out=out, budget=Budget(max_bpw, max_size_mb, min_accuracy), candidates=candidates,
        per_round=per_round, objective=objective, against=against_files, seed=seed,
    )
    state, path, predictor = run_search(space, kl_table, settings,
                                        campaign_measurer(campaign, click.echo), direct_kl,
                                        echo=click.echo)
    hand_ids = {json.loads(p.read_text()).get("id") or p.stem for p in against_files}
    doc = summary(state, path, predictor, space, hand_ids)
    write_json_atomic(out / "summary.json", doc)
    rows_by_cfg = {r["config"]: r for r in doc["configs"]}
    for cfg in state.search_maps:
        src = next(out.glob(f"round*/maps/{cfg}.json"), None)
        if src is not None:
            write_found_map(src, out / "maps" / src.name, rows_by_cfg.get(cfg))
    figures = plot_search(doc, out)
    pages = write_page(doc, out, figures[0])
    rows = []
    for r in doc["configs"]:
        m = r["measured"]
        lo, hi = r.get("predicted_epi_interval") or (None, None)
        rows.append([r["config"], r["kind"], r.get("assignment", ""),
                     _fmt(r.get("proxy_kl_nats")),
                     _fmt(r.get("predicted_j_per_token")), _ci(m["j_per_token"],
                                                               *m["j_per_token_ci"]),
                     _fmt(r.get("energy_residual_j")),
                     _fmt(r.get("predicted_accuracy")), _fmt(m["accuracy"]),
                     _ci(r.get("predicted_epi"), lo, hi), _ci(m["epi"], *m["epi_ci"]),
                     m["power_source"] or "?", m["reason"]])
    click.echo(format_table(
        ["config", "kind", "layers:type", "proxy KL", "J/tok pred", "J/tok meas [CI]",
         "J resid", "acc pred", "acc meas", "EPI pred [PI]", "EPI meas [CI]", "power", "note"],
        rows))
    click.echo("pred = predicted when picked, before measuring (round 0 picks: no fitted model "
               "yet); J resid = measured − final energy fit")
    em, am = doc["energy_model"], doc["accuracy_model"]
    click.echo(f"energy model: J/token = {_fmt(em['intercept_j'])} + {_fmt(em['j_per_gb'])}·GB "
               f"(n={em['n']}, residual sd {_fmt(em['residual_sd_j'])} J; prefill is in the "
               f"intercept); accuracy model: acc = {_fmt(am['intercept'])} + "
               f"{_fmt(am['per_nat'])}·KL (n={am['n']}, KL of the whole file"
               + ("; slope held at 0: the free fit's was positive" if am.get("clamped") else "")
               + ")")
    click.echo(f"rank correlation with the composite: summed per-layer proxy "
               f"{_fmt(doc['proxy_rank_correlation'])} (n={doc['proxy_rank_correlation_n']}), "
               f"direct whole-file KL {_fmt(doc['direct_kl_rank_correlation'])}; with the "
               f"perplexity: direct KL {_fmt(doc['direct_kl_ppl_rank_correlation'])}, summed "
               f"proxy {_fmt(doc['proxy_ppl_rank_correlation'])} "
               f"(n={doc['ppl_rank_correlation_n']})")
    click.echo(f"frontier: {doc['verdict']['frontier']['text']}")
    click.echo(f"verdict: {doc['verdict']['text']}")
    click.echo(f"wrote {out}/summary.json, {out}/maps/, {figures[0]}, {pages[0]}, {pages[1]}")


def write_found_map(src: Path, dst: Path, row: dict | None) -> None:
    """Copy a found map into OUT/maps with its measured and pick-time predicted EPI appended to
    its free-text `description` (the only free-text field the map format has), so the file
    carries its own figures. The round's copy, which the campaign measured, is left as it is."""
    doc = json.loads(src.read_text())
    if row is not None:
        m = row["measured"]
        lo, hi = row.get("predicted_epi_interval") or (None, None)
        doc["description"] = (
            f"{doc.get('description', '')}. Measured EPI {_ci(m['epi'], *m['epi_ci'])} "
            f"(J/token {_ci(m['j_per_token'], *m['j_per_token_ci'])}, accuracy "
            f"{_fmt(m['accuracy'])}; power: {m['power_source'] or 'not stated'}"
            + (f"; {m['reason']}" if m["reason"] else "") + "); predicted when picked: EPI "
            f"{_ci(row.get('predicted_epi'), lo, hi)}"
        )
    dst.parent.mkdir(parents=True, exist_ok=True)
    dst.write_text(json.dumps(doc, indent=2) + "\n")
