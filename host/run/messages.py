"""The messages between `epi run` and its inference process (host/run/child.py), as records.

The child sends one record per event over the socket pair (multiprocessing pickles them; both
ends import this module): `Loaded` after the model is in place, `Cooldown` before each repeat's
cool-down — then it waits for `Go`, so the parent can sync the meters' clocks first —, `Idle`
when the idle baseline starts, `Request` after each finished request, then `Done`, or `Error`
with one line when it cannot go on. The parent dispatches on the record's class (`match`), so
a misspelt kind is a type error rather than a message nobody handles.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Union

from host.cluster.placement import PlacementEntry


@dataclass(frozen=True)
class Loaded:
    """The model is loaded: where its layers went and which tokens generation bans."""

    placement: list[PlacementEntry]
    n_params: int
    eog_ids: list[int]
    load_s: float
    resident_bytes: int = 0  # a split configuration's two models and KV caches; 0 unsplit


@dataclass(frozen=True)
class Cooldown:
    """Repeat `repeat` (0-based) is about to cool down; the child waits for `Go`."""

    repeat: int


@dataclass(frozen=True)
class Idle:
    """Repeat `repeat`'s idle baseline of `seconds` starts now."""

    repeat: int
    seconds: float


@dataclass(frozen=True)
class Request:
    """One finished request's headline figures (its rows are already in the token log)."""

    request_id: int
    repeat: int
    warmup: bool
    prompt_id: str
    n_prompt_tokens: int
    n_generated_tokens: int
    prefill_ms: float
    decode_ns: int
    total_ms: float


@dataclass(frozen=True)
class Done:
    """Every request ran; `requests` of them, warm-ups included."""

    requests: int


@dataclass(frozen=True)
class Error:
    """The child stopped: one line saying why (a traceback, if any, is in llama.log)."""

    message: str


@dataclass(frozen=True)
class Go:
    """The parent's answer to `Cooldown`: the clocks are synced, go on."""


ChildMessage = Union[Loaded, Cooldown, Idle, Request, Done, Error]
