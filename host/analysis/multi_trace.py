"""Several meter daemons in one study: their traces joined into one, in the first meter's clock.

`epi run --meter A --meter B` syncs clocks with every daemon and records each offset keyed by
meter (token-log format 2: run.json `meters`, each clock_sync entry's `meter_url`). `epi
analyze --trace TA --trace TB` pairs the k-th trace with the k-th meter of the runs and joins
the traces here, so that the rest of the analysis sees one trace:

* each trace's own clock mapping: per run, the offsets of meter k give local → meter k and
  those of meter 0 give local → meter 0 (each with its own drift, `align.ClockMap`); at every
  sync point of meter k the difference (meter-0 time − meter-k time) is one point of the map
  meter k → meter 0. The points of all runs, ordered by meter-k time, are interpolated
  linearly (drift between them) and held outside them, as `ClockMap` does for one meter;
* trace k's sample times, invalid intervals, events and coverage move into meter 0's clock;
* channels are renumbered: trace 0 keeps its numbers, trace k's follow the largest number so
  far in ascending order (`ChannelMap` says which (trace, channel) each became), and every
  node's channels are found by the channel map's `node` as for one trace.

Limits: each trace must hold one clock domain (one boot of its daemon); the joined trace keeps
trace 0's segments (its raw `samples` and segment metadata); each channel's power-source label
and instrument terms come from the trace it came from (`Trace.origins`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import numpy as np
import pandas as pd

from epi.core.errors import UserError
from epi.formats.tokenlog import meter_of
from host.analysis.align import INT64_MAX, INT64_MIN, ClockMap
from host.analysis.tokenlog_reader import RunLog
from host.analysis.traces import ChannelData, Domain, Trace
from host.analysis.vocabulary import ClockBasis


@dataclass(frozen=True)
class ChannelMap:
    """Joined channel number → (trace index, the channel's number in that trace)."""

    origin: dict[int, tuple[int, int]]

    def lines(self, traces: Sequence[Trace]) -> list[str]:
        return [f"channel {new} = {traces[k].path} channel {ch}"
                for new, (k, ch) in sorted(self.origin.items()) if (k, ch) != (0, new)]


def meter_clock(run: RunLog, meter: int, boot_id: str | None, trace: Trace) -> ClockMap:
    """The run's clock map into meter `meter`'s clock (its own offsets only)."""
    meters = run.header.get("meters") if run.header.get("format_version", 1) >= 2 else None
    entries = [e for e in run.clock_sync if meter_of(e, meters) == meter]
    return ClockMap.from_run(entries, run.boot_id, boot_id,
                             trace_clock_simulated=trace.clock_simulated(boot_id))


def _only_boot(trace: Trace) -> str | None:
    boots = trace.boot_ids
    if len(boots) != 1:
        raise UserError(f"{trace.path}: holds {len(boots)} clock domains (daemon boots); with "
                        "several --trace each must hold one")
    return boots[0]


def _map_points(runs: Sequence[RunLog], k: int, traces: Sequence[Trace]
                ) -> tuple[np.ndarray, np.ndarray, float]:
    """(meter-k times, meter-0 − meter-k there, meter k's worst sync uncertainty)."""
    t_k: list[np.ndarray] = []
    delta: list[np.ndarray] = []
    unc = 0.0
    for run in runs:
        m0 = meter_clock(run, 0, _only_boot(traces[0]), traces[0])
        mk = meter_clock(run, k, _only_boot(traces[k]), traces[k])
        if m0.basis != ClockBasis.CLOCK_SYNC or mk.basis != ClockBasis.CLOCK_SYNC:
            continue
        local = np.union1d(m0.sync_local_ns, mk.sync_local_ns)
        tk = mk.to_meter(local)
        t_k.append(tk)
        delta.append(m0.to_meter(local) - tk)
        unc = max(unc, float(np.nan_to_num(mk.uncertainty_ns)))
    if not t_k:
        raise UserError(f"{traces[k].path}: no run synced clocks with meter {k + 1} (run.json "
                        f"meters[{k}]) and meter 1: its clock cannot be placed in the first "
                        "trace's")
    t, d = np.concatenate(t_k), np.concatenate(delta)
    order = np.argsort(t, kind="stable")
    return t[order], d[order], unc


def _mover(t_pts: np.ndarray, d_pts: np.ndarray) -> Callable[[np.ndarray], np.ndarray]:
    """Meter-k ns → meter-0 ns (int64), the ±int64 sentinels of open intervals kept."""
    def move(t: np.ndarray) -> np.ndarray:
        t = np.asarray(t, dtype=np.int64)
        out = t + np.rint(np.interp(t.astype(np.float64), t_pts, d_pts)).astype(np.int64)
        sentinel = (t == INT64_MIN) | (t == INT64_MAX)
        out[sentinel] = t[sentinel]
        return out
    return move


def join_traces(traces: Sequence[Trace], runs: Sequence[RunLog]
                ) -> tuple[Trace, ChannelMap, float]:
    """One trace in meter 0's clock from several; (trace, channel map, added uncertainty ns).

    The uncertainty is the worst sync uncertainty of the other meters: a window on a channel
    of trace k carries it on top of meter 0's (which the run's own clock map holds)."""
    if len(traces) == 1:
        return traces[0], ChannelMap({c: (0, c) for c in traces[0].channels}), 0.0
    key0 = next(iter(traces[0].domains), "")
    _only_boot(traces[0])
    channels = dict(traces[0].channels)
    origin = {c: (0, c) for c in channels}
    data = {(key0, c): d for (_, c), d in traces[0].data.items()}
    invalid = [traces[0].invalid]
    events = [traces[0].events]
    dom0 = traces[0].domains.get(key0, Domain(0, None, None))
    lo_hi = [dom0.mono_ns] if dom0.mono_ns else []
    n_rows = dom0.n_rows
    notes = list(traces[0].notes)
    worst_unc = 0.0
    for k in range(1, len(traces)):
        tr = traces[k]
        _only_boot(tr)
        t_pts, d_pts, unc = _map_points(runs, k, traces)
        worst_unc = max(worst_unc, unc)
        move = _mover(t_pts, d_pts)
        renum = {c: max(channels) + 1 + i for i, c in enumerate(sorted(tr.channels))}
        for c, new in renum.items():
            channels[new] = replace(tr.channels[c], channel=new)
            origin[new] = (k, c)
        for (_, c), d in tr.data.items():
            data[(key0, renum[c])] = ChannelData(
                move(d.t_mono_ns), d.power_w, d.energy_j, d.seg_numbers, d.seg_counts,
                d.n_rows, move(d.nopower_t_ns), move(d.adjerr_t_ns), move(d.calerr_t_ns),
                move(d.saturated_t_ns))
        inv = tr.invalid.copy()
        inv["channel"] = inv["channel"].map(renum)
        inv["boot_key"] = key0
        inv["start_ns"] = move(inv["start_ns"].to_numpy(np.int64))
        inv["end_ns"] = move(inv["end_ns"].to_numpy(np.int64))
        invalid.append(inv)
        ev = tr.events.copy()
        ev["t_mono_ns"] = move(ev["t_mono_ns"].to_numpy(np.int64))
        ev["channel"] = pd.array([renum.get(int(c)) if pd.notna(c) else None
                                  for c in ev["channel"]], dtype="Int64")
        events.append(ev)
        for dom in tr.domains.values():
            n_rows += dom.n_rows
            if dom.mono_ns:
                a, b = move(np.array(dom.mono_ns, np.int64))
                lo_hi.append((int(a), int(b)))
        drift = (float(d_pts[-1] - d_pts[0]) / float(t_pts[-1] - t_pts[0]) * 1e6
                 if len(t_pts) > 1 and t_pts[-1] > t_pts[0] else float("nan"))
        notes += [f"{tr.path.name}: {n}" for n in tr.notes]
        notes.append(f"{tr.path}: meter {k + 1} placed in {traces[0].path}'s clock from "
                     f"{len(t_pts)} sync point(s) (offset {d_pts[0] / 1e9:+.6f} s, drift "
                     f"{drift:+.2f} ppm); its channels {sorted(renum)} are "
                     f"{sorted(renum.values())} here")
    mono = (min(a for a, _ in lo_hi), max(b for _, b in lo_hi)) if lo_hi else None
    domains = {key0: Domain(n_rows, mono, dom0.real_ns)}
    joined = Trace(traces[0].path, list(traces[0].segments), channels,
                   pd.concat(events, ignore_index=True), pd.concat(invalid, ignore_index=True),
                   data, domains, notes,
                   origins={new: (traces[k], ch) for new, (k, ch) in origin.items()})
    return joined, ChannelMap(origin), worst_unc
