"""Everything the report shows, read from an analysis directory (`epi analyze --out`).

The analysis writes results.json/csv, runs.csv, repeats.csv and windows.csv (docs/formats.md,
docs/analysis.md). This module reads them and derives what the analysis does not publish:

* per-run measured figures for *every* run, invalid ones included (ratio of sums over the
  run's windows with a measured energy), so an invalid run's numbers are shown beside its
  reasons instead of hidden behind null — medians and the frontier keep using valid runs only,
  as the analysis computed them;
* the labels every figure carries: power source (measured / modelled), energy basis and
  method, interval method — taken from the analysis columns (`power_source`, `ci_method`,
  `ci_coverage`) when present, otherwise derived from the trace metadata in results.json;
* per-configuration model facts (file size, bits per weight, early/middle/late types) from
  the quantization manifests next to the model files.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from epi.core.errors import UserError
from epi.formats.analysis import RESULT_FORMAT, RESULT_VERSION
from epi.formats.fields import check_format, read_json_object
from epi.formats.manifests import (
    ModelManifest,
    QuantManifest,
    manifest_beside,
    read_any_manifest,
)
from host.analysis.headline import headline_rows
from host.analysis.intervals import number, pct
from host.analysis.power_source import COMPONENT, MEASURED, MODELLED, PowerKind
from host.analysis.vocabulary import SCOPE_ALL, EnergyBasis, Phase, TokenUnit
from host.campaign.journal import JournalEvent
from host.report import checks
from host.report.layer_columns import layer_group_cells

FILES = ("results.json", "results.csv", "runs.csv", "repeats.csv", "windows.csv")
TOKEN_UNIT = {"prefill": "n_prompt_tokens", "decode": "n_generated_tokens",
              "request": "n_generated_tokens"}


@dataclass
class Labels:
    """What every figure and table says about where its numbers come from."""

    power_source: PowerKind
    power_detail: str
    energy_basis: str  # gross | net
    energy_method: str
    edge_model: str
    ci_text: str  # the headline J/token intervals (interval_text); a caption may give its own

    def power_text(self) -> str:
        """'modelled (ATM90E26 emulator; ...)' — the source once, never doubled when the
        detail already starts with it ('modelled (ActivityModel)')."""
        if self.power_detail.startswith(self.power_source):
            return self.power_detail
        return f"{self.power_source} ({self.power_detail})"

    def tag(self) -> str:
        """The short label each caption keeps: 'modelled power', 'measured power', plus
        'component power, not wall power' when software counters give the figures."""
        text = f"{self.power_source} power"
        if COMPONENT in self.power_detail:
            text += f" ({COMPONENT})"
        return f"{text}, {self.energy_basis} energy"

    def line(self, counts: str = "", ci: str | None = None) -> str:
        """The full label line (power, basis, method, intervals[, counts]); the report states
        it once, in its "how these figures were measured" block."""
        parts = [f"power: {self.power_text()}",
                 f"energy basis: {self.energy_basis}", f"method: {self.energy_method} energy, "
                 f"{self.edge_model} window edges",
                 f"intervals: {self.ci_text if ci is None else ci}"]
        if counts:
            parts.append(counts)
        return "; ".join(parts)


#: results.json (and a journal's settle records) as the report reads them.
#: `check_document_shape` and `host.report.checks` verify every field the report reads before
#: it is used; the report's modules then index the nested records directly, so their values
#: stay unchecked by mypy in this one alias rather than narrowed again at each of ~40 reads.
Record = dict[str, Any]


@dataclass
class ReportData:
    analysis_dir: Path
    doc: Record
    results: pd.DataFrame
    verdicts: pd.DataFrame
    repeats: pd.DataFrame
    windows: pd.DataFrame
    labels: Labels
    per_run: pd.DataFrame = field(default_factory=pd.DataFrame)
    models: pd.DataFrame = field(default_factory=pd.DataFrame)
    settles: list[Record] = field(default_factory=list)

    @property
    def basis(self) -> str:
        return self.labels.energy_basis

    def headline(self) -> pd.DataFrame:
        """One row per configuration: whole-request J per generated token, all channels."""
        r = self.results
        h = headline_rows(r, self.basis)
        return h.set_index("config", drop=False)

    def counts(self, phase: str = "request") -> str:
        """'N runs (V valid), R repeats, S meter samples in PHASE windows'."""
        pr = self.per_run[self.per_run["phase"] == phase] if len(self.per_run) else self.per_run
        if pr.empty:
            return "no runs"
        reps = self.repeats
        n_rep = 0
        if len(reps):
            unit = TokenUnit.PROMPT if phase == Phase.PREFILL else TokenUnit.GENERATED
            n_rep = len(headline_rows(reps, self.basis, phase=phase, unit=unit))
        return (f"{len(pr)} runs ({int(pr['valid'].sum())} valid), {n_rep} repeats, "
                f"{int(pr['n_samples'].sum())} meter samples in {phase} windows")

    @property
    def configs(self) -> list[str]:
        return list(dict.fromkeys(run["config"] for run in self.doc["runs"]))


def _read_csv(path: Path) -> pd.DataFrame:
    try:
        return pd.read_csv(path)
    except pd.errors.EmptyDataError:
        return pd.DataFrame()
    except (OSError, ValueError) as exc:
        raise UserError(f"{path}: cannot read ({exc})") from None


WALL_METER = "wall meter: ATM90E26 metering chips"


def power_labels(doc: Record, results: pd.DataFrame) -> tuple[PowerKind, str]:
    """("measured" | "modelled", detail) from the analysis column, else the trace metadata.

    The detail names what was measured: wall power (the board's metering chips) or component
    power (software counters: RAPL, hwmon, NVML, PMIC — "component power, not wall power"),
    from the per-channel labels (`power_source`) and results.json's `components`.
    """
    comp = doc.get("components") if isinstance(doc.get("components"), dict) else None
    main = (comp or {}).get("main_figures") or {}
    comp_nodes = sorted(n for n, lab in main.items() if lab == COMPONENT)
    if "power_source" in results.columns and results["power_source"].notna().any():
        # One modelled configuration makes the report modelled: never a measured banner over it.
        srcs = list(dict.fromkeys(str(v) for v in results["power_source"].dropna()))
        modelled = any("model" in src or "emul" in src for src in srcs)
        parts = []
        for src in srcs:
            for one in src.split(" + "):
                parts.append(f"measured {WALL_METER}" if one == MEASURED and not comp_nodes
                             else one)
        detail = "; ".join(dict.fromkeys(parts))
        if comp_nodes and COMPONENT not in detail:
            detail += f"; node(s) {', '.join(comp_nodes)}: {COMPONENT}"
        return (MODELLED if modelled else MEASURED), detail
    trace = doc.get("trace") or {}
    if trace.get("emulated") or trace.get("power_models"):
        kinds = set()
        for pm in trace.get("power_models") or []:
            chans = (pm or {}).get("channels") or {}
            for ch in chans.values():
                kinds.add(str(ch.get("kind")))
            if not chans and pm:
                kinds.add(str(pm.get("kind")))
        detail = "ATM90E26 emulator"
        if "activity" in kinds:
            detail += "; activity model: channel power = idle + (max − idle) × this machine's " \
                      "CPU busy fraction"
        if "constant" in kinds:
            detail += "; constant-power channels"
        if comp_nodes:
            detail += f"; node(s) {', '.join(comp_nodes)}: {COMPONENT} (measured)"
        return MODELLED, detail
    if comp_nodes:
        return MEASURED, f"{COMPONENT} (software counters) on node(s) {', '.join(comp_nodes)}"
    return MEASURED, WALL_METER


def _groups(rows: pd.DataFrame, cov_col: str, n_col: str | None, *, at_least: bool = False
            ) -> str:
    """'96.9 % n=6 (q4); 75 % n=3 (q8, q2)': each configuration's own coverage and n."""
    by: dict[str, list[str]] = {}
    none: list[str] = []
    for _, r in rows.iterrows():
        cov = pd.to_numeric(r.get(cov_col), errors="coerce")
        n = r.get(n_col) if n_col else None
        n_txt = f" n={int(n)}" if n is not None and pd.notna(n) else ""
        if pd.isna(cov) or not np.isfinite(float(cov)):
            none.append(f"{r['config']}{n_txt}")
            continue
        key = ("≥ " if at_least else "") + pct(float(cov)) + n_txt
        by.setdefault(key, []).append(str(r["config"]))
    parts = [f"{k} ({', '.join(v)})" for k, v in by.items()]
    if none:
        parts.append(f"no interval: {', '.join(none)}")
    return "; ".join(parts) if parts else "none"


def _texts(rows: pd.DataFrame, col: str) -> list[str]:
    if col not in rows.columns:
        return []
    return [m for m in dict.fromkeys(rows[col].dropna().astype(str)) if m]


def interval_text(rows: pd.DataFrame, what: str = "J/token") -> str:
    """What the J/token intervals of these results rows are: the method, each configuration's
    achieved coverage (as a percent) and n, and why there is no interval at the wanted level.
    Never a level the rows do not record."""
    if rows.empty:
        return f"{what}: no figures"
    if "ci_coverage" not in rows.columns:
        return (f"{what}: interval method and coverage not recorded in results.csv (older "
                "analysis) — coverage unknown")
    methods, notes = _texts(rows, "ci_method"), _texts(rows, "ci_note")
    text = (f"{what}: {' / '.join(methods) or 'interval'}, coverage "
            + _groups(rows, "ci_coverage", "n_repeats"))
    if notes:
        text += " — " + "; ".join(notes)
    return text


def epi_interval_text(rows: pd.DataFrame) -> str:
    """EPI's intervals: a combination of the J/token and accuracy intervals, so only a lower
    bound on the coverage is known (Bonferroni), per configuration."""
    have = rows[rows["epi_ci_lo"].notna()] if "epi_ci_lo" in rows.columns else rows.iloc[:0]
    if have.empty:
        return "EPI: no interval"
    return ("EPI: J/token interval ÷ accuracy interval, coverage "
            + _groups(have, "epi_ci_coverage", "n_repeats", at_least=True)
            + " (Bonferroni lower bound: J/token coverage + accuracy coverage − 1)")


def accuracy_interval_text(rows: pd.DataFrame) -> str:
    """Accuracy intervals: as the accuracy file gives them (its `ci95`)."""
    if "accuracy_ci_lo" not in rows.columns or rows["accuracy_ci_lo"].isna().all():
        return "accuracy: no interval"
    return "accuracy: the accuracy file's 95 % interval (its ci95 over the benchmark items)"


def ci_text(results: pd.DataFrame, basis: str = "gross") -> str:
    """The headline interval label: the whole-request J/token rows' own methods, coverages
    and n (one configuration may have 6 repeats, another 3)."""
    if not {"scope", "phase", "unit", "basis"} <= set(results.columns):
        return interval_text(results)
    h = headline_rows(results, basis)
    return interval_text(h)


# The parts of results.json the report reads, and the JSON type each must have.
_SHAPE: dict[str, tuple[type, ...]] = {
    "options": (dict,), "trace": (dict,), "runs": (list,), "pareto": (list,),
    "notes": (list,), "savings": (list,), "perplexity_matched_pairs": (list,),
    "phase_breakdown": (list,), "layer_groups": (dict,), "models": (list,),
}


def _require_columns(table: pd.DataFrame, path: Path, columns: tuple[str, ...]) -> None:
    """A non-empty analysis table must have the columns the report reads."""
    missing = [c for c in columns if c not in table.columns]
    if len(table.columns) and missing:
        raise UserError(f"{path}: column {missing[0]!r} missing (not an `epi analyze` table)")


def check_document_shape(doc: Record, path: Path) -> None:
    """Refuse, in one line, a results.json whose fields the report reads have the wrong type."""
    for key, types in _SHAPE.items():
        value = doc.get(key)
        if value is not None and not isinstance(value, types):
            raise UserError(f"{path}: field {key!r}: expected {types[0].__name__}, got "
                            f"{type(value).__name__}")
    runs = doc.get("runs")
    if not isinstance(runs, list):
        raise UserError(f"{path}: field 'runs': missing (expected a list of runs)")
    for i, run in enumerate(runs):
        if not isinstance(run, dict) or not isinstance(run.get("config"), str) \
                or not isinstance(run.get("run_id"), str):
            raise UserError(f"{path}: field 'runs[{i}]': expected an object with string "
                            "'config' and 'run_id'")
    trace = doc.get("trace") or {}
    if "path" in trace and not isinstance(trace["path"], str):
        raise UserError(f"{path}: field 'trace.path': expected a string")
    for key in ("emulated",):
        if key in trace and not isinstance(trace[key], bool | None):
            raise UserError(f"{path}: field 'trace.{key}': expected true or false")
    if not isinstance(trace.get("power_models") or [], list) or not all(
            isinstance(pm, dict | None) for pm in trace.get("power_models") or []):
        raise UserError(f"{path}: field 'trace.power_models': expected a list of objects")


def load(analysis_dir: Path | str) -> ReportData:
    d = Path(analysis_dir)
    if not d.is_dir():
        raise UserError(f"{d}: analysis directory not found (run `epi analyze --out {d}`)")
    for name in FILES:
        if not (d / name).is_file():
            raise UserError(f"{d / name}: missing — not an `epi analyze` output directory")
    doc = read_json_object(d / "results.json", "analysis results")
    check_format(doc, d / "results.json", RESULT_FORMAT, RESULT_VERSION)  # newer: refused
    check_document_shape(doc, d / "results.json")
    run_ids, run_configs = checks.run_index(doc)
    results = _read_csv(d / "results.csv")
    for col in ("config", "scope", "phase", "unit", "basis"):
        if col not in results.columns:
            raise UserError(f"{d / 'results.csv'}: column {col!r} missing")
    runs, windows = _read_csv(d / "runs.csv"), _read_csv(d / "windows.csv")
    _require_columns(runs, d / "runs.csv", ("run_id", "phase", "valid", "reasons", "cv"))
    _require_columns(windows, d / "windows.csv",
                     ("run_id", "config", "kind", "scope", "energy_j", "energy_net_j",
                      "n_samples", "duration_s", "n_prompt_tokens", "n_generated_tokens"))
    repeats = _read_csv(d / "repeats.csv")
    for table, name in ((results, "results.csv"), (runs, "runs.csv"), (windows, "windows.csv"),
                        (repeats, "repeats.csv")):
        checks.check_types(table, d / name)
    checks.check_results(results, d / "results.csv", run_configs)
    checks.check_records(doc, d / "results.json", run_configs)
    checks.check_verdicts(runs, d / "runs.csv", results, run_ids)
    checks.check_windows(windows, d / "windows.csv", runs, run_ids)
    options = doc.get("options")
    opts: Mapping[str, object] = options if isinstance(options, dict) else {}
    kind, detail = power_labels(doc, results)
    labels = Labels(kind, detail, str(opts.get("energy_basis", "gross")),
                    str(opts.get("energy_method", "counter")), str(opts.get("edge", "step")),
                    ci_text(results, str(opts.get("energy_basis", "gross"))))
    rd = ReportData(d, doc, results, runs, repeats, windows, labels)
    rd.per_run = per_run_figures(rd)
    rd.models = model_facts(doc)
    rd.settles = campaign_settles(d.parent / "journal.jsonl", doc)
    return rd


def campaign_settles(journal: Path, doc: Record) -> list[Record]:
    """The thermal settle before each analysed run, when the analysis belongs to a campaign
    (its journal is next to the analysis directory); [] otherwise."""
    try:
        lines = journal.read_text().splitlines()
    except OSError:
        return []
    analysed = {str(Path(str(r.get("path"))).resolve()): r for r in doc["runs"]}
    out = []
    for line in lines:
        try:
            ev = json.loads(line)
        except ValueError:
            continue
        result = ev.get("result") or {}
        rel = result.get("run_dir")  # relative to the campaign directory (the journal's)
        key = str((journal.parent / rel).resolve()) if isinstance(rel, str) else None
        if ev.get("event") == JournalEvent.DONE and key in analysed and ev.get("settle"):
            run = analysed[key]
            out.append({"step": ev.get("step"), "config": run["config"],
                        "run_id": run["run_id"], **ev["settle"]})
    return out


def per_run_figures(rd: ReportData) -> pd.DataFrame:
    """Per run and phase: measured J/token (ratio of sums over windows that have an energy),
    its verdict and reasons — for valid and invalid runs alike."""
    w = rd.windows
    rows = []
    if w.empty:
        return pd.DataFrame()
    w = w[w["scope"] == SCOPE_ALL]
    col = "energy_j" if rd.basis == EnergyBasis.GROSS else "energy_net_j"
    order = {r["run_id"]: i for i, r in enumerate(rd.doc["runs"])}
    # each (run, phase)'s verdict: the first runs.csv row of that run and phase, found by one
    # pass over the table (a boolean filter per run and phase was a fifth of the load's time)
    verdict_row: dict[tuple[object, object], int] = {}
    for i, key in enumerate(zip(rd.verdicts["run_id"], rd.verdicts["phase"], strict=True)):
        verdict_row.setdefault(key, i)
    for (run_id, phase), g in w[w["kind"].isin(list(TOKEN_UNIT))].groupby(["run_id", "kind"]):
        have = g[g[col].notna()]
        tokens = have[TOKEN_UNIT[phase]].astype(float).sum()
        energy = float(have[col].sum())
        row = verdict_row.get((run_id, phase))
        v = rd.verdicts.iloc[[] if row is None else [row]]
        valid = bool(v["valid"].iloc[0]) if len(v) else False
        reasons = str(v["reasons"].iloc[0]) if len(v) and isinstance(v["reasons"].iloc[0],
                                                                     str) else ""
        rows.append({
            "run_id": run_id, "config": g["config"].iloc[0], "phase": phase,
            "order": order.get(run_id, 0),
            "j_per_token": energy / tokens if tokens > 0 and len(have) else np.nan,
            "energy_j": energy if len(have) else np.nan,
            "tokens": tokens,
            "generated_tokens": float(have["n_generated_tokens"].astype(float).sum()),
            "measured_duration_s": float(have["duration_s"].sum()),
            "n_windows": len(g), "n_windows_measured": len(have),
            "n_samples": int(g["n_samples"].fillna(0).sum()),
            "duration_s": float(g["duration_s"].sum()),
            "power_w": energy / float(have["duration_s"].sum())
            if len(have) and have["duration_s"].sum() > 0 else np.nan,
            "valid": valid, "reasons": reasons,
            "cv": float(v["cv"].iloc[0]) if len(v) and pd.notna(v["cv"].iloc[0]) else np.nan,
        })
    out = pd.DataFrame(rows)
    return out.sort_values(["order", "phase"]).reset_index(drop=True)


def _manifest_for(model: Record, manifest_dir: object = None
                  ) -> QuantManifest | ModelManifest | None:
    """The quantization (or model) manifest beside the run's model or in the analysis'
    `--manifest-dir`, None when there is none; a corrupt one is a one-line `UserError`."""
    path = model.get("path")
    if not path:
        return None
    p = Path(str(path))
    name = (model.get("map_id") or p.stem) + ".manifest.json"
    extra = [Path(manifest_dir) / name] if isinstance(manifest_dir, str) and manifest_dir \
        else []
    for cand in (*extra, manifest_beside(p), p.with_name(name)):
        if cand.is_file():
            return read_any_manifest(cand)
    return None


def _finite_number(x: object) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and bool(np.isfinite(x))


def model_facts(doc: Record) -> pd.DataFrame:
    """Per configuration: file size, bits per weight, and the types of its early, middle
    and late groups — the map's own groups, from the quantization manifest
    (host.report.layer_columns; '?' where there is none). A corrupt
    manifest is not "no manifest": its cells say "corrupt manifest" and `manifest_problem`
    holds the reader's one-line error, which names the file."""
    rows = []
    seen = set()
    for run in doc["runs"]:
        cfg = run["config"]
        if cfg in seen:
            continue
        seen.add(cfg)
        model = run.get("model") or {}
        problem = ""
        try:
            man = _manifest_for(model, (doc.get("options") or {}).get("manifest_dir"))
        except UserError as exc:
            man, problem = None, f"corrupt manifest: {exc}"
        size: float | int | None = np.nan
        bpw: float | None = np.nan
        n_layers = int(model.get("n_layers") or 0)
        types = {k: "corrupt manifest" if problem else "?" for k in ("early", "middle", "late")}
        if isinstance(man, ModelManifest):  # an unquantized model: one type throughout
            size = man.size_bytes
            if man.file_type:
                types = dict.fromkeys(types, man.file_type)
        elif man is not None:
            size = man.output.size_bytes if man.output.size_bytes is not None else np.nan
            bpw = man.total.bits_per_weight
            groups = man.block_groups()
            if groups:
                types = layer_group_cells(groups, n_layers)
            elif man.file_type:
                types = dict.fromkeys(types, man.file_type)
        if not _finite_number(bpw) and _finite_number(size) and model.get("n_params"):
            bpw = number(size) * 8 / number(model["n_params"])
        rows.append({"config": cfg, "size_bytes": size, "bits_per_weight": bpw,
                     "n_layers": n_layers, **types, "manifest_problem": problem})
    return pd.DataFrame(rows).set_index("config", drop=False) if rows else pd.DataFrame()
