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
