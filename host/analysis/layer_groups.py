"""Per-layer-group figures: measured per node, differential between maps that differ in one group,
and the labelled time-share estimate.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pandas as pd

from epi.core.errors import UserError
from epi.formats.manifests import LayerGroup, QuantManifest, read_any_manifest
from host.analysis import statistics
from host.analysis.headline import headline_rows
from host.analysis.model import Options, RunInfo
from host.analysis.records import GroupDifferential, TimeShareEstimate
from host.analysis.results import repeat_values
from host.analysis.verdicts import valid_repeats


# --------------------------------------------------------------------------- layer groups
def _manifest(info: RunInfo, opts: Options, corrupt: list[str] | None = None
              ) -> QuantManifest | None:
    """The first quantization manifest with layer groups found for a run; a corrupt one is
    added to `corrupt` (with its path and problem), never silently taken for "no manifest"."""
    m = info.run.model
    map_id = m.get("map_id")
    stem = Path(str(m["path"])).stem if m.get("path") else None
    names = [f"{x}.manifest.json" for x in dict.fromkeys([map_id, stem]) if x]
    cands = []
    if opts.manifest_dir is not None:
        cands += [Path(opts.manifest_dir) / n for n in names]
    if m.get("path"):
        cands += [Path(str(m["path"])).parent / n for n in names]
    for c in cands:
        if c.is_file():
            try:
                data = read_any_manifest(c)
            except UserError as exc:
                if corrupt is not None:
                    corrupt.append(f"quantization manifest {c} is corrupt ({exc})")
                continue
            if isinstance(data, QuantManifest) and data.layer_groups:
                return data
    return None


def _group_signature(g: LayerGroup) -> str:
    eff = g.effective_types
    return f"{g.map_type} [{', '.join(f'{k}×{v}' for k, v in sorted(eff.items()))}]"


def layer_group_figures(infos: list[RunInfo], rep: pd.DataFrame, verdicts: pd.DataFrame,
                  results: pd.DataFrame, opts: Options
                  ) -> tuple[list[GroupDifferential], list[TimeShareEstimate], list[str]]:
    notes: list[str] = []
    manifests: dict[str, QuantManifest] = {}
    corrupt_of: dict[str, list[str]] = {}
    for i in infos:
        if i.config in manifests:
            continue
        corrupt: list[str] = []
        m = _manifest(i, opts, corrupt)
        if m is not None:
            manifests[i.config] = m
        elif corrupt:
            corrupt_of[i.config] = corrupt
    for cfg, problems in sorted(corrupt_of.items()):
        notes.append(f"{cfg}: " + "; ".join(dict.fromkeys(problems)))
    missing = sorted({i.config for i in infos} - set(manifests) - set(corrupt_of))
    if missing and (len(infos) > 1 or opts.time_share):
        notes.append("no quantization manifest for " + ", ".join(missing) +
                     " (looked next to run.json model.path and in --manifest-dir): no "
                     "differential or time-share figures for them")
    valid = valid_repeats(rep, verdicts)
    basis = opts.energy_basis
    sel = headline_rows(valid, basis)
    # (values, start times, runs, campaign rounds): pairs by campaign round, else by time
    values = {str(c): repeat_values(valid, str(c), basis) for c in sel["config"].unique()}
    sigs = {c: {g.name: _group_signature(g) for g in m.layer_groups}
            for c, m in manifests.items()}
    basis_text = f"{basis} J per generated token (whole request)"
    diff = [replace(d, energy_basis=basis_text,
                    method="differential: runs differing only in this group's type")
            for d in statistics.differential_groups(sigs, values, level=opts.ci_level)]
    tshare: list[TimeShareEstimate] = []
    if opts.time_share:
        for cfg, m in manifests.items():
            info = next(i for i in infos if i.config == cfg)
            for p in info.run.placement:
                r = headline_rows(results, basis, nodes=True)
                r = r[(r["config"] == cfg) & (r["scope"] == p.node)]
                node_val = float(r["j_per_token_median"].iloc[0]) if len(r) else float("nan")
                held = set(p.layers)
                gbytes = {}
                for lg in m.layer_groups:
                    layers = set(lg.layers)
                    if not layers or not (layers & held) or lg.bits_per_weight is None:
                        continue
                    share = len(layers & held) / len(layers)
                    gbytes[lg.name] = lg.n_weights * lg.bits_per_weight / 8 * share
                for name, val in statistics.time_share_split(node_val, gbytes).items():
                    tshare.append(TimeShareEstimate(
                        config=cfg, node=p.node, group=name, j_per_token=val,
                        energy_basis=basis_text, label=statistics.TIME_SHARE_LABEL))
    return diff, tshare, notes
