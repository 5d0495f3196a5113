"""The search's picture: hand-made and found maps on the accuracy–J/token plane.

Left: measured figures only (what counts): J/token with the campaign's interval bars, the
hand-made frontier as a step line, and the frontier shift stated under it. Right: each search
candidate's EPI as predicted when it was picked (before measuring, with its prediction
interval) against its measured EPI (with the campaign's interval), so a reader sees how far the
models were off. Power is labelled with its source (measured or modelled) as the campaign's
analysis reported it.
"""

from __future__ import annotations

import math
import textwrap
from pathlib import Path

from host.search.summary import SearchSummary


def _finite(*xs: object) -> bool:
    return all(isinstance(x, (int, float)) and math.isfinite(x) for x in xs)


def _err(v: float, ci: object) -> list[list[float]] | None:
    """Asymmetric error bar [[below], [above]] from an interval, None if unknown."""
    if not isinstance(ci, (list, tuple)) or len(ci) != 2 or not _finite(v, *ci):
        return None
    lo, hi = float(ci[0]), float(ci[1])
    return [[max(v - lo, 0.0)], [max(hi - v, 0.0)]]


def plot_search(summary: SearchSummary, out: Path) -> list[Path]:
    """Write search.png and search.svg into `out`; returns their paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.transforms import blended_transform_factory

    rows = summary.configs
    sources = sorted({r.measured.power_source for r in rows if r.measured.power_source})
    label = ", ".join(sources) if sources else "power source not stated"
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(12, 5.2))
    at_accuracy: dict[float, int] = {}  # labels of points at one accuracy alternate above/below
    for r in rows:
        m = r.measured
        j, a = m.j_per_token, m.accuracy
        if not _finite(j, a):
            continue
        hand = r.kind == "hand-made"
        other = r.kind == "other"  # measured in a round's campaign, neither kind: × only
        split = r.kind == "split"  # a (prefill map, decode map) pair: a diamond
        color = ("0.45" if hand else "0.7" if other else "tab:orange" if split
                 else "tab:blue")
        ax.errorbar([j], [a], xerr=_err(j, m.j_per_token_ci), fmt="none", ecolor=color,
                    elinewidth=1, capsize=3, zorder=2)
        ax.scatter([j], [a], marker="o" if hand else "x" if other else "D" if split else "*",
                   s=40 if hand or other else 110, color=color, zorder=3)
        nth = at_accuracy.get(round(a, 6), 0)
        at_accuracy[round(a, 6)] = nth + 1
        ax.annotate(r.config, (j, a), fontsize=7, xytext=(4, 3 if nth % 2 == 0 else -10),
                    textcoords="offset points")
    ax.margins(x=0.1, y=0.15)  # points on the edge would hide under the legend or the frame
    front = summary.verdict.frontier
    pts = sorted(front.hand_made_frontier)
    if pts:
        # the staircase of what the hand-made maps attain: from each frontier point rightwards
        # (more J/token) at its accuracy, up to the next point, and on to the plot's edge
        x_edge = ax.get_xlim()[1]
        xs = [p[0] for p in pts] + [x_edge]
        ys = [p[1] for p in pts] + [pts[-1][1]]
        ax.step(xs, ys, where="post", color="0.3", linestyle="--", linewidth=1,
                label="hand-made frontier", zorder=1)
        ax.set_xlim(right=x_edge)
        ax.legend(fontsize=8, loc="best")
    ax.set_title(f"measured ({label})", fontsize=10)
    ax.set_xlabel("J per generated token (gross, whole request)")
    ax.set_ylabel("composite accuracy")
    ax.grid(alpha=0.3)

    k = 0
    names: list[str] = []
    labelled: set[str] = set()

    def once(name: str) -> str | None:
        if name in labelled:
            return None
        labelled.add(name)
        return name

    for r in rows:
        if r.kind != "search":
            continue
        m = r.measured
        pred = r.prediction
        if pred is not None and pred.epi is not None and _finite(pred.epi):
            bx.errorbar([k - 0.12], [pred.epi], yerr=_err(pred.epi, pred.epi_interval),
                        fmt="*", mfc="none", mec="tab:blue", ecolor="tab:blue", ms=11,
                        capsize=3, label=once("predicted at pick"))
        if _finite(m.epi):
            bx.errorbar([k + 0.12], [m.epi], yerr=_err(m.epi, m.epi_ci), fmt="*",
                        color="tab:blue", ms=11, capsize=3, label=once("measured"))
        else:  # an empty slot would read as a missing plot; say why it is empty
            bx.text(k + 0.12, 0.03, "no measured EPI", rotation=90, fontsize=7, color="0.4",
                    ha="center", va="bottom",
                    transform=blended_transform_factory(bx.transData, bx.transAxes))
        names.append(r.config)
        k += 1
    best = summary.verdict.best_hand_made
    best_row = next((r for r in rows if r.config == best), None)
    if best_row is not None and _finite(best_row.measured.epi):
        bx.axhline(best_row.measured.epi, color="0.45", linestyle=":", linewidth=1,
                   label=f"best hand-made ({best}), measured")
    bx.set_xticks(range(len(names)), names, rotation=20, fontsize=7)
    bx.set_xlim(-0.5, max(len(names), 1) - 0.5)
    bx.set_ylabel("EPI (J per token / accuracy)")
    bx.set_title("search candidates: EPI predicted before measuring vs measured", fontsize=10)
    bx.grid(alpha=0.3)
    if names:
        bx.legend(fontsize=7)
    shift = front.text
    fig.suptitle("epi search: ○ hand-made maps, ★ maps found by search")
    fig.text(0.01, 0.01, "\n".join(textwrap.wrap(shift, 170)), fontsize=8, va="bottom")
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    paths = [out / "search.png", out / "search.svg"]
    for p in paths:
        fig.savefig(p, dpi=110)
    plt.close(fig)
    return paths
