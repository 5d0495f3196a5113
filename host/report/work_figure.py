"""The report's figure for the bandwidth question: per-phase J/token against the bytes of
weights each token streams (host/analysis/work_account.py, or the file size where the GGUF
cannot be read here: the caption says which).

A memory-bound phase's J/token rises with bytes per token; a compute-bound one need not. The
two panels put prefill (per prompt token) and decode (per generated token) side by side on the
same x axis, each point with its interval; a split configuration's phases ran on different
maps, so it is drawn at each phase's own map (marked).
"""

from __future__ import annotations

import matplotlib.pyplot as plt

from host.analysis.headline import headline_rows
from host.analysis.intervals import finite as _finite
from host.analysis.intervals import number
from host.analysis.vocabulary import Phase, TokenUnit
from host.report.data import ReportData
from host.report.figures import VALID_COLOR, Figure, _caption, _g, _stamp
from host.report.label_layout import PointLabel, place_labels
from host.report.work_answers import bytes_per_token

PANELS = ((Phase.PREFILL, TokenUnit.PROMPT, "prefill: J per prompt token"),
          (Phase.DECODE, TokenUnit.GENERATED, "decode: J per generated token"))


def energy_vs_bytes(rd: ReportData) -> Figure:
    bytes_tok, how = bytes_per_token(rd)
    r = rd.results
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    facts = []
    for ax, (phase, unit, title) in zip(axes, PANELS, strict=True):
        rows = headline_rows(r, rd.basis, phase=phase, unit=unit) if len(r) else r
        labels = []
        for _, row in rows.iterrows():
            cfg = str(row["config"])
            y = row["j_per_token_median"]
            if cfg not in bytes_tok or not _finite(y):
                continue
            x = bytes_tok[cfg] / 1e6
            lo, hi = row["j_per_token_ci_lo"], row["j_per_token_ci_hi"]
            yerr = [[number(y) - number(lo)], [number(hi) - number(y)]] \
                if _finite(lo) and _finite(hi) else None
            ax.errorbar(x, number(y), yerr=yerr, fmt="o", color=VALID_COLOR, capsize=3)
            labels.append(PointLabel(x, number(y), cfg, 7))
            facts.append(f"{phase} {cfg}: {_g(x)} MB/token, {_g(y)} J/token")
        ax.set_xlabel("weight bytes streamed per token, MB")
        ax.set_ylabel(f"{rd.basis} {title.split(': ')[1]}")
        ax.set_title(title, fontsize=9)
        ax.grid(alpha=0.3)
        place_labels(ax, labels, obstacles=list(ax.texts))
    _stamp(axes[1], rd)
    fig.tight_layout()
    cap = _caption(rd, "Median J/token per phase (valid runs, with interval) against the "
                   f"weight bytes a token streams; {how}.")
    alt = ("Two scatter plots of per-phase median J/token against megabytes of weights "
           "streamed per token, prefill (left) and decode (right): "
           + ("; ".join(facts) or "no configuration has both figures") + ". "
           f"Power: {rd.labels.tag()}.")
    return Figure("energy_vs_bytes", "Per-phase J/token vs bytes streamed per token", cap,
                  fig, alt)
