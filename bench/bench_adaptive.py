"""How long an adaptive study takes to reach its decisions, against a fixed protocol that
reaches the same decisions.

Two figures, each labelled with where its numbers come from:

- `adaptive_vs_fixed_time` — **measured**: a real adaptive campaign (`epi campaign`, the
  8-layer test model, three maps, the emulated meter daemon with the process-tree activity
  model, `[decide] compare = ["all_pairs"]`, 3–6 rounds). Its measuring time is read from the
  journal: first run step `started` → last run step `done` (every run, settle and the
  assessments between adaptive rounds included). The fixed protocol that reaches the same
  decisions measures every configuration for R rounds, R = the rounds the campaign's slowest
  comparison needed (its last assessed round), judged by the same rule; its time is R × the
  measured time of one full round, taken from the campaign's own first `min_rounds` rounds
  (which are a fixed protocol: every configuration, no assessment between them). Ratio =
  adaptive / fixed. One study, so one run: no spread.
- `adaptive_vs_fixed_time_sim` — **simulation from the measured noise**: N studies drawn with
  the campaign's measured J/token means as the true values, its measured per-round spread of
  paired savings, its invalid-run fraction, per-run times per configuration and assessment
  time. Each study is decided by the real `host.campaign.adaptive` functions (comparisons,
  assess, configs_to_measure); the fixed protocol measures every configuration for the
  adaptive study's final number of rounds on the same draws and is judged by the same rule.
  Figure = median ratio, spread = [10th, 90th percentile]; the note says how often the fixed
  protocol reached the same verdicts.

`--quick` skips the campaign and simulates from assumed inputs (labelled so), or from a
finished campaign directory given with `--from`.

Usage: `python bench/bench_adaptive.py [--quick] [--from CAMPAIGN_DIR] [--studies 1000]`
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from benchlib import emit, machine_line  # noqa: E402

from host.campaign import adaptive as ad  # noqa: E402

MAPS = REPO / "quantmaps"
BASELINE = "uniform_q8"


def rules_for(targets: tuple[str, ...]) -> ad.DecisionRules:
    """The study's [decide] rules: 3–6 rounds, 1 % the smallest difference worth resolving."""
    return ad.DecisionRules(targets=targets, min_rounds=3, max_rounds=6, margin_pct=1.0)


RULES = rules_for(("baseline",))


def study_text(model: Path, rules: ad.DecisionRules) -> str:
    maps = ", ".join(f'"{MAPS / m}.json"' for m in ("uniform_q8", "uniform_q4km",
                                                     "mix_high_early"))
    return f"""
[study]
name = "bench-adaptive"
seed = 3
out = "camp"
baseline = "{BASELINE}"

[[models]]
name = "tiny"
path = "{model}"
maps = [{maps}]

[run]
tokens = 128
repeats_per_run = 2
warmups = 0
threads = 1
idle_s = 0.5
cooldown_s = 0

[meter]
emulate = true
rate_hz = 40

[thermal]
rule = "fixed"
wait_s = 0.2

[analysis]
cv_threshold = 0.5           # the decisions' mechanics are measured, not a quiet machine
lag = "auto"
energy_basis = "net"

[decide]
compare = {json.dumps(list(rules.targets))}
min_rounds = {rules.min_rounds}
max_rounds = {rules.max_rounds}
margin_pct = {rules.margin_pct}
"""


@dataclass
class Inputs:
    """What the simulation draws from, and where it came from."""

    source: str  # "measured: ..." or "assumed: ..."
    mean_j: dict[str, float]  # true J/token per configuration
    spread_pct: float  # per-round sd of paired savings, %
    run_s: dict[str, float]  # time of one run step per configuration
    assess_s: float  # one assessment between adaptive rounds
    p_invalid: float
    baseline: str | None


@dataclass
class Measured:
    """The real campaign's measured ratio."""

    adaptive_s: float
    fixed_s: float
    rounds: int
    runs: int
    states: dict[str, int]


def _journal(camp: Path) -> list[dict]:
    return [json.loads(x) for x in (camp / "journal.jsonl").read_text().splitlines() if x]


def _run_events(camp: Path) -> list[tuple[str, int, int, int]]:
    """(config, round, started ns, done ns) of every finished run step, in start order."""
    started: dict[str, int] = {}
    out = []
    for ev in _journal(camp):
        step = str(ev.get("step") or "")
        if not step.startswith("run:"):
            continue
        if ev["event"] == "started":
            started[step] = int(ev["t_real_ns"])
        elif ev["event"] == "done" and step in started:
            parts = step.split(":")  # run:<config>:<round>, or …:take<t> (a re-measure)
            cfg, k = parts[1], parts[2]
            out.append((cfg, int(k), started[step], int(ev["t_real_ns"])))
    return sorted(out, key=lambda x: x[2])


