"""The search's picture: hand-made and found maps on the accuracy–J/token plane.

Left: measured figures only (what counts). Right: the same search candidates as predicted
before they were measured, so a reader sees how far the models were off. Power is labelled with
its source (measured or modelled) as the campaign's analysis reported it.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any


def plot_search(summary: dict[str, Any], out: Path) -> list[Path]:
    """Write search.png and search.svg into `out`; returns their paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = summary["configs"]
    sources = sorted({r["measured"]["power_source"] for r in rows if r["measured"]["power_source"]})
    label = ", ".join(sources) if sources else "power source not stated"
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(11, 4.5), sharey=True)
    for r in rows:
        m = r["measured"]
        j, a = m["j_per_token"], m["accuracy"]
        if not (math.isfinite(j) and math.isfinite(a)):
            continue
        hand = r["kind"] == "hand-made"
        ax.scatter([j], [a], marker="o" if hand else "*", s=40 if hand else 110,
                   color="0.45" if hand else "tab:blue", zorder=3)
        ax.annotate(r["config"], (j, a), fontsize=7, xytext=(4, 3), textcoords="offset points")
        if not hand and math.isfinite(r.get("predicted_j_per_token", math.nan)):
            pj, pa = r["predicted_j_per_token"], r["predicted_accuracy"]
            bx.scatter([pj], [pa], marker="*", s=110, facecolors="none", edgecolors="tab:blue")
            bx.annotate(r["config"], (pj, pa), fontsize=7, xytext=(4, 3),
                        textcoords="offset points")
    ax.set_title(f"measured ({label})", fontsize=10)
    bx.set_title("search candidates as predicted before measuring", fontsize=10)
    for x in (ax, bx):
        x.set_xlabel("J per generated token (gross, whole request)")
        x.grid(alpha=0.3)
    ax.set_ylabel("composite accuracy")
    fig.suptitle("epi search: ○ hand-made maps, ★ maps found by search")
    fig.tight_layout()
    paths = [out / "search.png", out / "search.svg"]
    for p in paths:
        fig.savefig(p, dpi=110)
    plt.close(fig)
    return paths
