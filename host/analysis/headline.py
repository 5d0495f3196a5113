"""The headline rows of a results table, one home for the filter every reader applies.

A configuration's headline figure is its J per generated token over whole requests, all
channels, on one energy basis. The analysis, the report, the bundle facts, the community record
and the search all pick those rows; this module spells the selection once. It imports no pandas
at run time, so readers of results.csv as text (bundle, community) stay light.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from host.analysis.vocabulary import SCOPE_ALL, EnergyBasis, Phase, TokenUnit

if TYPE_CHECKING:
    import pandas as pd


def headline_rows(results: pd.DataFrame, basis: str, *, phase: str = Phase.REQUEST,
                  unit: str = TokenUnit.GENERATED, nodes: bool = False) -> pd.DataFrame:
    """The rows of `results` (or its repeats) for one phase and token unit on `basis`: the
    whole meter's (scope all), or with `nodes` every node's (scope other than all)."""
    scope = results["scope"] != SCOPE_ALL if nodes else results["scope"] == SCOPE_ALL
    return results[scope & (results["phase"] == phase) & (results["unit"] == unit)
                   & (results["basis"] == basis)]


def is_headline(row: Mapping[str, str | None], basis: str = EnergyBasis.GROSS) -> bool:
    """Whether a results.csv row read as text is a headline row on `basis`."""
    return (row.get("scope"), row.get("phase"), row.get("unit"), row.get("basis")) == (
        SCOPE_ALL, Phase.REQUEST, TokenUnit.GENERATED, basis)
