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
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import cast

from epi.core.errors import UserError
from epi.core.files import write_json_atomic
from epi.formats.fields import check_float
from epi.formats.json_types import JSON
from host.campaign.adaptive import DecisionRules
from host.search.decide import (
    CandidateVerdict,
    best_hand_made_by,
    candidate_verdict,
    verdict_counts,
)
from host.search.identity import check_identity
from host.search.measure import Measured, Measurer, PhaseSplit
from host.search.models import Predictor, fit_predictor
from host.search.optimizer import Budget, Candidate, descent_path, pick_candidates
from host.search.records import Prediction, SearchRound
from host.search.sensitivity import candidate_kl
from host.search.space import (
    SearchSpace,
    assignment_of_map,
    assignment_text,
    mixmap_document,
    write_mixmap,
)
from host.search.summary import (
    SEARCH_FORMAT,
    SEARCH_FORMAT_VERSION,
    ConfigKind,
    ConfigRow,
    FrontierMove,
    FrontierShift,
    SearchSummary,
    SearchVerdict,
)


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
    # the candidate rounds' decision rules (each campaign's [decide]: rounds, margin, alpha)
    rules: DecisionRules = field(default_factory=lambda: DecisionRules(("baseline",)))
    # what a state of this search must describe (host.search.identity.search_identity)
    identity: dict[str, JSON] = field(default_factory=dict)
    # the phase split as a dimension: each pick is also measured as two split configurations
    # with the round's baseline (prefill on one, decode on the other; `phase_splits`)
    phase_split: bool = False


