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
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from epi.core.errors import UserError
from epi.formats.manifests import read_quant_manifest
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

        config = text("config")
        rnd = whole("round")
        assert config is not None and rnd is not None
        return cls(config, rnd, text("gguf", null_ok=True), whole("size_bytes"),
                   _figure(obj.get("j_per_token"), f"{where}.j_per_token"),
                   pair("j_per_token_ci"), _figure(obj.get("accuracy"), f"{where}.accuracy"),
                   _figure(obj.get("epi"), f"{where}.epi"), pair("epi_ci"),
                   text("power_source") or "", text("reason") or "",
                   _figure(obj.get("perplexity"), f"{where}.perplexity"))


def _figure(value: object, where: str) -> float:
    """A measured figure as saved: a number, NaN or null (none); infinity is refused."""
    if value is None:
        return math.nan
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isinf(value):
        raise UserError(f"{where}: expected a finite number or NaN, got {value!r}")
    return float(value)


Measurer = Callable[[int, Path, Sequence[Path]], list["Measured"]]


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
    threads: int | None = None
    benchmarks: dict[str, int] | None = None
    accuracy_threads: int | None = None  # scoring is not metered: it may use every core
    ppl: str | None = "lambada"
    seed: int = 0
    lag: str | None = None  # the analysis' meter-lag handling ("auto"); None: the campaign's
    cv_threshold: float | None = None  # the analysis' repeat-CV limit; None: the campaign's


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


def study_text(name: str, settings: CampaignSettings, maps: Sequence[Path], out: Path) -> str:
    """A campaign study file for one round."""
    lines = ["[study]", f"name = {_toml_value(name)}", f"seed = {settings.seed}",
             f"repeats = {settings.repeats}", f"out = {_toml_value(str(out.resolve()))}", "",
             "[[models]]", f"name = {_toml_value(settings.base.stem)}",
             f"path = {_toml_value(str(settings.base.resolve()))}",
             f"maps = {_toml_value([str(m.resolve()) for m in maps])}", "",
             "[run]", f"tokens = {settings.tokens}",
             f"repeats_per_run = {settings.repeats_per_run}"]
    if settings.prompts is not None:
        lines.append(f"prompts = {_toml_value(str(settings.prompts.resolve()))}")
    if settings.threads:
        lines.append(f"threads = {settings.threads}")
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
    if analysis:
        lines += ["", "[analysis]", *analysis]
    return "\n".join(lines) + "\n"


def check_study(settings: CampaignSettings, maps: Sequence[Path], work_dir: Path) -> None:
    """Load the study file a round would use with the campaign's own checker, before any probe
    or round has run, so a setting the campaign refuses (e.g. a meter URL without its trace
    directory) fails at once instead of after the probes."""
    from host.campaign.study import load_study

    work_dir.mkdir(parents=True, exist_ok=True)
    probe = work_dir / "study-check.toml"
    probe.write_text(study_text("search-check", settings, maps, work_dir / "unused"))
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


def read_campaign_results(round_no: int, campaign_dir: Path) -> list[Measured]:
    """Headline figures per configuration from a finished campaign's analysis."""
    results = campaign_dir / "analysis" / "results.csv"
    if not results.exists():
        raise UserError(f"{results}: missing — the campaign did not finish its analysis")
    out = []
    with results.open(newline="") as f:
        for row in csv.DictReader(f):
            if (row.get("scope"), row.get("phase"), row.get("unit"), row.get("basis")) != (
                "all", "request", "generated", "gross"
            ):
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
            ))
    return out


def campaign_measurer(settings: CampaignSettings, echo: Callable[[str], None]) -> Measurer:
    """A measurer that runs each round's study file as a campaign (host.campaign, in this
    process; resumable itself)."""

    def measure(round_no: int, round_dir: Path, maps: Sequence[Path]) -> list[Measured]:
        from host.campaign.execute import Campaign
        from host.campaign.study import load_study

        round_dir.mkdir(parents=True, exist_ok=True)
        study = round_dir / "study.toml"
        campaign_dir = round_dir / "campaign"
        study.write_text(study_text(f"search-round{round_no}", settings, maps, campaign_dir))
        echo(f"search round {round_no}: campaign {study}")
        try:
            Campaign(load_study(study)).run()  # its progress on stderr, as `epi campaign`
        except UserError as exc:
            raise SearchRoundFailed(
                f"{study}: the campaign of search round {round_no} failed ({exc}); run "
                "`epi search` again to continue where it stopped") from None
        results = read_campaign_results(round_no, campaign_dir)
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
