"""A split configuration's handover cost per request, from its token log (host/run/split.py).

The handover (`handover_start` → `handover_end` events, docs/formats.md §2) lies inside the
decode interval, so a split run's decode figures already include it; this reads it out on its
own: time per request and its share of the request's prefill time. Measured requests only
(warm-ups are never analysed).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path

from epi.core.errors import UserError
from epi.formats.json_types import JSON, JSONObject
from epi.formats.tokenlog import TokenEvent, read_token_log


@dataclass(frozen=True)
class HandoverCost:
    """One measured request's handover."""

    request_id: int
    prefill_ns: int  # request start → token 0
    handover_ns: int

    @property
    def share_of_prefill(self) -> float:
        return self.handover_ns / self.prefill_ns

    def to_json(self) -> dict[str, JSON]:
        return {"request_id": self.request_id, "prefill_ns": self.prefill_ns,
                "handover_ns": self.handover_ns}

    @classmethod
    def from_json(cls, data: JSONObject) -> HandoverCost:
        values = [data.get(k) for k in ("request_id", "prefill_ns", "handover_ns")]
        if not all(isinstance(v, int) for v in values):
            raise UserError(f"handover cost: request_id, prefill_ns and handover_ns must be "
                            f"integers, not {values!r}")
        rid, pre, hand = (int(v) for v in values)  # type: ignore[call-overload]
        return cls(rid, pre, hand)


def handover_costs(run_dir: Path) -> list[HandoverCost]:
    """Every measured request's handover; refused in one line when the run is not a split."""
    log = read_token_log(run_dir)
    if "split" not in log.header:
        raise UserError(f"{run_dir}: not a split configuration (run.json has no 'split')")
    ev = log.events
    start: dict[int, int] = {}
    first: dict[int, int] = {}
    h0: dict[int, int] = {}
    h1: dict[int, int] = {}
    warm: set[int] = set()
    for kind, rid, tok, t, w in zip(ev["event"], ev["request_id"], ev["token_index"],
                                    ev["t_mono_ns"], ev["warmup"], strict=True):
        if rid is None:
            continue
        if w:
            warm.add(rid)
        if kind == TokenEvent.REQUEST_START:
            start[rid] = t
        elif kind == TokenEvent.TOKEN and tok == 0:
            first[rid] = t
        elif kind == TokenEvent.HANDOVER_START:
            h0[rid] = t
        elif kind == TokenEvent.HANDOVER_END:
            h1[rid] = t
    out = []
    for rid in sorted(h0.keys() & h1.keys() & start.keys() & first.keys()):
        if rid not in warm:
            out.append(HandoverCost(rid, first[rid] - start[rid], h1[rid] - h0[rid]))
    missing = sorted((start.keys() & first.keys()) - h0.keys() - warm)
    if missing:
        raise UserError(f"{run_dir}: request {missing[0]} of a split run has no handover "
                        "events (events.csv)")
    return out


def median_share(costs: list[HandoverCost]) -> float | None:
    """Median handover / prefill over the requests; None without any."""
    return statistics.median(c.share_of_prefill for c in costs) if costs else None
