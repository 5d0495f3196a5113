"""The analysis' comparison records: perplexity-matched pairs, the layer-group differential and
the time-share estimate, each a row of results.json with its JSON beside it.

`to_json` writes the keys in the order results.json has always had them (the file stays
byte-identical); `from_json` reads one back (a reader of results.json, or a test's round trip).
NaN stays NaN here: host.analysis.output.clean writes it as null.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any

from epi.formats.json_types import JSON


def _float(doc: Mapping[str, object], key: str) -> float:
    v = doc.get(key)
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else math.nan


def _int(doc: Mapping[str, object], key: str) -> int:
    v = doc.get(key)
    return int(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else 0


def _str(doc: Mapping[str, object], key: str) -> str:
    v = doc.get(key)
    return v if isinstance(v, str) else ""


def _flag(doc: Mapping[str, object], key: str) -> bool | None:
    v = doc.get(key)
    return v if isinstance(v, bool) else None


# a field's declared type → how it is read (a missing or mistyped value: NaN, 0, "" or None)
_READERS: dict[str, Callable[[Mapping[str, object], str], object]] = {
    "str": _str, "float": _float, "int": _int, "bool | None": _flag}


def _fields_from(cls: type, doc: Mapping[str, object]) -> dict[str, Any]:
    """Each of a record's fields read from `doc` by its declared type (so each value has
    its field's type: the reader for that type made it)."""
    return {f.name: _READERS[str(f.type)](doc, f.name) for f in fields(cls)}


@dataclass(frozen=True)
class PerplexityPair:
    """Two configurations whose perplexities agree within the tolerance, and the paired
    J/token difference between them (the dearer one first in the difference)."""

    cheaper: str
    dearer: str
    ppl_cheaper: float
    ppl_dearer: float
    ppl_rel_diff: float
    j_per_token_cheaper: float
    j_per_token_dearer: float
    saving_pct: float
    saving_pct_ci_lo: float
    saving_pct_ci_hi: float
    delta_j_per_token: float
    delta_ci_lo: float
    delta_ci_hi: float
    ci_coverage: float
    ci_method: str
    n_pairs: int
    distinguishable: bool | None
    reason: str
    ppl_tolerance: float
    energy_basis: str = ""  # what the J/token figures count (set by the analysis)

    def to_json(self) -> dict[str, JSON]:
        return asdict(self)

    @classmethod
    def from_json(cls, doc: Mapping[str, object]) -> PerplexityPair:
        return cls(**_fields_from(cls, doc))


@dataclass(frozen=True)
class GroupDifferential:
    """The energy attributed to one layer group by two configurations that differ only in
    that group's type: B − A in J per generated token, with its paired interval."""

    group: str
    config_a: str
    config_b: str
    type_a: str
    type_b: str
    delta_j_per_token: float
    ci_lo: float
    ci_hi: float
    ci_coverage: float
    ci_method: str
    n_a: int
    n_b: int
    distinguishable: bool | None
    reason: str
    energy_basis: str = ""  # set by the analysis
    method: str = ""  # set by the analysis

    def to_json(self) -> dict[str, JSON]:
        return asdict(self)

    @classmethod
    def from_json(cls, doc: Mapping[str, object]) -> GroupDifferential:
        return cls(**_fields_from(cls, doc))


@dataclass(frozen=True)
class TimeShareEstimate:
    """A node's J per generated token split over the layer groups it holds by weight bytes
    (an estimate, labelled so)."""

    config: str
    node: str
    group: str
    j_per_token: float
    energy_basis: str
    label: str

    def to_json(self) -> dict[str, JSON]:
        return asdict(self)

    @classmethod
    def from_json(cls, doc: Mapping[str, object]) -> TimeShareEstimate:
        return cls(**_fields_from(cls, doc))