@dataclass
class SearchState:
    """What has been measured so far, round by round."""

    rounds: list[SearchRound] = field(default_factory=list)
    measured: list[Measured] = field(default_factory=list)
    direct_kl: dict[str, float] = field(default_factory=dict)  # config -> KL of its file
    search_maps: dict[str, list[str]] = field(default_factory=dict)  # config -> assignment
    # config -> the prediction made when it was picked (before it was measured), with interval
    predictions: dict[str, Prediction] = field(default_factory=dict)
    # config -> summed per-layer proxy KL (search maps; hand-made maps expressible in the space)
    proxy_kl: dict[str, float] = field(default_factory=dict)
    # the model, maps, options and build this state describes (None: an older state's)
    identity: dict[str, JSON] | None = None
    # config -> its settled comparison with the best hand-made map (host.search.decide)
    verdicts: dict[str, CandidateVerdict] = field(default_factory=dict)
    # split configuration -> [prefill map id, decode map id] (`epi search --phase-split`)
    phase_splits: dict[str, list[str]] = field(default_factory=dict)

    @property
    def candidates(self) -> list[str]:
        """Every configuration the search proposed: its maps, then its split pairs."""
        return [*self.search_maps, *self.phase_splits]

    def to_json(self) -> dict[str, object]:
        return {
            "format": SEARCH_FORMAT, "format_version": SEARCH_FORMAT_VERSION,
            "rounds": [r.to_json() for r in self.rounds],
            "measured": [m.as_dict() for m in self.measured],
            "direct_kl_nats": self.direct_kl,
            "search_maps": self.search_maps,
            "predictions": {k: p.to_json() for k, p in self.predictions.items()},
            "proxy_kl_nats": self.proxy_kl,
            "identity": self.identity,
            "verdicts": self.verdicts,
            # only a search with splits writes the key: the others' state is as it was
            **({"phase_splits": self.phase_splits} if self.phase_splits else {}),
        }

    @classmethod
    def load(cls, path: Path) -> SearchState:
        """The saved state, every field checked: a state that is not an object, lacks a
        field, or holds a non-finite KL is one line, never a crash or a hang."""
        if not path.exists():
            return cls()
        try:  # NaN stands for "not measured" in this file: plain json, not the strict reader
            doc = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise UserError(f"{path}: unreadable search state ({exc})") from None
        if not isinstance(doc, dict):
            raise UserError(f"{path}: expected a search state object, got "
                            f"{type(doc).__name__}")
        if doc.get("format") != SEARCH_FORMAT:
            raise UserError(f"{path}: format: expected {SEARCH_FORMAT!r}")

        def table(key: str) -> dict[str, object]:
            v = doc.get(key, {})
            if not isinstance(v, dict):
                raise UserError(f"{path}: field {key!r}: expected an object")
            return v

        def kl(key: str) -> dict[str, float]:
            return {k: check_float(v, f"{path}: field {key}.{k}", lo=0.0)
                    for k, v in table(key).items()}

        rounds = doc.get("rounds", [])
        measured = doc.get("measured", [])
        if not isinstance(rounds, list) or not all(isinstance(r, dict) for r in rounds):
            raise UserError(f"{path}: field 'rounds': expected a list of objects")
        round_records = [SearchRound.from_json(r, f"{path}: rounds[{i}]")
                         for i, r in enumerate(rounds)]
        if not isinstance(measured, list):
            raise UserError(f"{path}: field 'measured': expected a list")
        maps: dict[str, list[str]] = {}
        for k, v in table("search_maps").items():
            if not isinstance(v, list) or not all(isinstance(t, str) for t in v):
                raise UserError(f"{path}: field search_maps.{k}: expected a list of types")
            maps[k] = list(v)
        if not all(isinstance(v, dict) for v in table("predictions").values()):
            raise UserError(f"{path}: field 'predictions': expected objects")
        preds = {k: Prediction.from_json(v, f"{path}: predictions.{k}")
                 for k, v in table("predictions").items()}
        identity = doc.get("identity")
        if identity is not None and not isinstance(identity, dict):
            raise UserError(f"{path}: field 'identity': expected an object")
        verdicts = {k: v for k, v in table("verdicts").items() if isinstance(v, dict)}
        if len(verdicts) != len(table("verdicts")) or not all(
                isinstance(v.get("state"), str) and isinstance(v.get("text"), str)
                for v in verdicts.values()):
            raise UserError(f"{path}: field 'verdicts': expected objects with a state and a "
                            "text")
        splits: dict[str, list[str]] = {}
        for k, v in table("phase_splits").items():
            if not (isinstance(v, list) and len(v) == 2 and all(isinstance(t, str) for t in v)):
                raise UserError(f"{path}: field phase_splits.{k}: expected [prefill map id, "
                                "decode map id]")
            splits[k] = list(v)
        return cls(round_records,
                   [Measured.from_json(m, f"{path}: measured[{i}]")
                    for i, m in enumerate(measured)],
                   kl("direct_kl_nats"), maps, preds, kl("proxy_kl_nats"), identity,
                   cast(dict[str, CandidateVerdict], verdicts),  # state and text checked
                   splits)


def map_id_of(p: Path) -> str:
    """A map file's configuration id: its `id`, else its file name's stem."""
    try:
        doc = json.loads(p.read_text())
    except (OSError, ValueError):
        return p.stem
    return str(doc.get("id") or p.stem) if isinstance(doc, dict) else p.stem


def settle_round(state: SearchState, results: Sequence[Measured], baseline: str,
                 picked: Sequence[str], rules: DecisionRules,
                 echo: Callable[[str], None]) -> None:
    """Each pick's settled comparison with `baseline`, measured beside it in this round's
    campaign, into `state.verdicts` (host.search.decide)."""
    by = {m.config: m for m in results}
    rounds_done = max((len(m.per_round_j) for m in results), default=0)
    for cid in picked:
        if cid not in by or baseline not in by:
            continue  # the campaign measurer refuses a round that lacks a map (check_covered)
        v = candidate_verdict(by[baseline], by[cid], rules, rounds_done)
        state.verdicts[cid] = v
        echo(f"round {by[cid].round}: {v['text']}")


