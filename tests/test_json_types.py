"""`as_json`: what json.dumps can write comes back unchanged, anything else is refused."""

from __future__ import annotations

import json
import re

import pytest

from epi.formats.json_types import as_json


def test_as_json_keeps_what_json_dumps_writes() -> None:
    doc = {"a": 1, "b": [1.5, None, True, "x"], "c": {"d": (1, 2)}}
    got = as_json(doc)
    # the same text json.dumps writes for the original (a tuple is written as a list)
    assert json.dumps(got) == json.dumps(doc)
    assert got == {"a": 1, "b": [1.5, None, True, "x"], "c": {"d": [1, 2]}}


@pytest.mark.parametrize(("value", "where"), [
    ({"a": {1, 2}}, "sample.a"),  # json.dumps refuses a set
    ({"a": [b"x"]}, "sample.a[0]"),  # and bytes
    ({1: "x"}, "sample"),  # a key that is not text
])
def test_as_json_refuses_and_names_where(value: object, where: str) -> None:
    with pytest.raises(TypeError, match="^" + re.escape(where) + ": "):
        as_json(value, "sample")
