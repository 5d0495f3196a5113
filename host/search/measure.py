"""Measuring candidates: through the campaign (host.campaign.execute.Campaign, the library
behind `epi campaign`), so a search's figures are the campaign's (quantized, scored, metered
and analysed exactly like the hand-made maps).

Each search round is one campaign directory holding that round's maps plus the anchor (the
first hand-made map), measured again every round so that drift between rounds is visible.
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Protocol

from epi.core.errors import UserError
from epi.formats.manifests import read_quant_manifest
from host.analysis.headline import is_headline
from host.errors import SearchRoundFailed


@dataclass(frozen=True)
class Measured:
    """One configuration's measured figures (NaN where the campaign has none, with a reason)."""

    config: str
    round: int
    gguf: str | None
    size_bytes: int | None
    j_per_token: float
    j_per_token_ci: tuple[float, float]
    accuracy: float
    epi: float
    epi_ci: tuple[float, float]
    power_source: str
    reason: str
    perplexity: float = math.nan  # the campaign's perplexity (NaN where it scored none)
    # the campaign's rounds in order (round 1 first): the mean J/token of that round's run
    # when it was valid, None when the round had no valid run of this configuration
    per_round_j: tuple[float | None, ...] = ()

    def as_dict(self) -> dict[str, object]:
        return asdict(self)

    @property
    def usable(self) -> bool:
        return math.isfinite(self.j_per_token) and math.isfinite(self.accuracy)

    @classmethod
    def from_json(cls, obj: object, where: str) -> Measured:
        """One entry of search.json's `measured`, every field checked (one line otherwise);
        a figure is a number or NaN (none measured), never infinite."""
        if not isinstance(obj, dict):
            raise UserError(f"{where}: expected an object, got {type(obj).__name__}")
        missing = [f for f in ("config", "round", "j_per_token", "j_per_token_ci", "accuracy",
                               "epi", "epi_ci") if f not in obj]
        if missing:
            raise UserError(f"{where}: field {missing[0]!r} missing")

        def text(key: str, null_ok: bool = False) -> str | None:
            v = obj.get(key, "" if not null_ok else None)
            if v is None and null_ok:
                return None
            if not isinstance(v, str):
                raise UserError(f"{where}.{key}: expected text, got {v!r}")
            return v

        def whole(key: str) -> int | None:
            v = obj.get(key)
            if v is None and key == "size_bytes":
                return None
            if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= 2**62:
                raise UserError(f"{where}.{key}: expected a whole number ≥ 0, got {v!r}")
            return v

        def pair(key: str) -> tuple[float, float]:
            v = obj.get(key)
            if not isinstance(v, (list, tuple)) or len(v) != 2:
                raise UserError(f"{where}.{key}: expected [low, high], got {v!r}")
            return _figure(v[0], f"{where}.{key}[0]"), _figure(v[1], f"{where}.{key}[1]")

        rounds_j = obj.get("per_round_j", [])
        if not isinstance(rounds_j, (list, tuple)):
            raise UserError(f"{where}.per_round_j: expected a list, got {rounds_j!r}")
        per_round = tuple(None if v is None else _figure(v, f"{where}.per_round_j[{i}]")
                          for i, v in enumerate(rounds_j))
        config = text("config")
        rnd = whole("round")
        assert config is not None and rnd is not None
        return cls(config, rnd, text("gguf", null_ok=True), whole("size_bytes"),
                   _figure(obj.get("j_per_token"), f"{where}.j_per_token"),
                   pair("j_per_token_ci"), _figure(obj.get("accuracy"), f"{where}.accuracy"),
                   _figure(obj.get("epi"), f"{where}.epi"), pair("epi_ci"),
                   text("power_source") or "", text("reason") or "",
                   _figure(obj.get("perplexity"), f"{where}.perplexity"),
                   tuple(None if v is None or math.isnan(v) else v for v in per_round))


def _figure(value: object, where: str) -> float:
    """A measured figure as saved: a number, NaN or null (none); infinity is refused."""
    if value is None:
        return math.nan
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isinf(value):
        raise UserError(f"{where}: expected a finite number or NaN, got {value!r}")
    return float(value)


#: a split configuration measured in a round: (its id, the prefill map id, the decode map id)
PhaseSplit = tuple[str, str, str]