def check_state(path: Path, identity: dict[str, JSON]) -> SearchState:
    """The saved state, refused in one line if it describes another search; a state with
    nothing measured yet becomes this search's."""
    state = SearchState.load(path)
    check_identity(state.identity, identity,
                   bool(state.rounds or state.measured or state.search_maps), path)
    state.identity = identity
    return state


def latest_measured(state: SearchState) -> dict[str, Measured]:
    """The measurement of each configuration that counts: its latest with valid figures, else
    its latest (the anchor is measured every round).

    A re-measurement whose runs were all invalid has no figures; it does not erase an earlier
    valid one, whose reason then names the round its figures come from and why the later
    round's do not count.
    """
    latest: dict[str, Measured] = {}
    valid: dict[str, Measured] = {}
    for m in state.measured:
        latest[m.config] = m
        if m.usable:
            valid[m.config] = m
    out = {}
    for cfg, m in latest.items():
        earlier = valid.get(cfg)
        if m.usable or earlier is None:
            out[cfg] = m
        else:
            out[cfg] = replace(earlier, reason=(
                f"figures of round {earlier.round}; its round {m.round} re-measurement has "
                f"none ({m.reason or 'no valid runs'})"))
    return out


def fit_from(state: SearchState) -> Predictor:
    """Refit both models on every usable measured configuration (latest round per config).

    The accuracy fit's x is the directly measured whole-file KL; the proxy's rank correlation
    is computed on the summed per-layer proxy where a configuration has one (NaN elsewhere).
    """
    # accuracy is scored whether or not the metered runs were valid: every configuration with
    # a measured composite is an accuracy point; J/token NaN drops it from the energy fit only
    pts = [m for m in latest_measured(state).values()
           if math.isfinite(m.accuracy) and m.size_bytes and m.config in state.direct_kl]
    return fit_predictor([(m.size_bytes or 0) / 1e9 for m in pts], [m.j_per_token for m in pts],
                         [state.direct_kl[m.config] for m in pts], [m.accuracy for m in pts],
                         [state.proxy_kl.get(m.config, math.nan) for m in pts],
                         [m.perplexity for m in pts])


def dominated(point: tuple[float, float], others: Sequence[tuple[float, float]]) -> bool:
    """(J/token, accuracy) is dominated: another point is no worse in both, better in one."""
    j, a = point
    return any(oj <= j and oa >= a and (oj < j or oa > a) for oj, oa in others)


def frontier(points: Sequence[tuple[float, float]]) -> list[tuple[float, float]]:
    """The non-dominated (J/token, accuracy) points, cheapest first."""
    return sorted({p for p in points if not dominated(p, points)})


