"""The analysis' data model: its options (one per CLI flag), per-run facts, and the result.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from host.analysis.align import (
    REASON_CODES,
    ClockMap,
)
from host.analysis.records import GroupDifferential, PerplexityPair, TimeShareEstimate
from host.analysis.tokenlog_reader import RunLog
from host.analysis.traces import Trace
from host.analysis.vocabulary import (
    COMPOSITE_METRIC,
    EdgeModel,
    EnergyBasis,
    EnergyMethod,
    LagMode,
    Phase,
    TokenUnit,
)

NS = 1_000_000_000


# (phase, token unit) pairs reported per configuration.
FIGURES: tuple[tuple[Phase, TokenUnit], ...] = (
    (Phase.PREFILL, TokenUnit.PROMPT),
    (Phase.DECODE, TokenUnit.GENERATED),
    (Phase.REQUEST, TokenUnit.GENERATED),
    (Phase.REQUEST, TokenUnit.TOTAL),
)


PHASES: tuple[Phase, ...] = tuple(Phase)


CODE_NAMES = np.array([REASON_CODES[k] for k in sorted(REASON_CODES)], dtype=object)


UNIT_TEXT: dict[str, str] = {
    TokenUnit.PROMPT: "J per prompt token",
    TokenUnit.GENERATED: "J per generated token",
    TokenUnit.TOTAL: "J per total (prompt + generated) token",
}


@dataclass
class Options:
    """Analysis settings (CLI flags map one to one)."""

    edge: EdgeModel = EdgeModel.STEP
    min_samples: int = 2
    cv_threshold: float = 0.03
    max_offset_frac: float = 0.01
    single_sync_drift_ppm: float = 100.0
    ci_level: float = 0.95
    channels: dict[str, list[int]] | None = None
    energy_basis: EnergyBasis = EnergyBasis.GROSS
    energy_method: EnergyMethod = EnergyMethod.COUNTER
    max_resolution_frac: float = 0.005
    max_gap_periods: float = 3.0
    accuracy_metric: str = COMPOSITE_METRIC  # or a benchmark name (an open set)
    accuracy_values: dict[str, float] = field(default_factory=dict)
    ppl_tolerance: float = 0.01
    baseline: str | None = None
    time_share: bool = False
    manifest_dir: Path | None = None
    lag: LagMode = LagMode.NONE  # AUTO: shift each channel's windows by its estimated load lag
    max_lag_error_frac: float = 0.01
    max_instrument_u_pct: float = 2.0  # a figure's instrument term above it: reason
    # RQ4's reference map when the study has no uniform_q4km (the study file's
    # [analysis] reference_map); the report compares the EPI optimum's size with it
    reference_map: str | None = None
    # the report's guidance by use (host/analysis/guidance.py): the accuracy loss the
    # latency and energy picks may give up, and the J/token budget of the quality pick
    guidance_accuracy_loss: float = 0.02
    guidance_j_budget: float = 1.10

    def __post_init__(self) -> None:
        # options rebuilt from a results file or a study carry plain strings: make them words
        # (ValueError for a word outside the vocabulary, as for any bad option value)
        self.edge = EdgeModel(self.edge)
        self.energy_basis = EnergyBasis(self.energy_basis)
        self.energy_method = EnergyMethod(self.energy_method)
        self.lag = LagMode(self.lag)


@dataclass
class RunInfo:
    """Per-run facts the tables need."""

    run: RunLog
    config: str
    boot_id: str | None
    clock: ClockMap
    node_channels: dict[str, list[int]]
    span_meter_ns: tuple[int, int] | None
    idle_power_w: dict[str, float]
    idle_reason: dict[str, str]
    saturated: int
    offset_uncertainty_ns: float
    lag: dict = field(default_factory=dict)  # channel → lag.LagEstimate
    lag_applied_ms: dict = field(default_factory=dict)  # channel → shift applied (--lag auto)
    # channel → why an estimated lag was not applied (--lag auto that would move nothing)
    lag_not_applied: dict[int, str] = field(default_factory=dict)


@dataclass
class Analysis:
    """Everything `epi analyze` reports."""

    trace: Trace
    runs: list[RunInfo]
    windows: pd.DataFrame
    repeats: pd.DataFrame
    verdicts: pd.DataFrame
    results: pd.DataFrame
    savings: pd.DataFrame
    breakdown: pd.DataFrame
    pareto: list[str]
    pairs: list[PerplexityPair]
    comparisons: pd.DataFrame
    differential: list[GroupDifferential]
    time_share: list[TimeShareEstimate]
    options: Options
    notes: list[str]
    power_sources: dict[int, str] = field(default_factory=dict)
    prefill_regression: pd.DataFrame = field(default_factory=pd.DataFrame)
    lag: pd.DataFrame = field(default_factory=pd.DataFrame)