class Measurer(Protocol):
    """(round, its directory, its maps, the baseline its [decide] rounds compare with, or None
    for fixed rounds, and with `epi search --phase-split` the round's split configurations of
    those maps) → every configuration's measured figures. A search without splits calls it
    with the first four only."""

    def __call__(self, round_no: int, round_dir: Path, maps: Sequence[Path],
                 baseline: str | None = None, splits: Sequence[PhaseSplit] = ()
                 ) -> list[Measured]: ...


@dataclass(frozen=True)
class CampaignSettings:
    """What every round's study file says besides its maps (docs/campaign.md)."""

    base: Path
    emulate: bool = True
    meter_url: str | None = None
    meter_trace: Path | None = None
    rate_hz: float | None = None  # the emulated meter's sample rate (None: the campaign's)
    repeats: int = 3
    tokens: int = 16
    prompts: Path | None = None  # an epi-prompts file (None: the runner's default prompts)
    repeats_per_run: int = 3
    # each repeat's cool-down and idle-baseline window, s (None: the campaign's, 1 s and 3 s)
    cooldown_s: float | None = None
    idle_s: float | None = None
    threads: int | None = None
    benchmarks: dict[str, int] | None = None
    accuracy_threads: int | None = None  # scoring is not metered: it may use every core
    ppl: str | None = "lambada"
    seed: int = 0
    lag: str | None = None  # the analysis' meter-lag handling ("auto"); None: the campaign's
    cv_threshold: float | None = None  # the analysis' repeat-CV limit; None: the campaign's
    max_resolution_frac: float | None = None  # the counter-resolution limit; None: default
    # the candidate rounds' [decide] table (docs/campaign.md): rounds per campaign, and the
    # smallest difference worth resolving (% of J/token); round 0 uses `repeats` fixed rounds
    min_rounds: int = 3
    max_rounds: int = 8
    margin_pct: float = 2.0


def _toml_value(v: object) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, dict):
        return "{ " + ", ".join(f"{k} = {_toml_value(x)}" for k, x in v.items()) + " }"
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    return json.dumps(str(v))  # a TOML basic string is a JSON string


def study_text(name: str, settings: CampaignSettings, maps: Sequence[Path], out: Path,
               baseline: str | None = None, splits: Sequence[PhaseSplit] = ()) -> str:
    """A campaign study file for one round: `settings.repeats` fixed rounds, or, with a
    `baseline` (the best hand-made map), adaptive rounds that decide every map's saving
    against it (`[decide] compare = ["baseline"]`)."""
    rounds = ([f"baseline = {_toml_value(baseline)}"] if baseline is not None
              else [f"repeats = {settings.repeats}"])
    lines = ["[study]", f"name = {_toml_value(name)}", f"seed = {settings.seed}", *rounds,
             f"out = {_toml_value(str(out.resolve()))}", "",
             "[[models]]", f"name = {_toml_value(settings.base.stem)}",
             f"path = {_toml_value(str(settings.base.resolve()))}",
             f"maps = {_toml_value([str(m.resolve()) for m in maps])}",
             *([f"splits = {_splits_toml(splits)}"] if splits else []), "",
             "[run]", f"tokens = {settings.tokens}",
             f"repeats_per_run = {settings.repeats_per_run}"]
    if settings.prompts is not None:
        lines.append(f"prompts = {_toml_value(str(settings.prompts.resolve()))}")
    if settings.threads:
        lines.append(f"threads = {settings.threads}")
    if settings.cooldown_s is not None:
        lines.append(f"cooldown_s = {settings.cooldown_s!r}")
    if settings.idle_s is not None:
        lines.append(f"idle_s = {settings.idle_s!r}")
    lines += ["", "[meter]"]
    if settings.emulate:
        lines.append("emulate = true")
        if settings.rate_hz is not None:
            lines.append(f"rate_hz = {settings.rate_hz!r}")
    else:
        lines.append(f"url = {_toml_value(settings.meter_url)}")
        if settings.meter_trace is not None:
            lines.append(f"trace = {_toml_value(str(settings.meter_trace.resolve()))}")
    if settings.benchmarks or settings.ppl:
        lines += ["", "[accuracy]"]
        if settings.benchmarks:
            lines.append(f"benchmarks = {_toml_value(settings.benchmarks)}")
        if settings.ppl:
            lines.append(f"ppl = {_toml_value(settings.ppl)}")
        if settings.accuracy_threads:
            lines.append(f"threads = {settings.accuracy_threads}")
    analysis = []
    if settings.lag is not None:
        analysis.append(f"lag = {_toml_value(settings.lag)}")
    if settings.cv_threshold is not None:
        analysis.append(f"cv_threshold = {_toml_value(settings.cv_threshold)}")
    if settings.max_resolution_frac is not None:
        analysis.append(f"max_resolution_frac = {_toml_value(settings.max_resolution_frac)}")
    if analysis:
        lines += ["", "[analysis]", *analysis]
    if baseline is not None:
        lines += ["", "[decide]", 'compare = ["baseline"]',
                  f"min_rounds = {settings.min_rounds}", f"max_rounds = {settings.max_rounds}",
                  f"margin_pct = {settings.margin_pct!r}"]
    return "\n".join(lines) + "\n"