def frontier_shift(hand: Sequence[Measured], found: Sequence[Measured]) -> FrontierShift:
    """How far the measured search maps move the measured hand-made frontier, if at all.

    For each found map not dominated by a hand-made one: the J/token it saves against the
    cheapest hand-made map at least as accurate (a fraction of that map's J/token), and whether
    that is at equal accuracy (a gain) or at lower accuracy (a new trade-off point), or, when no
    hand-made map is that accurate, the accuracy it adds above the most accurate one. Point
    figures only: whether a shift exceeds the J/token intervals is stated beside it.
    """
    hand_pts = [(m.j_per_token, m.accuracy) for m in hand]
    moves = []
    for m in found:
        if dominated((m.j_per_token, m.accuracy), hand_pts):
            continue
        better = [h for h in hand if h.accuracy >= m.accuracy]
        if better:
            ref = min(better, key=lambda h: h.j_per_token)
            move = FrontierMove(m.config, m.j_per_token, m.accuracy, against=ref.config,
                                against_accuracy=ref.accuracy,
                                j_saving_frac=(ref.j_per_token - m.j_per_token) / ref.j_per_token,
                                intervals_overlap=_overlap(m.j_per_token_ci, ref.j_per_token_ci))
        else:
            ref = max(hand, key=lambda h: h.accuracy)
            move = FrontierMove(m.config, m.j_per_token, m.accuracy, against=ref.config,
                                accuracy_gain=m.accuracy - ref.accuracy)
        moves.append(move)
    if not hand or not found:
        text = "no frontier comparison: measured points are missing on one side"
    elif not moves:
        text = "the frontier did not move: every measured search map is dominated by a " \
               "hand-made map"
    else:
        parts = []
        for mv in moves:
            if mv.j_saving_frac is not None and mv.against_accuracy is not None:
                ref_acc = mv.against_accuracy
                trade = ("at equal accuracy" if mv.accuracy >= ref_acc else
                         f"at lower accuracy ({mv.accuracy:.3g} vs {ref_acc:.3g}): a new "
                         "trade-off point, not a gain at equal accuracy")
                parts.append(f"{mv.config} uses {100 * mv.j_saving_frac:.1f} % less "
                             f"J/token than {mv.against}, the cheapest hand-made map at "
                             f"least as accurate, {trade}"
                             + (" (J/token intervals overlap)" if mv.intervals_overlap
                                else ""))
            else:
                parts.append(f"{mv.config} is {mv.accuracy_gain:+.3f} more accurate than "
                             f"the most accurate hand-made map {mv.against}")
        text = "the frontier moved: " + "; ".join(parts)
    return FrontierShift(text, tuple(moves), tuple(frontier(hand_pts)))


def _overlap(a: tuple[float, float], b: tuple[float, float]) -> bool | None:
    if not all(math.isfinite(v) for v in (*a, *b)):
        return None
    return a[0] <= b[1] and b[0] <= a[1]


def verdict(state: SearchState, hand_made: set[str]) -> SearchVerdict:
    """Measured search maps against the measured hand-made frontier."""
    latest = latest_measured(state)
    hand = [m for c, m in latest.items() if c in hand_made and m.usable]
    found = [m for c, m in latest.items() if c in state.candidates and m.usable]
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
        overlap = _overlap(best_found.epi_ci, best_hand.epi_ci)
        text = (f"{best_found.config} has a lower measured EPI ({best_found.epi:.4g}) than the "
                f"best hand-made map {best_hand.config} ({best_hand.epi:.4g})"
                + ("; their intervals overlap, so the two cannot be told apart" if overlap else ""))
    else:
        text = (f"the search found nothing with a lower measured EPI than the best hand-made map "
                f"{best_hand.config} ({best_hand.epi:.4g}) within its budget")
        if best_found is not None:
            overlap = _overlap(best_found.epi_ci, best_hand.epi_ci)
            text += (f"; its best, {best_found.config}, measured {best_found.epi:.4g}"
                     + ("; their intervals overlap, so the two cannot be told apart"
                        if overlap else ""))
    decided = [state.verdicts[c] for c in state.candidates if c in state.verdicts]
    unjudged = [c for c in state.candidates if c not in state.verdicts]
    return SearchVerdict(text, tuple(on_or_beyond),
                         best_hand.config if best_hand else None,
                         best_found.config if best_found else None,
                         frontier_shift(hand, found), tuple(decided), verdict_counts(decided),
                         tuple(unjudged))


def _num(x: object) -> str:
    ok = isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)
    return f"{x:.4g}" if ok else "n/a"


def _finite_or_none(x: float) -> float | None:
    return x if math.isfinite(x) else None


def pick_prediction(predictor: Predictor | None, c: Candidate) -> Prediction:
    """What the models said of candidate `c` when it was picked, before it was measured.

    Stored in the search state and reported as "predicted": a prediction refitted afterwards
    would include the candidate's own measurement and flatter the models. Round 0 picks have no
    fitted models, so their prediction is empty (None figures), not invented.
    """
    if predictor is None:
        return Prediction(None, None, None, (None, None), fit_n=0, accuracy_fit_n=0)
    lo, hi = predictor.epi_interval(c.gb, c.kl)
    return Prediction(_finite_or_none(predictor.j_per_token(c.gb)),
                      _finite_or_none(predictor.accuracy_of(c.kl)),
                      _finite_or_none(predictor.epi(c.gb, c.kl)),
                      (_finite_or_none(lo), _finite_or_none(hi)),
                      fit_n=predictor.energy.n, accuracy_fit_n=predictor.accuracy.n)


