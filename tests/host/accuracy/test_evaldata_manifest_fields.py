"""The data manifest's reader checks every field its type (`evaldata.Manifest`) declares.

A prepared manifest reads back unchanged; a hostile value in a field that was not checked
before the manifest was typed (info_files, upstream, derived) is one line naming the field.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from epi.core.errors import UserError
from host.accuracy import evaldata


def _edit(root: Path, group: str, name: str, key: str, value: object) -> None:
    path = root / "manifest.json"
    doc = json.loads(path.read_text())
    doc[group][name][key] = value
    path.write_text(json.dumps(doc))


def test_prepared_manifest_reads_back_whole(prepared: Path) -> None:
    on_disk = json.loads((prepared / "manifest.json").read_text())
    assert evaldata.read_manifest(prepared) == on_disk  # nothing dropped, nothing added


@pytest.mark.parametrize(("key", "value", "message"), [
    ("info_files", [{"path": "../outside", "sha256": "0" * 64, "bytes": 1}],
     r"benchmarks\.hellaswag\.info_files\[0\]\.path: '\.\./outside' is not a path inside"),
    ("info_files", "not a list", r"benchmarks\.hellaswag\.info_files"),
    ("upstream", 7, r"benchmarks\.hellaswag\.upstream"),
    ("split", ["x"], r"benchmarks\.hellaswag\.split"),
])
def test_hostile_benchmark_field_is_one_line(prepared: Path, key: str, value: object,
                                             message: str) -> None:
    _edit(prepared, "benchmarks", "hellaswag", key, value)
    with pytest.raises(UserError, match=message) as exc:
        evaldata.read_manifest(prepared)
    assert "\n" not in str(exc.value)


def test_upstream_may_be_null(prepared: Path) -> None:
    _edit(prepared, "benchmarks", "hellaswag", "upstream", None)  # a user-supplied file's
    assert evaldata.read_manifest(prepared)["benchmarks"]["hellaswag"].get("upstream") is None


def test_hostile_text_derivation_is_one_line(prepared: Path) -> None:
    _edit(prepared, "texts", "lambada", "derived", {"how": 1})
    with pytest.raises(UserError, match=r"texts\.lambada\.derived"):
        evaldata.read_manifest(prepared)