def measured_ratio(camp: Path, min_rounds: int) -> Measured:
    """The campaign's adaptive measuring time against R full rounds at its own round time."""
    ev = _run_events(camp)
    final = json.loads((camp / "analysis" / "decisions.json").read_text())
    rounds = int(final["rounds_done"])
    first = [e for e in ev if e[1] <= min_rounds]
    per_round_s = (max(e[3] for e in first) - min(e[2] for e in first)) / 1e9 / min_rounds
    adaptive_s = (max(e[3] for e in ev) - min(e[2] for e in ev)) / 1e9
    return Measured(adaptive_s, rounds * per_round_s, rounds, len(ev), dict(final["states"]))


def inputs_from_campaign(camp: Path, rules: ad.DecisionRules) -> Inputs:
    """True values, noise, invalid fraction and times measured by a finished campaign."""
    import pandas as pd

    an = camp / "analysis"
    rep, runs = pd.read_csv(an / "repeats.csv"), pd.read_csv(an / "runs.csv")
    basis = "net" if (rep["basis"] == "net").any() else "gross"
    round_of_run = {str(r): int(k) for r, k in zip(runs["run_id"], runs["campaign_round"],
                                                   strict=True) if k == k}
    values = ad.round_values(rep, runs, round_of_run, basis=basis)
    cfgs = sorted(values)
    comps, _ = ad.comparisons(rules, cfgs, baseline=BASELINE)
    spread = ad.spread_pct(values, comps)
    means = {c: float(np.mean([v for v in values[c].values() if v is not None]))
             for c in cfgs if any(v is not None for v in values[c].values())}
    req = runs[runs["phase"] == "request"]
    p_invalid = float(1.0 - req["valid"].astype(bool).mean()) if len(req) else 0.0
    ev = _run_events(camp)
    # assessment: the gap after a round's last run beyond the usual gap between two runs
    gaps_in: list[float] = []
    gaps_after: list[float] = []
    for prev, nxt in pairwise(ev):
        (gaps_in if nxt[1] == prev[1] else gaps_after).append((nxt[2] - prev[3]) / 1e9)
    g0 = statistics.median(gaps_in) if gaps_in else 0.0
    # one run's slot: its step (started → done) and the usual gap (settle) before the next
    run_s = {c: statistics.median((e[3] - e[2]) / 1e9 for e in ev if e[0] == c) + g0
             for c in cfgs if any(e[0] == c for e in ev)}
    after = [g - g0 for g in gaps_after[rules.min_rounds - 1:]]  # rounds past the minimum
    assess_s = max(statistics.median(after), 0.0) if after else math.nan
    return Inputs(f"measured: campaign {camp} ({len(ev)} runs, {basis} J/token)", means,
                  spread, run_s, assess_s, p_invalid, BASELINE)


def assumed_inputs() -> Inputs:
    """Stated, not measured: four configurations 0 / 1.5 / 4 / 10 % cheaper than the first."""
    mean = {"c0": 0.100, "c1": 0.0985, "c2": 0.096, "c3": 0.090}
    return Inputs("assumed: 4 configurations 0/1.5/4/10 % below c0, per-round spread 3 %, "
                  "30 s a run, 10 s an assessment, 15 % invalid runs", mean, 3.0,
                  {c: 30.0 for c in mean}, 10.0, 0.15, "c0")


def simulate(inp: Inputs, rules: ad.DecisionRules, n_studies: int, seed: int = 28
             ) -> tuple[np.ndarray, float, dict[int, int]]:
    """(adaptive / fixed time per study, fraction where the fixed protocol reached the same
    verdicts, studies by the rounds the adaptive study ended after)."""
    rng = np.random.default_rng(seed)
    cfgs = sorted(inp.mean_j)
    comps, _ = ad.comparisons(rules, cfgs, baseline=inp.baseline)
    sigma = inp.spread_pct / 100.0 / math.sqrt(2.0)  # each config's own noise, relative
    assess_s = 0.0 if not math.isfinite(inp.assess_s) else inp.assess_s
    ratios, same = [], 0
    ended: dict[int, int] = {}
    for _ in range(n_studies):
        r_max = rules.max_rounds
        shared = 1.0 + rng.normal(0.0, 0.05, r_max)  # the room, the load: cancels in pairs
        full = {c: {k + 1: (None if rng.random() < inp.p_invalid else
                            inp.mean_j[c] * shared[k] * (1.0 + rng.normal(0.0, sigma)))
                    for k in range(r_max)} for c in cfgs}
        # adaptive: min_rounds of everything, then only configurations still undecided
        measured = {c: {k: full[c][k] for k in range(1, rules.min_rounds + 1)} for c in cfgs}
        n_runs = len(cfgs) * rules.min_rounds
        k, n_assess = rules.min_rounds, 0
        while True:
            found = ad.assess(rules, comps, measured, k)
            n_assess += 1
            nxt = ad.configs_to_measure(found)
            if not nxt or k >= rules.max_rounds:
                break
            k += 1
            for c in nxt:
                measured[c][k] = full[c][k]
            n_runs += len(nxt)
        runs_s = sum(inp.run_s[c] * len(measured[c]) for c in cfgs)
        adaptive_s = runs_s + (n_assess - 1) * assess_s  # the last one = the fixed's analysis
        fixed_s = k * sum(inp.run_s[c] for c in cfgs)
        ratios.append(adaptive_s / fixed_s)
        ended[k] = ended.get(k, 0) + 1
        fixed = ad.assess(rules, comps, {c: {r: full[c][r] for r in range(1, k + 1)}
                                         for c in cfgs}, k)
        same += all((a.verdict.state, a.verdict.direction) == (b.verdict.state,
                                                                  b.verdict.direction)
                    for a, b in zip(found, fixed, strict=True))
    return np.asarray(ratios), same / n_studies, dict(sorted(ended.items()))