def _prediction_text(pred: Prediction) -> str:
    """', predicted EPI x [lo, hi]' of a pick-time prediction, or that there is none."""
    if pred.epi is None:
        return ", no prediction (no fitted model)"
    lo, hi = pred.epi_interval
    return f", predicted EPI {_num(pred.epi)} [{_num(lo)}, {_num(hi)}]"


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
    state = check_state(state_path, settings.identity)
    path = descent_path(space, kl_table)
    echo(f"descent: {len(path)} states from {path[0].bpw:.3f} to {path[-1].bpw:.3f} bits/weight")
    hand_paths = {map_id_of(p): p for p in settings.against}
    hand_assignments: set[tuple[str, ...]] = set()
    for p in settings.against:  # hand-made maps on the same summed proxy, where expressible
        assignment, why = assignment_of_map(p, space)
        map_id = json.loads(p.read_text()).get("id") or p.stem
        if assignment is None:
            echo(f"proxy: {map_id} has no summed per-layer proxy ({why})")
        else:
            state.proxy_kl[map_id] = candidate_kl(assignment, kl_table)
            hand_assignments.add(assignment)
    for cid, found in state.search_maps.items():
        state.proxy_kl.setdefault(cid, candidate_kl(found, kl_table))
    lacking = [m for m in latest_measured(state).values()
               if m.gguf and m.config not in state.direct_kl and Path(m.gguf).exists()]
    for m in lacking:  # e.g. a round whose analysis was redone after the search stopped
        assert m.gguf is not None  # filtered above
        state.direct_kl[m.config] = direct_kl(Path(m.gguf))
    if lacking:
        write_json_atomic(state_path, state.to_json())
    while True:
        measured_search = len(state.search_maps)
        round_no = len(state.rounds)
        if round_no > 0 and measured_search >= settings.candidates:
            break
        round_dir = settings.out / f"round{round_no}"
        picks: list[Candidate] = []
        baseline: str | None = None
        if round_no == 0:  # the hand-made maps alone, fixed rounds: they name the best one
            maps: list[Path] = list(settings.against)
        else:
            predictor = fit_from(state)
            # never spend a measured candidate on a map a hand-made one already is
            exclude = {tuple(v) for v in state.search_maps.values()} | hand_assignments
            k = min(settings.per_round, settings.candidates - measured_search)
            picks = pick_candidates(path, predictor, settings.budget, k, exclude,
                                    settings.objective)
            if not picks:
                echo("no unmeasured candidate is left inside the budget")
                break
            baseline, chosen_by = best_hand_made_by(latest_measured(state), list(hand_paths))
            maps = [hand_paths[baseline]]
            echo(f"round {round_no}: each pick is measured until its saving against the best "
                 f"hand-made map {baseline} ({chosen_by}) is decided, or "
                 f"{settings.rules.max_rounds} rounds")
            for c in picks:
                cid = f"search_r{round_no}_s{c.step:03d}"
                pred = pick_prediction(predictor, c)
                doc = mixmap_document(
                    cid, c.assignment, space,
                    f"epi search round {round_no}, descent step {c.step}: {c.bpw:.3f} bpw, "
                    f"proxy KL {c.kl:.3e} nats/token",
                )
                map_path = round_dir / "maps" / f"{cid}.json"
                write_mixmap(map_path, doc)
                maps.append(map_path)
                state.search_maps[cid] = list(c.assignment)
                state.predictions[cid] = pred
                state.proxy_kl[cid] = c.kl
                echo(f"round {round_no}: {cid} {assignment_text(c.assignment)} ({c.bpw:.3f} bpw)"
                     + _prediction_text(pred))
        splits = phase_splits(picks, round_no, baseline) if settings.phase_split else []
        for sid, pre, dec in splits:
            state.phase_splits[sid] = [pre, dec]
            echo(f"round {round_no}: {sid} (prefill on {pre}, decode on {dec})")
        results = (measure(round_no, round_dir, maps, baseline, splits) if splits
                   else measure(round_no, round_dir, maps, baseline))
        for m in results:
            if m.gguf and m.config not in state.direct_kl and Path(m.gguf).exists():
                state.direct_kl[m.config] = direct_kl(Path(m.gguf))
        state.measured.extend(results)
        picked = [f"search_r{round_no}_s{c.step:03d}" for c in picks] + [s for s, _, _ in splits]
        if baseline is not None:
            settle_round(state, results, baseline, picked, settings.rules, echo)
        state.rounds.append(SearchRound(round_no, tuple(p.name for p in maps), tuple(picked),
                                        baseline))
        write_json_atomic(state_path, state.to_json())
    predictor = fit_from(state)
    return state, path, predictor


