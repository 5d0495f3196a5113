"""Runs sized to the machine: a speed probe before round 1, then the tokens per request that
let the measuring budget hold the rounds the power analysis says the comparisons need.

A study with `[decide]` and a time budget names how long it may measure, and the power
analysis (host.analysis.sequential.rounds_for) says how many rounds a difference of
`size_for_pct` % needs at the study's per-round spread. Whether those rounds fit depends on
how fast this machine decodes, which the study file can only guess (`[estimate]`). So, before
the first run, the campaign times the baseline configuration on this machine (one short
request: prefill and decode rates) and picks the largest tokens per request — the study's, or
a half, a quarter … of it — whose projected rounds fit the budget. Tokens never go below what
gives `MIN_DECODE_SAMPLES` meter samples per decode window, and never above the study's.
When even the floor cannot hold the rounds, the campaign says so up front, with the numbers
("deciding a 10 % difference takes about N rounds (M min); the budget holds K").

Only the tokens per request change: prompts, repeats and settling stay the study's, so every
run of a campaign measures the same thing (the sizing is decided once, kept in
OUT/probes/sizing.json, and a resumed campaign reads it back). Changing the study's tokens
makes the record stale: it is then ignored, and the campaign sizes again if no run has been
measured yet.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from epi.core.text import format_duration
from host.analysis import sequential

SIZING_JSON = Path("probes") / "sizing.json"
SIZING_FORMAT = "epi-run-sizing"
MIN_DECODE_SAMPLES = 40  # meter samples per decode window below which runs are not shortened
MIN_TOKENS = 32  # whatever the meter's rate: a decode window of fewer tokens says little
PROBE_TOKENS = 64  # decode tokens of the speed probe's request


@dataclass(frozen=True)
class SpeedProbe:
    """This machine's speed on the baseline configuration: one request, timed by its tokens."""

    model: str
    threads: int
    prompt_tokens: int
    decode_tokens: int
    prefill_tok_s: float
    decode_tok_s: float
    load_s: float


@dataclass(frozen=True)
class RunShape:
    """What one run does besides its tokens (the study's [run], with its prompt set)."""

    n_prompts: int
    prompt_tokens: int  # summed over the prompt set
    warmups: int  # warm-up passes
    repeats: int  # measured passes
    pause_s: float  # idle baseline + cool-down, per measured repeat
    settle_s: float  # the thermal settle before each run
    warmup_tokens: int | None = None  # tokens per warm-up request (None: the run's)


@dataclass(frozen=True)
class RunSizing:
    """The sizing decision, kept in OUT/probes/sizing.json."""

    study_tokens: int
    tokens: int
    floor_tokens: int
    per_run_s: float  # projected at `tokens`, settle included
    n_configs: int
    budget_s: float
    spread_pct: float
    spread_basis: str
    size_for_pct: float
    rounds_needed: int | None  # None: more than sequential's search covers
    rounds_target: int  # rounds_needed within [min_rounds, max_rounds]
    rounds_affordable: int
    probe: SpeedProbe

    @property
    def fits(self) -> bool:
        return self.rounds_affordable >= self.rounds_target

    def to_json(self) -> dict[str, object]:
        return {"format": SIZING_FORMAT, "format_version": 1, **asdict(self)}

    @classmethod
    def from_json(cls, doc: object) -> RunSizing:
        if not isinstance(doc, dict) or doc.get("format") != SIZING_FORMAT:
            raise ValueError(f"not an {SIZING_FORMAT} document")
        fields = {k: v for k, v in doc.items() if k not in ("format", "format_version")}
        probe = fields.pop("probe")
        if not isinstance(probe, dict):
            raise ValueError("probe: not an object")
        return cls(probe=SpeedProbe(**probe), **fields)

    def lines(self) -> list[str]:
        """What the console and the dry-run print: the probe, the choice, and whether the
        budget holds the rounds."""
        p = self.probe
        out = [f"speed probe ({p.model}, {p.threads} thread(s)): prefill "
               f"{p.prefill_tok_s:.0f} tok/s, decode {p.decode_tok_s:.1f} tok/s, load "
               f"{p.load_s:.1f} s"]
        need = (f"about {self.rounds_needed} rounds" if self.rounds_needed is not None
                else "more rounds than searched")
        why = (f"at a per-round spread of {self.spread_pct:.3g} % ({self.spread_basis}), "
               f"deciding a {self.size_for_pct:g} % difference takes {need}")
        if self.rounds_needed != self.rounds_target:
            why += f" ({self.rounds_target} within the study's round limits)"
        size = (f"runs of {self.tokens} tokens per request" + (
            f" (the study's {self.study_tokens}, shortened to fit)"
            if self.tokens < self.study_tokens else " (the study's)")
            + f" take ~{format_duration(self.per_run_s)} each")
        hold = (f"the budget of {format_duration(self.budget_s)} holds "
                f"{self.rounds_affordable} round(s) of {self.n_configs} configuration(s)")
        if self.fits:
            out.append(f"sized to this machine: {why}; {size}; {hold}")
        else:
            total = self.rounds_target * self.n_configs * self.per_run_s
            out.append(f"cannot fit: {why} ({format_duration(total)} of runs of "
                       f"{self.tokens} tokens, the shortest the sizing takes: {MIN_DECODE_SAMPLES} "
                       f"meter samples per decode window, {MIN_TOKENS} tokens at least); "
                       f"{hold}. Comparisons "
                       "may end undecided: raise decide.time_budget_min, or continue later "
                       "with `epi campaign STUDY --extend-budget 10m`")
        return out


