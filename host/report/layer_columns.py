"""The Early / Middle / Late cells of the results table, from the map's own layer groups.

The quantization manifest records each group of the map as it was applied to the model:
its name, its layers and the type the map asked for (`layer_groups`). A map whose groups are
named early / middle / late (epi's fraction maps, and the study paper's three-group maps,
which the map reader names so) fills each column from its own group, with the group's layers:
`demo_bookend_q8_q4_q8` on 30 layers reads Q8_0 (0-7) | Q4_0 (8-22) | Q8_0 (23-29). A map
with one group fills all three. Every other map (e.g. a search map with one decision per run
of layers) shows, in each quarter of the depth, its groups that fall there by layer range
("0-2:Q8_0 3-7:Q4_0"), so the cell states exactly which layers have which type.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from epi.core.text import ranges_text

COLUMNS = ("early", "middle", "late")


def quarters(n_layers: int) -> dict[str, set[int]]:
    """The study's positional groups scaled to any depth: early = first quarter, middle =
    the half between, late = last quarter (0-7 / 8-23 / 24-31 of a 32-layer model)."""
    q = n_layers / 4
    early = {i for i in range(n_layers) if i < round(q)}
    late = {i for i in range(n_layers) if i >= n_layers - round(q)}
    return {"early": early, "middle": set(range(n_layers)) - early - late, "late": late}


class Group(Protocol):
    """A map's group as the quantization manifest records it (epi.formats.manifests)."""

    @property
    def name(self) -> str: ...

    @property
    def layers(self) -> list[int]: ...

    @property
    def map_type(self) -> str | dict[str, str] | None: ...


def _groups(layer_groups: Sequence[Group]) -> list[tuple[str, list[int], str]]:
    """(name, layers, map type) of every block-layer group; the non-block group (no layers,
    a {role: type} map type) is left out."""
    return [(g.name, sorted(g.layers), g.map_type) for g in layer_groups
            if g.layers and isinstance(g.map_type, str)]


def layer_group_cells(layer_groups: Sequence[Group], n_layers: int) -> dict[str, str]:
    """{'early': 'Q8_0 (0-7)', 'middle': ..., 'late': ...} from a manifest's `layer_groups`;
    '?' for every column when the manifest has no block groups."""
    groups = _groups(layer_groups)
    if not groups:
        return dict.fromkeys(COLUMNS, "?")
    if len(groups) == 1:
        _, layers, kind = groups[0]
        return dict.fromkeys(COLUMNS, f"{kind} ({ranges_text(layers)})")
    by_name = {name: (layers, kind) for name, layers, kind in groups}
    if set(COLUMNS) <= set(by_name):
        return {c: f"{by_name[c][1]} ({ranges_text(by_name[c][0])})" for c in COLUMNS}
    depth = n_layers or max(max(layers) for _, layers, _ in groups) + 1
    cells = {}
    for col, span in quarters(depth).items():
        parts = [f"{ranges_text(sorted(set(layers) & span))}:{kind}"
                 for _, layers, kind in sorted(groups, key=lambda g: g[1][0])
                 if set(layers) & span]
        cells[col] = " ".join(parts) or "—"
    return cells
