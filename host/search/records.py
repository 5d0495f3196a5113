"""The search state's records: one measured round, and the prediction a pick was made on.

Both are stored in search.json (host/search/driver.py) and read back when a stopped search
continues, so each keeps its JSON form beside it: `to_json` writes the keys in the order the
file has always had them, `from_json` checks every field and names the one that is wrong.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from epi.core.errors import UserError
from epi.formats.fields import check_float, check_int
from epi.formats.json_types import JSON


def _strs(value: object, where: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise UserError(f"{where}: expected a list of strings")
    return tuple(value)


def _object(doc: object, where: str) -> Mapping[str, object]:
    if not isinstance(doc, dict):
        raise UserError(f"{where}: expected an object")
    return doc


@dataclass(frozen=True)
class SearchRound:
    """One finished round: the maps its campaign measured, the search picks among them, and
    the hand-made map they were compared with (None: round 0, the hand-made maps alone)."""

    number: int
    maps: tuple[str, ...]  # map file names, in the campaign's order
    picked: tuple[str, ...]  # the search candidates' config ids
    against: str | None

    def to_json(self) -> dict[str, JSON]:
        return {"round": self.number, "maps": list(self.maps), "picked": list(self.picked),
                "against": self.against}

    @classmethod
    def from_json(cls, doc: object, where: str) -> SearchRound:
        d = _object(doc, where)
        against = d.get("against")
        if against is not None and not isinstance(against, str):
            raise UserError(f"{where}: field 'against': expected a config id or null")
        return cls(check_int(d.get("round"), f"{where}: field 'round'", lo=0),
                   _strs(d.get("maps", []), f"{where}: field 'maps'"),
                   _strs(d.get("picked", []), f"{where}: field 'picked'"), against)


@dataclass(frozen=True)
class Prediction:
    """What the fitted models said of a candidate when it was picked, before it was measured
    (None figures: no fitted model yet — round 0's picks)."""

    j_per_token: float | None
    accuracy: float | None
    epi: float | None
    epi_interval: tuple[float | None, float | None]
    fit_n: int  # runs the energy model was fitted on
    accuracy_fit_n: int  # configurations the accuracy model was fitted on

    def to_json(self) -> dict[str, JSON]:
        return {"predicted_j_per_token": self.j_per_token,
                "predicted_accuracy": self.accuracy, "predicted_epi": self.epi,
                "predicted_epi_interval": list(self.epi_interval), "fit_n": self.fit_n,
                "accuracy_fit_n": self.accuracy_fit_n}

    @classmethod
    def from_json(cls, doc: object, where: str) -> Prediction:
        d = _object(doc, where)

        def figure(key: str) -> float | None:
            return check_float(d.get(key), f"{where}: field {key!r}", null_ok=True)

        interval = d.get("predicted_epi_interval")
        if not isinstance(interval, list) or len(interval) != 2:
            raise UserError(f"{where}: field 'predicted_epi_interval': expected [lo, hi]")
        lo, hi = (check_float(x, f"{where}: field 'predicted_epi_interval'", null_ok=True)
                  for x in interval)
        return cls(figure("predicted_j_per_token"), figure("predicted_accuracy"),
                   figure("predicted_epi"), (lo, hi),
                   check_int(d.get("fit_n"), f"{where}: field 'fit_n'", lo=0),
                   check_int(d.get("accuracy_fit_n"), f"{where}: field 'accuracy_fit_n'", lo=0))
