"""Component power (RAPL, hwmon, NVML, Pi 5 PMIC channels) beside wall power, per run and node.

A trace may hold wall-meter channels (the board or its emulator) and software-source channels
(``scope`` other than ``wall`` in the trace's channel metadata, docs/sources.md). The main
figures of ``epi analyze`` use a node's wall channels; a node with no wall channel uses its
component channels instead, and every place that shows them says "component power, not wall
power". This module then integrates every component channel over the same windows as the main
figures and reports them side by side with the wall: energy and J per generated token of each,
the wall/component ratio and the power no counter sees (wall − sum of components).

Hooks: ``node_channel_override`` (pipeline: which channels the main figures use),
``records``/``files``/``summary_lines`` (the analyze command's outputs).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pandas as pd

from epi.core.text import format_number, format_table
from epi.formats.json_types import JSON, as_json
from epi.formats.trace import WALL_SCOPE
from host.analysis.align import WindowEnergy, window_energy
from host.analysis.model import Analysis, RunInfo
from host.analysis.traces import Trace
from host.analysis.vocabulary import EnergyMethod, WindowKind

COMPONENT_LABEL = "component power, not wall power"
WALL_LABEL = "wall power"
COLUMNS = [
    "run_id", "config", "node", "kind", "channel", "name", "source", "scope", "label",
    "n_windows", "n_windows_used", "duration_s", "energy_j", "power_w", "j_per_generated_token",
    "wall_energy_j", "wall_power_w", "wall_j_per_generated_token", "wall_label",
    "wall_over_component", "unseen_power_w", "unseen_fraction", "reason",
]


def _is_wall(trace: Trace, ch: int) -> bool:
    return trace.channels[ch].scope == WALL_SCOPE


def has_components(trace: Trace) -> bool:
    return any(not _is_wall(trace, ch) for ch in trace.channels)


def node_channel_override(trace: Trace, override: Mapping[str, list[int]] | None
                          ) -> dict[str, list[int]] | None:
    """node → channels of the main figures: a node's wall channels, or, when it has none, its
    component channels. ``--channels`` (``override``) wins. Unchanged for a wall-only trace."""
    if not has_components(trace):
        return dict(override) if override else None
    wall: dict[str, list[int]] = {}
    comp: dict[str, list[int]] = {}
    for ch, info in sorted(trace.channels.items()):
        if info.node is not None:
            (wall if info.scope == WALL_SCOPE else comp).setdefault(info.node, []).append(ch)
    out = {node: wall.get(node) or comp[node] for node in {*wall, *comp}}
    if override:
        out.update({k: list(v) for k, v in override.items()})
    return out


def main_labels(a: Analysis) -> dict[str, str]:
    """node → what the main figures of that node measure (wall, or component power)."""
    out: dict[str, str] = {}
    for info in a.runs:
        for node, chans in info.node_channels.items():
            comp = [c for c in chans if not _is_wall(a.trace, c)]
            out[node] = COMPONENT_LABEL if comp else WALL_LABEL
    return out


def _energy(we: WindowEnergy, method: str) -> np.ndarray:
    if method == EnergyMethod.COUNTER:
        return np.where(np.isfinite(we.energy_counter_j), we.energy_counter_j, we.energy_j)
    return we.energy_j


def component_table(a: Analysis) -> pd.DataFrame:
    """Side-by-side rows (COLUMNS): per run, node, window kind (request, idle) and component
    channel, plus one row per run, node and kind summing all its component channels."""
    cached = getattr(a, "_component_table", None)
    if isinstance(cached, pd.DataFrame):
        return cached
    rows: list[dict[str, str | int | float | None]] = []
    trace = a.trace
    win = a.windows
    for info in a.runs:
        if not info.clock.usable:
            continue
        for node, main_chans in info.node_channels.items():
            comps = [ch for ch, ci in sorted(trace.channels.items())
                     if ci.scope != WALL_SCOPE and ci.node == node]
            if not comps:
                continue
            main_is_wall = all(_is_wall(trace, c) for c in main_chans)
            for kind in ("request", "idle"):
                w = win[(win["run_id"] == info.run.run_id) & (win["scope"] == node)
                        & (win["kind"] == kind)]
                if w.empty:
                    continue
                t0 = w["t0_meter_ns"].to_numpy(np.int64)
                t1 = w["t1_meter_ns"].to_numpy(np.int64)
                dur = w["duration_s"].to_numpy(np.float64)
                tokens = w["n_generated_tokens"].to_numpy(np.float64, na_value=np.nan)
                wall_e = w["energy_j"].to_numpy(np.float64) if main_is_wall else \
                    np.full(len(w), np.nan)
                per: dict[int, np.ndarray] = {}
                reasons: dict[int, str] = {}
                for ch in comps:
                    we = window_energy(trace.series(ch, info.boot_id), t0, t1,
                                       edge=a.options.edge, min_samples=a.options.min_samples)
                    per[ch] = _energy(we, a.options.energy_method)
                    bad = ~np.isfinite(per[ch])
                    reasons[ch] = f"{int(bad.sum())} of {len(w)} windows null: " \
                        f"{we.reason[bad][0]}" if bad.any() else ""
                total = np.sum([per[c] for c in comps], axis=0)
                for one in [*comps, None]:  # each component channel, then their sum
                    e = per[one] if one is not None else total
                    ok = np.isfinite(e) & (np.isfinite(wall_e) if main_is_wall else True)
                    rows.append(_row(a, info, node, kind, one, e, ok, dur, tokens, wall_e,
                                     main_is_wall,
                                     reasons.get(one, "") if one is not None else "; ".join(
                                         f"ch{c}: {r}" for c, r in reasons.items() if r)))
    table = pd.DataFrame(rows, columns=COLUMNS)
    setattr(a, "_component_table", table)  # noqa: B010  a memo, not a field of Analysis
    return table


def _row(a: Analysis, info: RunInfo, node: str, kind: str, ch: int | None, e: np.ndarray,
         ok: np.ndarray, dur: np.ndarray, tokens: np.ndarray, wall_e: np.ndarray,
         main_is_wall: bool, reason: str) -> dict[str, str | int | float | None]:
    ci = a.trace.channels[ch] if ch is not None else None
    d = float(dur[ok].sum()) if ok.any() else float("nan")
    energy = float(e[ok].sum()) if ok.any() else float("nan")
    tok = float(tokens[ok].sum()) if kind == WindowKind.REQUEST and ok.any() else float("nan")
    wall = float(wall_e[ok].sum()) if main_is_wall and ok.any() else float("nan")
    why = reason
    if not main_is_wall:
        why = (why + "; " if why else "") + "no wall channel for this node (the main figures " \
            "are these component channels)"
    if not ok.any():
        why = why or "no window with data"
    return {
        "run_id": info.run.run_id, "config": info.config, "node": node, "kind": kind,
        "channel": ch, "name": ci.name if ci else "all component channels",
        "source": ci.source if ci else None, "scope": ci.scope if ci else None,
        "label": COMPONENT_LABEL, "n_windows": len(e), "n_windows_used": int(ok.sum()),
        "duration_s": d, "energy_j": energy, "power_w": energy / d if d > 0 else float("nan"),
        "j_per_generated_token": energy / tok if tok > 0 else float("nan"),
        "wall_energy_j": wall, "wall_power_w": wall / d if d > 0 else float("nan"),
        "wall_j_per_generated_token": wall / tok if tok > 0 else float("nan"),
        "wall_label": WALL_LABEL + (" (emulated: modelled, not measured)"
                                    if a.trace.emulated else "") if main_is_wall else None,
        "wall_over_component": wall / energy if energy > 0 else float("nan"),
        # what no counter sees: only meaningful for the sum of all component channels
        "unseen_power_w": (wall - energy) / d if d > 0 and ch is None else float("nan"),
        "unseen_fraction": (wall - energy) / wall if wall > 0 and ch is None else float("nan"),
        "reason": why,
    }


def _clean(v: object) -> JSON:
    if isinstance(v, float) and not np.isfinite(v):
        return None
    if isinstance(v, np.integer):
        return int(v)
    if isinstance(v, np.floating):
        return None if not np.isfinite(v) else float(v)
    return as_json(v, "component table cell")


def records(a: Analysis) -> dict[str, JSON] | None:
    """The ``components`` key of results.json (None for a trace without software channels)."""
    if not has_components(a.trace):
        return None
    t = component_table(a)
    chans: list[JSON] = [{"channel": ch, "name": ci.name, "node": ci.node, "source": ci.source,
              "scope": ci.scope, "label": COMPONENT_LABEL,
              "resolution_j": ci.resolution_j, "sample_period_s": ci.sample_period_s}
             for ch, ci in sorted(a.trace.channels.items()) if ci.scope != WALL_SCOPE]
    return {
        "label": COMPONENT_LABEL,
        "main_figures": {**main_labels(a)},
        "channels": chans,
        "measured": [as_json(a.trace.segments[-1].meta.get("sources"), "meta sources")],
        "side_by_side": [{k: _clean(v) for k, v in r.items()}
                         for r in t.astype(object).where(t.notna(), None).to_dict("records")],
    }


def files(a: Analysis) -> dict[str, bytes]:
    """``components.csv`` when the trace has software channels."""
    if not has_components(a.trace):
        return {}
    return {"components.csv": component_table(a).to_csv(index=False).encode()}


_num = format_number  # `fmt`-formatted, "null" where there is no number


def summary_lines(a: Analysis) -> list[str]:
    """Text for the analyze summary: what the main figures measure, then the side-by-side."""
    if not has_components(a.trace):
        return []
    out: list[str] = []
    comp_nodes = sorted(n for n, lab in main_labels(a).items() if lab == COMPONENT_LABEL)
    if comp_nodes:
        out.append(f"NOTE: the figures above for node(s) {', '.join(comp_nodes)} are "
                   f"{COMPONENT_LABEL.upper()} (software counters; no wall channel)")
    t = component_table(a)
    if t.empty:
        return [*out, "", "Component power: no component channel on the runs' nodes"]
    rows = []
    for _, r in t.iterrows():
        rows.append([r["config"], r["node"], r["kind"], r["name"],
                     r["scope"] if isinstance(r["scope"], str) else "all",
                     _num(r["power_w"]), _num(r["j_per_generated_token"]),
                     _num(r["wall_power_w"]), _num(r["wall_j_per_generated_token"]),
                     _num(r["wall_over_component"], ".3f"), _num(r["unseen_power_w"])])
    out += ["", f"Component power ({COMPONENT_LABEL}) beside wall power: mean power and "
            "J per generated token over the run's requests and idle windows; unseen = wall − "
            "components (what no counter sees: power supply, board, fans, disks, ...)"
            + (" — wall is EMULATED (modelled)" if a.trace.emulated else ""),
            format_table(["config", "node", "window", "channel", "scope", "component W",
                          "component J/gen tok", "wall W", "wall J/gen tok", "wall/component",
                          "unseen W"], rows)]
    return out