def phase_splits(picks: Sequence[Candidate], round_no: int, baseline: str | None
                 ) -> list[PhaseSplit]:
    """The phase split as a search dimension: each pick paired with the round's baseline (the
    best hand-made map) both ways — prefill on the pick and decode on the baseline, and the
    reverse. Prefill is compute-bound and decode memory-bound, so a map that suits one phase
    need not suit the other; the campaign measures each pair as one configuration beside its
    parents (docs/search.md, "The phase split")."""
    if baseline is None:
        return []
    out: list[PhaseSplit] = []
    for c in picks:
        cid = f"search_r{round_no}_s{c.step:03d}"
        out += [(f"{cid}.prefill-{baseline}.decode", cid, baseline),
                (f"{baseline}.prefill-{cid}.decode", baseline, cid)]
    return out


def summary(state: SearchState, path: list[Candidate], predictor: Predictor,
            space: SearchSpace, hand_made: set[str]) -> SearchSummary:
    """The search's result document: every measured configuration with its predicted and
    measured figures side by side, both fitted models with their validity, and the verdict.

    "Predicted" is the prediction made when the candidate was picked, before it was measured
    (stored in the state), never one refitted on its own measurement. Energy residuals are the
    final fit's, per configuration.
    """
    by_assignment = {c.assignment: c for c in path}
    rows = []
    for cfg, m in latest_measured(state).items():
        assignment = state.search_maps.get(cfg)
        c = by_assignment.get(tuple(assignment)) if assignment else None
        resid = (m.j_per_token - predictor.j_per_token(m.size_bytes / 1e9)
                 if m.usable and m.size_bytes else math.nan)
        kind: ConfigKind = ("search" if assignment else "hand-made" if cfg in hand_made
                            else "split" if cfg in state.phase_splits else "other")
        row = ConfigRow(cfg, kind, m, state.direct_kl.get(cfg), state.proxy_kl.get(cfg),
                        resid if math.isfinite(resid) else None)
        if assignment is not None:
            row = replace(row, assignment=assignment_text(assignment),
                          bpw=c.bpw if c is not None else None,
                          decision=state.verdicts.get(cfg),
                          prediction=state.predictions.get(cfg))
        if cfg in state.phase_splits:
            pre, dec = state.phase_splits[cfg]
            row = replace(row, assignment=f"prefill {pre}, decode {dec}",
                          decision=state.verdicts.get(cfg))
        rows.append(row)
    additivity = [(state.proxy_kl[r.config], r.direct_kl_nats) for r in rows
                  if r.config in state.proxy_kl and r.direct_kl_nats is not None]
    return SearchSummary(tuple(space.types), predictor, tuple(additivity), tuple(rows),
                         verdict(state, hand_made))
