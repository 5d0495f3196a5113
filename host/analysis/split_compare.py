"""Split configurations beside their parents: per-phase J/token differences, and whether a
split beats both of its parent maps.

A split configuration (docs/campaign.md, "Split configurations") prefills on one map and
decodes on another. Its runs' run.json names both (`split.prefill`, `split.decode`), so the
analysis knows its parents without the study file. For every split and each phase (prefill,
decode, the whole request) this compares the split's J/token with each parent's, paired by
campaign round as every comparison of the analysis is (host.analysis.paired), and says:

- **beats both**: the whole request's J/token is lower than both parents' and both
  differences' intervals exclude 0;
- **does not beat both**: it is higher than one parent's with an interval excluding 0;
- **undecided** otherwise, with what would decide it (more paired rounds).

The handover's time and energy lie inside the split's decode window (host/analysis/split.py),
so they are in these figures, never left out.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import pandas as pd

from epi.core.errors import UserError
from host.analysis import paired
from host.analysis.vocabulary import SCOPE_ALL, Phase, TokenUnit

SPLITS_JSON = "splits.json"
SplitVerdict = Literal["beats both", "does not beat both", "undecided"]
PHASES = (Phase.PREFILL, Phase.DECODE, Phase.REQUEST)


def phase_unit(phase: str) -> str:
    """The token a phase's J/token counts: prefill per prompt token, the others per
    generated token (as results.csv gives them)."""
    return TokenUnit.PROMPT if phase == Phase.PREFILL else TokenUnit.GENERATED


@dataclass(frozen=True)
class SplitParents:
    """A split configuration and the configurations (map ids) it prefills and decodes on."""

    config: str
    prefill: str
    decode: str


@dataclass(frozen=True)
class PhaseDifference:
    """The split's J/token minus one parent's, in one phase (paired by round)."""

    split: str
    parent: str
    role: Literal["prefill", "decode"]  # which phase the parent supplies in the split
    phase: str
    delta_j_per_token: float
    ci_lo: float
    ci_hi: float
    ci_coverage: float
    saving_pct: float  # (parent − split) / parent · 100: positive when the split is cheaper
    n_pairs: int
    method: str
    reason: str

    @property
    def decided(self) -> bool:
        return bool(np.isfinite(self.ci_lo) and np.isfinite(self.ci_hi)
                    and (self.ci_lo > 0 or self.ci_hi < 0))


def split_parents(headers: Sequence[tuple[str, Mapping[str, object]]]) -> list[SplitParents]:
    """(configuration, run.json header) of every run → each split configuration's parents."""
    out: dict[str, SplitParents] = {}
    for config, header in headers:
        split = header.get("split")
        if not isinstance(split, dict):
            continue
        pre, dec = split.get("prefill"), split.get("decode")
        if isinstance(pre, dict) and isinstance(dec, dict):
            out[config] = SplitParents(config, str(pre.get("map_id")), str(dec.get("map_id")))
    return [out[k] for k in sorted(out)]


def _repeats(rep: pd.DataFrame, runs: pd.DataFrame, config: str, phase: str, basis: str
             ) -> tuple[np.ndarray, ...]:
    """(J/token, start times, run ids, campaign rounds) of a configuration's valid runs'
    repeats, whole model scope, per the phase's token (phase_unit)."""
    ok = set(runs[(runs["phase"] == phase) & runs["valid"].astype(bool)]["run_id"])
    g = rep[(rep["config"] == config) & (rep["scope"] == SCOPE_ALL) & (rep["phase"] == phase)
            & (rep["unit"] == phase_unit(phase)) & (rep["basis"] == basis)
            & rep["run_id"].isin(ok)]
    v = pd.to_numeric(g["j_per_token"], errors="coerce").to_numpy(np.float64)
    t = pd.to_numeric(g["t_start_meter_ns"], errors="coerce").to_numpy(np.float64)
    k = (pd.to_numeric(g["campaign_round"], errors="coerce").to_numpy(np.float64)
         if "campaign_round" in g.columns else np.full(len(g), np.nan))
    keep = np.isfinite(v) & np.isfinite(t)
    return v[keep], t[keep], g["run_id"].to_numpy(object)[keep], k[keep]


def differences(rep: pd.DataFrame, runs: pd.DataFrame, splits: Sequence[SplitParents], *,
                basis: str, level: float = 0.95) -> list[PhaseDifference]:
    """Every split against each parent in every phase."""
    out = []
    for s in splits:
        for role, parent in (("prefill", s.prefill), ("decode", s.decode)):
            for phase in PHASES:
                va, ta, ra, ka = _repeats(rep, runs, parent, phase, basis)
                vb, tb, rb, kb = _repeats(rep, runs, s.config, phase, basis)
                d = paired.energy_difference(va, ta, vb, tb, level=level, block_a=ra,
                                             block_b=rb, round_a=ka, round_b=kb)
                out.append(PhaseDifference(
                    split=s.config, parent=parent, role=role,  # type: ignore[arg-type]
                    phase=str(phase), delta_j_per_token=float(d["delta"]),
                    ci_lo=float(d["delta_ci_lo"]), ci_hi=float(d["delta_ci_hi"]),
                    ci_coverage=float(d["ci_coverage"]), saving_pct=float(d["saving_pct"]),
                    n_pairs=int(d["n_pairs"]), method=str(d["method"]),
                    reason=str(d["reason"])))
    return out


def verdict(diffs: Sequence[PhaseDifference], split: str) -> SplitVerdict:
    """Whether `split` beats both parents over the whole request (see the module docstring)."""
    req = [d for d in diffs if d.split == split and d.phase == Phase.REQUEST]
    if len(req) == 2 and all(d.decided and d.ci_hi < 0 for d in req):
        return "beats both"
    if any(d.decided and d.ci_lo > 0 for d in req):
        return "does not beat both"
    return "undecided"


def write(splits: Sequence[SplitParents], diffs: Sequence[PhaseDifference]) -> bytes:
    """The splits.json document (parents, per-phase differences, each split's verdict)."""
    doc = {"splits": [{**asdict(s), "verdict": verdict(diffs, s.config)} for s in splits],
           "differences": [asdict(d) for d in diffs]}
    return (json.dumps(doc, indent=1, allow_nan=True) + "\n").encode()


def read(analysis_dir: Path) -> tuple[list[SplitParents], list[PhaseDifference]]:
    """splits.json back ([] and [] when the study has no split or the file is absent)."""
    path = analysis_dir / SPLITS_JSON
    if not path.is_file():
        return [], []
    try:
        doc = json.loads(path.read_text())
        splits = [SplitParents(str(s["config"]), str(s["prefill"]), str(s["decode"]))
                  for s in doc["splits"]]
        diffs = [PhaseDifference(**d) for d in doc["differences"]]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise UserError(f"{path}: not a split comparison written by epi analyze ({exc!r}); "
                        "analyse again to rewrite it") from None
    return splits, diffs