def run_campaign(tmp: Path, rules: ad.DecisionRules, timeout_s: float) -> Path | None:
    from host.quant.tiny_model import write_test_model

    model = write_test_model(tmp / "tiny.gguf")
    study = tmp / "study.toml"
    study.write_text(study_text(model, rules))
    t0 = time.perf_counter()
    # its own session: on a timeout the campaign's whole tree (daemon, runs) is stopped
    proc = subprocess.Popen([sys.executable, "-m", "epi", "campaign", str(study)], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
        print(f"campaign did not finish within {timeout_s:.0f} s (load "
              f"{os.getloadavg()[0]:.1f}): no measured figure")
        return None
    print(f"campaign (quantize, {rules.min_rounds}–{rules.max_rounds} adaptive rounds, "
          f"analysis, report): {time.perf_counter() - t0:.1f} s wall, rc {proc.returncode}")
    for line in out.splitlines():
        if line.startswith(("after round", "  savings", "  pair", "  frontier")):
            print("  " + line.strip())
    if proc.returncode != 0:
        print(out[-4000:])
        return None
    return tmp / "camp"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true",
                    help="no campaign: simulate from assumed inputs (or --from)")
    ap.add_argument("--from", dest="camp", type=Path, default=None,
                    help="a finished adaptive campaign directory to take the inputs from")
    ap.add_argument("--studies", type=int, default=1000, help="simulated studies")
    ap.add_argument("--compare", nargs="+", default=list(RULES.targets),
                    help=f"what the study decides: {', '.join(ad.TARGETS)} (default baseline)")
    ap.add_argument("--campaign-timeout-s", type=float, default=480.0)
    args = ap.parse_args()
    print(machine_line("bench_adaptive.py"), flush=True)
    if args.studies < 1:
        print("--studies: must be at least 1")
        return 2
    try:
        rules = rules_for(tuple(args.compare))
    except ValueError as e:
        print(f"--compare: {e}")
        return 2
    camp: Path | None = args.camp
    if camp is not None and not (camp / "journal.jsonl").is_file():
        print(f"--from {camp}: no journal.jsonl there (not a campaign directory)")
        return 2
    cpu0 = time.process_time()
    if camp is None and not args.quick:
        camp = run_campaign(Path(tempfile.mkdtemp(prefix="epi-bench-adaptive-")), rules,
                            args.campaign_timeout_s)
    inp = assumed_inputs()
    if camp is not None:
        m = measured_ratio(camp, rules.min_rounds)
        print(f"measured: adaptive {m.adaptive_s:.1f} s ({m.runs} runs, {m.rounds} rounds; "
              f"{m.states}) against fixed {m.fixed_s:.1f} s ({m.rounds} rounds × every "
              f"configuration at the campaign's own round time)")
        emit("adaptive_vs_fixed_time", round(m.adaptive_s / m.fixed_s, 3), 1, None,
             f"measured: one real adaptive campaign (tiny model, emulated meter, "
             f"{m.runs} runs, {m.rounds} rounds); fixed = {m.rounds} full rounds at the time "
             "of the campaign's own fixed first rounds")
        inp = inputs_from_campaign(camp, rules)
    print(f"simulation inputs ({inp.source}): means {inp.mean_j}, spread "
          f"{inp.spread_pct:.3g} %, run s {inp.run_s}, assessment {inp.assess_s:.3g} s, "
          f"invalid {inp.p_invalid:.0%}")
    if not math.isfinite(inp.spread_pct) or len(inp.mean_j) < 2:
        print("no per-round spread or fewer than 2 configurations measured: no simulation")
        return 1
    ratios, same, ended = simulate(inp, rules, args.studies)
    n = len(ratios)
    med = float(np.median(ratios))
    p10, p90 = (float(x) for x in np.percentile(ratios, [10, 90]))
    print(f"simulation: {n} studies, adaptive/fixed time median {med:.3f} [p10 {p10:.3f}, "
          f"p90 {p90:.3f}]; studies by the rounds they ended after: {ended}; the fixed "
          f"protocol reached the same verdicts in {same:.1%}; "
          f"CPU {time.process_time() - cpu0:.1f} s (this process)")
    emit("adaptive_vs_fixed_time_sim", round(med, 3), n, [round(p10, 3), round(p90, 3)],
         f"simulation from {inp.source.split(':')[0]} inputs ({inp.source}); fixed = every "
         f"configuration for the adaptive study's final rounds on the same draws, same "
         f"verdicts in {same:.1%} of studies")
    return 0


if __name__ == "__main__":
    sys.exit(main())