def _splits_toml(splits: Sequence[PhaseSplit]) -> str:
    """The study file's `splits` of [[models]] (docs/campaign.md, "Split configurations")."""
    return _toml_value([{"id": s, "prefill": pre, "decode": dec} for s, pre, dec in splits])


def check_study(settings: CampaignSettings, maps: Sequence[Path], work_dir: Path,
                baseline: str | None = None) -> None:
    """Load the study file a round would use with the campaign's own checker, before any probe
    or round has run, so a setting the campaign refuses (e.g. a meter URL without its trace
    directory) fails at once instead of after the probes."""
    from host.campaign.study import load_study

    work_dir.mkdir(parents=True, exist_ok=True)
    probe = work_dir / "study-check.toml"
    probe.write_text(study_text("search-check", settings, maps, work_dir / "unused", baseline))
    try:
        load_study(probe)
    except UserError as exc:
        raise UserError(f"the campaign would refuse the search's study: {exc}") from None
    finally:
        probe.unlink(missing_ok=True)


def _float(row: dict[str, str], key: str) -> float:
    try:
        v = float(row.get(key) or "nan")
    except ValueError:
        return math.nan
    return v


def read_campaign_results(round_no: int, campaign_dir: Path,
                          per_round: Mapping[str, Mapping[int, float | None]] | None = None
                          ) -> list[Measured]:
    """Headline figures per configuration from a finished campaign's analysis, with each
    configuration's per-round J/token where `per_round` (config → round → value) has it."""
    results = campaign_dir / "analysis" / "results.csv"
    if not results.exists():
        raise UserError(f"{results}: missing — the campaign did not finish its analysis")
    out = []
    with results.open(newline="") as f:
        for row in csv.DictReader(f):
            if not is_headline(row):
                continue
            cfg = row["config"]
            manifests = list((campaign_dir / "models").glob(f"*/{cfg}.manifest.json"))
            gguf, size = None, None
            if manifests:
                gguf = str(manifests[0].with_name(f"{cfg}.gguf"))
                size = read_quant_manifest(manifests[0]).output.size_bytes
                if not size and Path(gguf).exists():
                    size = Path(gguf).stat().st_size
            j = _float(row, "j_per_token_median")
            reason = row.get("reason") or ("" if math.isfinite(j) else "no valid runs")
            out.append(Measured(
                cfg, round_no, gguf, size, j,
                (_float(row, "j_per_token_ci_lo"), _float(row, "j_per_token_ci_hi")),
                _float(row, "accuracy"), _float(row, "epi"),
                (_float(row, "epi_ci_lo"), _float(row, "epi_ci_hi")),
                row.get("power_source") or "", reason, _float(row, "perplexity"),
                _round_list((per_round or {}).get(cfg, {})),
            ))
    return out


def _round_list(values: Mapping[int, float | None]) -> tuple[float | None, ...]:
    """{round: value} → (value of round 1, round 2, …), None for a round without one."""
    if not values:
        return ()
    return tuple(values.get(k) for k in range(1, max(values) + 1))


