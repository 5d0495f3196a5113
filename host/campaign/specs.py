"""What a campaign hands each step process (`spec.json`'s `args`), one TypedDict per step kind.

The campaign (host.campaign.execute) builds them; the step (host.campaign.step) reads them
back from JSON. Paths travel as text (JSON), relative to the working directory the campaign
and its steps share.
"""

from __future__ import annotations

from typing import TypedDict, Union


class PrepareArgs(TypedDict):
    name: str  # a prepared model name (`epi model prepare`)


class QuantizeArgs(TypedDict):
    map: str
    base: str
    out_dir: str
    threads: int | None


class DataArgs(TypedDict):
    benchmarks: list[str]
    texts: list[str]


class _AccuracyArgsCore(TypedDict):
    model: str
    benchmarks: dict[str, int]  # name → items
    ppl: str | None
    ppl_windows: int | None
    threads: int
    seed: int
    out: str


class AccuracyArgs(_AccuracyArgsCore, total=False):
    """An accuracy step's arguments; `cluster`, `store` and `shots` are absent in older
    specs."""

    cluster: str | None  # score on Dask workers: "tcp://HOST:PORT" or "local:N"
    store: str | None  # the shared accuracy store (EPI_ACCURACY_STORE)
    shots: dict[str, int]  # few-shot examples per benchmark (absent: zero-shot)
    shot_seed: int
    decode_model: str  # a split configuration's decode GGUF (`--decode-model`); absent: unsplit


class RunArgs(TypedDict):
    model: str
    out: str
    prompts: str | None
    tokens: int
    repeats: int
    warmups: int
    warmup_tokens: int | None  # tokens per warm-up request (absent in older specs: `tokens`)
    threads: int | None
    workers: str | None
    split: str | None
    node: str | None
    meters: list[str]  # every meter daemon's URL, in the study's order (`--meter` order)
    idle_s: float
    cooldown_s: float
    seed: int
    # the configuration's label when it is not the map's own id (a map measured on several
    # models: MAP.MODEL); None: the manifest's map id labels the run
    map_id: str | None
    decode_model: str | None  # a split configuration's decode GGUF (`epi run --decode-model`)


StepArgs = Union[PrepareArgs, QuantizeArgs, DataArgs, AccuracyArgs, RunArgs]