def run_seconds(shape: RunShape, tokens: int, probe: SpeedProbe) -> float:
    """Projected seconds of one run of `tokens` tokens per request at the probe's rates (its
    warm-up requests generate `warmup_tokens`, never more than `tokens`)."""
    def per_pass(n: int) -> float:
        return shape.prompt_tokens / probe.prefill_tok_s + shape.n_prompts * n / probe.decode_tok_s

    warm = min(shape.warmup_tokens or tokens, tokens)
    return (probe.load_s + shape.warmups * per_pass(warm) + shape.repeats * per_pass(tokens)
            + shape.repeats * shape.pause_s + shape.settle_s)


def floor_tokens(decode_tok_s: float, rate_hz: float) -> int:
    """The fewest tokens per request whose decode window holds MIN_DECODE_SAMPLES samples."""
    return max(MIN_TOKENS, math.ceil(MIN_DECODE_SAMPLES / rate_hz * decode_tok_s))


def size_runs(*, study_tokens: int, shape: RunShape, probe: SpeedProbe, n_configs: int,
              budget_s: float, rate_hz: float, spread_pct: float, spread_basis: str,
              size_for_pct: float, min_rounds: int, max_rounds: int,
              alpha: float = sequential.DEFAULT_ALPHA) -> RunSizing:
    """The largest tokens per request (the study's, halved while needed, not below the
    meter's floor) whose projected rounds fit `budget_s`."""
    need = sequential.rounds_for(spread_pct, size_for_pct, alpha=alpha)
    target = min(max(need if need is not None else max_rounds, min_rounds), max_rounds)
    floor = min(floor_tokens(probe.decode_tok_s, rate_hz), study_tokens)
    candidates = [study_tokens]
    while candidates[-1] // 2 >= floor:
        candidates.append(candidates[-1] // 2)
    if candidates[-1] > floor:
        candidates.append(floor)
    chosen, per_run, affordable = candidates[-1], 0.0, 0
    for tokens in candidates:
        per_run = run_seconds(shape, tokens, probe)
        affordable = int(budget_s // (per_run * n_configs)) if n_configs else 0
        chosen = tokens
        if affordable >= target:
            break
    return RunSizing(study_tokens=study_tokens, tokens=chosen, floor_tokens=floor,
                     per_run_s=per_run, n_configs=n_configs, budget_s=budget_s,
                     spread_pct=spread_pct, spread_basis=spread_basis,
                     size_for_pct=size_for_pct, rounds_needed=need, rounds_target=target,
                     rounds_affordable=affordable, probe=probe)


def probe_speed(model: Path, prompt_text: str, prompt_tokens: int, *, threads: int,
                decode_tokens: int = PROBE_TOKENS) -> SpeedProbe:
    """Time one request of the study's first prompt on `model`: load, prefill and decode.

    The request runs twice and the second is kept (the first pays for cold caches, as a
    campaign's warm-up pass does)."""
    from host.run.engine import load_model, timed_request, tokenize_texts

    ids = tokenize_texts(model, [prompt_text])[0][:prompt_tokens]
    t0 = time.monotonic()
    llm = load_model(model, threads=threads, n_ctx=len(ids) + decode_tokens + 8).llm
    load_s = time.monotonic() - t0
    timing = timed_request(llm, ids, decode_tokens)
    timing = timed_request(llm, ids, decode_tokens)
    prefill_s = (timing.token_mono_ns[0] - timing.t_start_mono_ns) / 1e9
    decode_s = (timing.token_mono_ns[-1] - timing.token_mono_ns[0]) / 1e9
    return SpeedProbe(model=model.name, threads=threads, prompt_tokens=len(ids),
                      decode_tokens=decode_tokens, prefill_tok_s=len(ids) / prefill_s,
                      decode_tok_s=(decode_tokens - 1) / decode_s, load_s=load_s)


def read_sizing(root: Path, study_tokens: int) -> RunSizing | None:
    """The kept sizing of campaign directory `root`, when it was made for these tokens."""
    path = root / SIZING_JSON
    try:
        sizing = RunSizing.from_json(json.loads(path.read_text()))
    except (OSError, ValueError, TypeError, KeyError):
        return None
    return sizing if sizing.study_tokens == study_tokens else None


def write_sizing(root: Path, sizing: RunSizing) -> Path:
    path = root / SIZING_JSON
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(sizing.to_json(), indent=1) + "\n")
    tmp.replace(path)
    return path
