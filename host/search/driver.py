"""`epi search`: propose per-layer maps from cheap proxies, measure the most promising through
the campaign, refit, repeat until the budget of measured candidates is spent.

Honesty rules kept here: a candidate counts only by its measured figures (predictions are kept
beside them, never in their place); the verdict compares measured search maps with measured
hand-made maps; and when nothing beats the hand-made frontier, the verdict says so.
State is saved after every round (search.json), so the same command continues a stopped search.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from epi.core.errors import UserError
from epi.core.files import write_json_atomic
from host.search.measure import Measured, Measurer
from host.search.models import Predictor, fit_predictor
from host.search.optimizer import Budget, Candidate, descent_path, pick_candidates
from host.search.space import SearchSpace, assignment_text, mixmap_document, write_mixmap

SEARCH_FORMAT = "epi-search"
SEARCH_FORMAT_VERSION = 1


@dataclass
class SearchSettings:
    """Everything a search needs besides the model and the measurer."""

    out: Path
    budget: Budget = field(default_factory=Budget)
    candidates: int = 4  # measured search candidates in total
    per_round: int = 2
    objective: str = "epi"
    against: list[Path] = field(default_factory=list)  # hand-made maps
    seed: int = 0


@dataclass
class SearchState:
    """What has been measured so far, round by round."""

    rounds: list[dict[str, Any]] = field(default_factory=list)
    measured: list[Measured] = field(default_factory=list)
    direct_kl: dict[str, float] = field(default_factory=dict)  # config -> KL of its file
    search_maps: dict[str, list[str]] = field(default_factory=dict)  # config -> assignment

    def to_json(self) -> dict[str, Any]:
        return {
            "format": SEARCH_FORMAT, "format_version": SEARCH_FORMAT_VERSION,
            "rounds": self.rounds,
            "measured": [m.as_dict() for m in self.measured],
            "direct_kl_nats": self.direct_kl,
            "search_maps": self.search_maps,
        }

    @classmethod
    def load(cls, path: Path) -> SearchState:
        if not path.exists():
            return cls()
        try:
            doc = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise UserError(f"{path}: unreadable search state ({exc})") from exc
        if doc.get("format") != SEARCH_FORMAT:
            raise UserError(f"{path}: format: expected {SEARCH_FORMAT!r}")
        measured = []
        for m in doc.get("measured", []):
            m = dict(m)
            m["j_per_token_ci"] = tuple(m["j_per_token_ci"])
            m["epi_ci"] = tuple(m["epi_ci"])
            measured.append(Measured(**m))
        return cls(doc.get("rounds", []), measured, dict(doc.get("direct_kl_nats", {})),
                   {k: list(v) for k, v in doc.get("search_maps", {}).items()})


def fit_from(state: SearchState) -> Predictor:
    """Refit both models on every usable measured configuration (latest round per config)."""
    latest: dict[str, Measured] = {}
    for m in state.measured:
        latest[m.config] = m
    pts = [m for m in latest.values() if m.usable and m.size_bytes and m.config in state.direct_kl]
    return fit_predictor([m.size_bytes / 1e9 for m in pts], [m.j_per_token for m in pts],
                         [state.direct_kl[m.config] for m in pts], [m.accuracy for m in pts])


def dominated(point: tuple[float, float], others: Sequence[tuple[float, float]]) -> bool:
    """(J/token, accuracy) is dominated: another point is no worse in both, better in one."""
    j, a = point
    return any(oj <= j and oa >= a and (oj < j or oa > a) for oj, oa in others)


def verdict(state: SearchState, hand_made: set[str]) -> dict[str, Any]:
    """Measured search maps against the measured hand-made frontier."""
    latest: dict[str, Measured] = {}
    for m in state.measured:
        latest[m.config] = m
    hand = [m for c, m in latest.items() if c in hand_made and m.usable]
    found = [m for c, m in latest.items() if c in state.search_maps and m.usable]
    hand_pts = [(m.j_per_token, m.accuracy) for m in hand]
    on_or_beyond = [m.config for m in found if not dominated((m.j_per_token, m.accuracy), hand_pts)]
    best_hand = min((m for m in hand if math.isfinite(m.epi)), key=lambda m: m.epi, default=None)
    best_found = min((m for m in found if math.isfinite(m.epi)), key=lambda m: m.epi,
                     default=None)
    if not found:
        text = "no search candidate has valid measured figures: nothing can be claimed"
    elif best_hand is None:
        text = "no hand-made map has valid measured figures to compare against"
    elif best_found is not None and best_found.epi < best_hand.epi:
        hi = best_found.epi_ci[1]
        overlap = math.isfinite(hi) and math.isfinite(best_hand.epi_ci[0]) and \
            hi >= best_hand.epi_ci[0]
        text = (f"{best_found.config} has a lower measured EPI ({best_found.epi:.4g}) than the "
                f"best hand-made map {best_hand.config} ({best_hand.epi:.4g})"
                + ("; their intervals overlap, so the two cannot be told apart" if overlap else ""))
    else:
        text = (f"the search found nothing with a lower measured EPI than the best hand-made map "
                f"{best_hand.config} ({best_hand.epi:.4g}) within its budget")
    return {"text": text, "on_or_beyond_frontier": on_or_beyond,
            "best_hand_made": best_hand.config if best_hand else None,
            "best_search": best_found.config if best_found else None}


def run_search(
    space: SearchSpace,
    kl_table: dict[tuple[int, str], float],
    settings: SearchSettings,
    measure: Measurer,
    direct_kl: Callable[[Path], float],
    echo: Callable[[str], None] = print,
) -> tuple[SearchState, list[Candidate], Predictor]:
    """The propose → measure → refit loop; returns the state, the descent path and the fit."""
    state_path = settings.out / "search.json"
    state = SearchState.load(state_path)
    path = descent_path(space, kl_table)
    echo(f"descent: {len(path)} states from {path[0].bpw:.3f} to {path[-1].bpw:.3f} bits/weight")
    anchor = settings.against[:1]
    while True:
        measured_search = len(state.search_maps)
        round_no = len(state.rounds)
        if round_no > 0 and measured_search >= settings.candidates:
            break
        predictor = fit_from(state) if state.measured else None
        exclude = {tuple(v) for v in state.search_maps.values()}
        k = min(settings.per_round, settings.candidates - measured_search)
        picks = pick_candidates(path, predictor, settings.budget, k, exclude, settings.objective)
        if not picks and round_no > 0:
            echo("no unmeasured candidate is left inside the budget")
            break
        round_dir = settings.out / f"round{round_no}"
        maps: list[Path] = list(settings.against) if round_no == 0 else list(anchor)
        for c in picks:
            cid = f"search_r{round_no}_s{c.step:03d}"
            pred = {} if predictor is None else {
                "predicted_j_per_token": predictor.j_per_token(c.gb),
                "predicted_accuracy": predictor.accuracy_of(c.kl),
                "predicted_epi": predictor.epi(c.gb, c.kl),
            }
            doc = mixmap_document(
                cid, c.assignment, space,
                f"epi search round {round_no}, descent step {c.step}: {c.bpw:.3f} bpw, "
                f"proxy KL {c.kl:.3e} nats/token",
            )
            map_path = round_dir / "maps" / f"{cid}.json"
            write_mixmap(map_path, doc)
            maps.append(map_path)
            state.search_maps[cid] = list(c.assignment)
            echo(f"round {round_no}: {cid} {assignment_text(c.assignment)} ({c.bpw:.3f} bpw)"
                 + (f", predicted EPI {pred['predicted_epi']:.4g}" if pred else ""))
        results = measure(round_no, round_dir, maps)
        for m in results:
            if m.gguf and m.config not in state.direct_kl and Path(m.gguf).exists():
                state.direct_kl[m.config] = direct_kl(Path(m.gguf))
        state.measured.extend(results)
        state.rounds.append({"round": round_no, "maps": [p.name for p in maps],
                             "picked": [f"search_r{round_no}_s{c.step:03d}" for c in picks]})
        write_json_atomic(state_path, state.to_json())
    predictor = fit_from(state)
    return state, path, predictor


def summary(state: SearchState, path: list[Candidate], predictor: Predictor,
            space: SearchSpace, hand_made: set[str]) -> dict[str, Any]:
    """The search's result document: every measured configuration with its predicted and
    measured figures side by side, both fitted models with their validity, and the verdict."""
    by_assignment = {c.assignment: c for c in path}
    rows = []
    latest: dict[str, Measured] = {}
    for m in state.measured:
        latest[m.config] = m
    for cfg, m in latest.items():
        assignment = state.search_maps.get(cfg)
        c = by_assignment.get(tuple(assignment)) if assignment else None
        row = {"config": cfg, "kind": "search" if assignment else "hand-made",
               "measured": m.as_dict(), "direct_kl_nats": state.direct_kl.get(cfg)}
        if c is not None:
            row.update(assignment=assignment_text(c.assignment), bpw=c.bpw,
                       proxy_kl_nats=c.kl,
                       predicted_j_per_token=predictor.j_per_token(c.gb),
                       predicted_accuracy=predictor.accuracy_of(c.kl),
                       predicted_epi=predictor.epi(c.gb, c.kl),
                       predicted_epi_interval=predictor.epi_interval(c.gb, c.kl))
        rows.append(row)
    additivity = [(r["proxy_kl_nats"], r["direct_kl_nats"]) for r in rows
                  if r.get("proxy_kl_nats") is not None and r.get("direct_kl_nats") is not None]
    return {
        "format": SEARCH_FORMAT, "format_version": SEARCH_FORMAT_VERSION,
        "types": list(space.types),
        "energy_model": {"intercept_j": predictor.energy.intercept,
                         "j_per_gb": predictor.energy.slope, "n": predictor.energy.n,
                         "residuals_j": list(predictor.energy.residuals),
                         "fitted": predictor.energy.fitted},
        "accuracy_model": {"intercept": predictor.accuracy.intercept,
                           "per_nat": predictor.accuracy.slope, "n": predictor.accuracy.n,
                           "residuals": list(predictor.accuracy.residuals),
                           "fitted": predictor.accuracy.fitted},
        "proxy_rank_correlation": predictor.proxy_rank_correlation,
        "additivity_pairs_nats": additivity,
        "configs": rows,
        "verdict": verdict(state, hand_made),
    }