def campaign_round_values(analysis_dir: Path, basis: str = "gross"
                          ) -> dict[str, dict[int, float | None]]:
    """Config → campaign round → mean J/token of that round's run (None: invalid), read from
    a finished campaign's analysis: repeats.csv's values, runs.csv's validity and each run's
    `campaign_round` (the k of its directory runs/<config>/round<k>-attempt<j>, docs/formats.md)
    — the values the campaign's own [decide] rounds judged (host.campaign.adaptive
    .round_values). An analysis without that column (an older epi's) is refused in one line:
    its runs' rounds cannot be told, and a verdict must not pair the wrong rounds."""
    import pandas as pd

    from host.campaign.adaptive import round_values

    if not (analysis_dir / "runs.csv").is_file() and not (analysis_dir / "repeats.csv").is_file():
        return {}  # no analysis (the campaign measured nothing valid to analyse)
    try:
        repeats = pd.read_csv(analysis_dir / "repeats.csv")
        runs = pd.read_csv(analysis_dir / "runs.csv")
    except (OSError, ValueError) as exc:
        raise UserError(f"{analysis_dir}: cannot read the campaign's repeats.csv/runs.csv "
                        f"({exc}); re-run the campaign's analysis") from None
    if "campaign_round" not in runs.columns:
        raise UserError(f"{analysis_dir / 'runs.csv'}: no campaign_round column (an analysis "
                        "by an older epi); re-run the campaign's analysis before continuing "
                        "the search")
    rounds = pd.to_numeric(runs["campaign_round"], errors="coerce")
    round_of_run = {str(run): int(k) for run, k in zip(runs["run_id"], rounds, strict=True)
                    if pd.notna(k)}
    return round_values(repeats, runs, round_of_run, basis=basis)


def deciding_analysis(campaign_dir: Path, final_analysis: Path, min_rounds: int | None
                      ) -> Path:
    """The analysis whose round values made the campaign's last [decide] decision: the
    assessment after its last round (`assess/round-K/`, host.campaign.adaptive_round), or the
    final analysis when the campaign had no [decide] rounds (`min_rounds` None) or no
    assessment was written. The final analysis re-estimates the meter lag over the whole trace,
    so a run's validity there can differ from the assessment's; the candidate's verdict must
    be the campaign's own decision (its decisions.json), not a second judgement of other
    values."""
    if min_rounds is None:
        return final_analysis
    from host.campaign.adaptive_round import assess_dir, decided_rounds

    rounds = decided_rounds(campaign_dir, min_rounds)
    last = assess_dir(campaign_dir, rounds[-1][0] if rounds else min_rounds)
    return last if (last / "runs.csv").is_file() else final_analysis


def campaign_measurer(settings: CampaignSettings, echo: Callable[[str], None]) -> Measurer:
    """A measurer that runs each round's study file as a campaign (host.campaign, in this
    process; resumable itself). With a baseline (the best hand-made map) the campaign's
    [decide] rounds measure each map until its saving against the baseline is settled."""

    def measure(round_no: int, round_dir: Path, maps: Sequence[Path],
                baseline: str | None = None, splits: Sequence[PhaseSplit] = ()
                ) -> list[Measured]:
        from host.campaign.execute import Campaign
        from host.campaign.study import load_study

        round_dir.mkdir(parents=True, exist_ok=True)
        study = round_dir / "study.toml"
        campaign_dir = round_dir / "campaign"
        study.write_text(study_text(f"search-round{round_no}", settings, maps, campaign_dir,
                                    baseline, splits))
        echo(f"search round {round_no}: campaign {study}"
             + (f" (rounds {settings.min_rounds}–{settings.max_rounds}, until each map's "
                f"saving against {baseline} is decided)" if baseline else ""))
        try:
            campaign = Campaign(load_study(study))
            campaign.run()  # its progress on stderr, as `epi campaign`
        except UserError as exc:
            raise SearchRoundFailed(
                f"{study}: the campaign of search round {round_no} failed ({exc}); run "
                "`epi search` again to continue where it stopped") from None
        basis = campaign.study.analysis.options(campaign.study.baseline).energy_basis
        results = read_campaign_results(
            round_no, campaign_dir,
            campaign_round_values(deciding_analysis(campaign_dir, campaign.layout.analysis,
                                                    settings.min_rounds if baseline else None),
                                  basis))
        check_covered(results, maps, campaign_dir)
        return results

    return measure


def check_covered(results: Sequence[Measured], maps: Sequence[Path], campaign_dir: Path) -> None:
    """Refuse a round whose analysis lacks one of its maps (e.g. a resumed campaign that kept
    an analysis finished before that map's runs), instead of recording the map as unmeasured."""
    have = {m.config for m in results}
    missing = []
    for p in maps:
        try:
            map_id = json.loads(p.read_text()).get("id") or p.stem
        except (OSError, ValueError):
            map_id = p.stem
        if map_id not in have:
            missing.append(map_id)
    if missing:
        raise UserError(
            f"{campaign_dir / 'analysis' / 'results.csv'}: no row for {', '.join(missing)}; the "
            "campaign's analysis predates their runs. Re-run its analysis (or give a new --out) "
            "before continuing the search"
        )
