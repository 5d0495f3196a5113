"""The search's result records: summary.json, and what the page, the figure and the command's
closing lines read from it.

host/search/driver.py builds them from the search state; `to_json` writes summary.json with
the keys in the order the file has always had them (optional keys only where they always
appeared), so a reader of the file sees no change while the code reads fields, not strings.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from epi.formats.json_types import JSON
from host.search.decide import CandidateVerdict
from host.search.measure import Measured
from host.search.models import Predictor
from host.search.records import Prediction

SEARCH_FORMAT = "epi-search"
SEARCH_FORMAT_VERSION = 1

ConfigKind = Literal["search", "hand-made", "split", "other"]


@dataclass(frozen=True)
class FrontierMove:
    """A found map not dominated by a hand-made one, against the hand-made map it is judged by.

    With `j_saving_frac` set, `against` is the cheapest hand-made map at least as accurate;
    without, no hand-made map is that accurate and `against` is the most accurate one, which
    the map beats by `accuracy_gain`."""

    config: str
    j_per_token: float
    accuracy: float
    against: str
    against_accuracy: float | None = None
    j_saving_frac: float | None = None
    accuracy_gain: float | None = None
    intervals_overlap: bool | None = None  # None: an interval is unknown, or no saving

    def to_json(self) -> dict[str, JSON]:
        doc: dict[str, JSON] = {"config": self.config, "j_per_token": self.j_per_token,
                                  "accuracy": self.accuracy}
        if self.j_saving_frac is not None:
            doc.update(against=self.against, against_accuracy=self.against_accuracy,
                       j_saving_frac=self.j_saving_frac,
                       intervals_overlap=self.intervals_overlap)
        else:
            doc.update(against=self.against, accuracy_gain=self.accuracy_gain,
                       intervals_overlap=None)
        return doc


@dataclass(frozen=True)
class FrontierShift:
    """How far the measured search maps move the measured hand-made frontier, in words and
    per map; `hand_made_frontier` is the non-dominated (J/token, accuracy) points."""

    text: str
    moves: tuple[FrontierMove, ...]
    hand_made_frontier: tuple[tuple[float, float], ...]

    def to_json(self) -> dict[str, JSON]:
        return {"text": self.text, "moves": [m.to_json() for m in self.moves],
                "hand_made_frontier": [list(p) for p in self.hand_made_frontier]}


@dataclass(frozen=True)
class SearchVerdict:
    """Measured search maps against the measured hand-made maps: the sentence, the frontier
    shift and each candidate's settled comparison (`not_compared`: candidates without one)."""

    text: str
    on_or_beyond_frontier: tuple[str, ...]
    best_hand_made: str | None
    best_search: str | None
    frontier: FrontierShift
    comparisons: tuple[CandidateVerdict, ...]
    comparison_counts: dict[str, int]
    not_compared: tuple[str, ...]

    def to_json(self) -> dict[str, object]:
        return {"text": self.text, "on_or_beyond_frontier": list(self.on_or_beyond_frontier),
                "best_hand_made": self.best_hand_made, "best_search": self.best_search,
                "frontier": self.frontier.to_json(), "comparisons": list(self.comparisons),
                "comparison_counts": self.comparison_counts,
                "not_compared": list(self.not_compared)}


@dataclass(frozen=True)
class ConfigRow:
    """One measured configuration: its latest measured figures beside the KLs, the final
    energy fit's residual and, for a search map, its layers, its comparison and the prediction
    made when it was picked (None: a state written before predictions were stored)."""

    config: str
    kind: ConfigKind
    measured: Measured
    direct_kl_nats: float | None
    proxy_kl_nats: float | None
    energy_residual_j: float | None
    assignment: str | None = None  # layers:type text; set for search maps only
    bpw: float | None = None  # bits per weight, where the search path holds the map
    decision: CandidateVerdict | None = None
    prediction: Prediction | None = None

    def to_json(self) -> dict[str, object]:
        doc: dict[str, object] = {
            "config": self.config, "kind": self.kind, "measured": self.measured.as_dict(),
            "direct_kl_nats": self.direct_kl_nats, "proxy_kl_nats": self.proxy_kl_nats,
            "energy_residual_j": self.energy_residual_j,
        }
        if self.assignment is not None:
            doc["assignment"] = self.assignment
            if self.bpw is not None:
                doc["bpw"] = self.bpw
            doc["decision"] = self.decision
            if self.prediction is None:
                doc["prediction_note"] = "no pick-time prediction was stored"
            else:
                doc.update(self.prediction.to_json())
                doc["predicted_at"] = "pick time, before measuring"
        return doc


@dataclass(frozen=True)
class SearchSummary:
    """The search's result (summary.json): the space's types, both fitted models with the
    proxy's rank correlations, the (proxy, direct) KL pairs, every configuration, the verdict."""

    types: tuple[str, ...]
    predictor: Predictor  # the final fit, over every measured configuration
    additivity_pairs_nats: tuple[tuple[float, float | None], ...]
    configs: tuple[ConfigRow, ...]
    verdict: SearchVerdict

    def to_json(self) -> dict[str, object]:
        p = self.predictor
        return {
            "format": SEARCH_FORMAT, "format_version": SEARCH_FORMAT_VERSION,
            "types": list(self.types),
            "energy_model": {"intercept_j": p.energy.intercept, "j_per_gb": p.energy.slope,
                             "n": p.energy.n, "residual_sd_j": p.energy.residual_sd,
                             "residuals_j": list(p.energy.residuals),
                             "fitted": p.energy.fitted},
            "accuracy_model": {"intercept": p.accuracy.intercept, "per_nat": p.accuracy.slope,
                               "n": p.accuracy.n, "x": "direct whole-file KL (nats/token)",
                               "residuals": list(p.accuracy.residuals),
                               "fitted": p.accuracy.fitted, "clamped": p.accuracy.clamped},
            "proxy_rank_correlation": p.proxy_rank_correlation,
            "proxy_rank_correlation_n": p.proxy_n,
            "direct_kl_rank_correlation": p.direct_kl_rank_correlation,
            "direct_kl_ppl_rank_correlation": p.direct_kl_ppl_rank_correlation,
            "proxy_ppl_rank_correlation": p.proxy_ppl_rank_correlation,
            "ppl_rank_correlation_n": p.ppl_n,
            "additivity_pairs_nats": [list(pair) for pair in self.additivity_pairs_nats],
            "configs": [r.to_json() for r in self.configs],
            "verdict": self.verdict.to_json(),
        }
