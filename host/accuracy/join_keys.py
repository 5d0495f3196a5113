"""What an accuracy entry is found by: the model's sha256, or a split configuration's two.

Its own module because both the accuracy file's reader (host.accuracy.results) and its
consistency check (host.accuracy.consistency) key entries this way, and the reader calls the
check.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def join_key(sha256: str, decode_sha256: str | None = None) -> str:
    """What an entry is found by: the model's sha256, or for a split configuration both
    phases' (prefill>decode), so a split never takes its prefill parent's figures."""
    return sha256 if decode_sha256 is None else f"{sha256}>{decode_sha256}"


def entry_join_key(m: Mapping[str, Any]) -> str:
    """The join key of one model entry (its `split` block names the decode model)."""
    split = m.get("split")
    decode = split.get("decode") if isinstance(split, Mapping) else None
    return join_key(str(m.get("sha256")),
                    str(decode.get("sha256")) if isinstance(decode, Mapping) else None)


def run_join_key(header: Mapping[str, Any]) -> str:
    """The join key of a run (its run.json header): `model.sha256`, and a split run's
    `split.decode.sha256`."""
    model = header.get("model")
    split = header.get("split")
    decode = split.get("decode") if isinstance(split, Mapping) else None
    return join_key(str(model.get("sha256")) if isinstance(model, Mapping) else "None",
                    str(decode.get("sha256")) if isinstance(decode, Mapping) else None)
