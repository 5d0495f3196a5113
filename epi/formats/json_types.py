"""The JSON value type, defined once for every reader and writer of JSON files.

`JSON` is what `json.loads` can return and `json.dumps` can write without a `default=`:
a checker then sees a document's shape instead of an unchecked value. `JSONObject` is a parsed JSON
object as readers receive it (read-only: a reader narrows its fields, it does not edit them).
`JSONDict` is a JSON object a record keeps or a writer builds whose values are not all typed
as JSON (a manifest's free-form `inputs`, `map` and `llama_cpp` blocks).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Union

JSON = Union[None, bool, int, float, str, list["JSON"], dict[str, "JSON"]]
JSONObject = Mapping[str, object]
JSONDict = dict[str, object]


def as_json(value: object, where: str = "value") -> JSON:
    """``value`` as the JSON it already is (tuples become lists, as ``json.dumps`` writes
    them); TypeError naming ``where`` for anything ``json.dumps`` would refuse, and for a key
    that is not text (``json.dumps`` would turn it into text; a document's keys are names).

    For a document built from fields a checker sees only as ``object`` (a live sample whose
    producer types it loosely): the check happens here, where the value is taken in, instead
    of at the ``json.dumps`` that sends it.
    """
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        return [as_json(v, f"{where}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, dict):
        out: dict[str, JSON] = {}
        for k, v in value.items():
            if not isinstance(k, str):
                raise TypeError(f"{where}: key {k!r} is not text")
            out[k] = as_json(v, f"{where}.{k}")
        return out
    raise TypeError(f"{where}: {value!r} is not JSON")
