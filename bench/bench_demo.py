"""`epi demo` under contention: wall time, valid runs, and comparisons left without a verdict.

Runs the demo's study (examples/study-demo.toml: SmolLM2-135M, four mix maps, the emulated
meter with the process-tree activity model, adaptive rounds) as `python -m epi demo` into a
fresh campaign directory under /tmp, while `--busy-cores N` unrelated busy loops (started by
this bench, siblings of the campaign so they are not in its process tree; stopped at the end)
keep N cores busy — the demo must stay valid with "one core kept busy by an unrelated load".
Figures:

- `demo-wall-s`: the demo's wall time (goal: no longer than the demo measured before this
  bench, 19 min 20 s at load 2-4);
- `demo-configs-valid-frac`: configurations with a valid figure in every measured phase (for
  each of prefill, decode and request at least one run whose phase passed the default
  validity gates in the final analysis, analysis/runs.csv — the results table aggregates
  each phase over its own valid runs), over all configurations — the demo's goal of
  "every configuration valid";
- `demo-runs-valid-frac`: runs whose every phase (idle, prefill, decode, request) passed the
  default validity gates, over all runs — a stricter target: on a machine whose speed varies
  from request to request (bench_cpu_steadiness.py) the 3 % repeat-CV gate refuses some runs,
  rightly;
- `demo-undecided-without-round-count`: comparisons the study names that ended undecided
  without the rounds they would need (analysis/decisions.json: "gives no round count", or
  still "undecided so far").

- `demo-rq1-pair-frac`: runs whose first answer (same perplexity, different joules) is
  asked of a perplexity-matched pair (decided or undecided), not "cannot be answered";
- `demo-two-decided-frac`: runs in which at least two of the comparisons the study names
  ended decided (or equivalent) — the demo deciding;
- `demo-sizing-stated-frac`: runs whose console states the plan's sizing (`sized to this
  machine` or `cannot fit`, host/campaign/sizing.py) before round 1;
- `demo-wall-s-warm`: the wall time of runs after the first (models, data and accuracy
  cached by content), idle (`--busy-cores 0`).

`--runs N` repeats the whole demo N times, each from a fresh campaign directory.

Every run's net and gross repeat CV (request phase) and reasons are printed too, and the
re-measures the campaign made of refused runs (`[decide] remeasure`, docs/campaign.md: their
directories `runs/<config>/round<k>-take<t>-attempt<j>`; the refused runs stay counted above).

Usage: `python bench/bench_demo.py [--busy-cores 1] [--runs N] [--max-rounds N] [--keep]`;
`--from DIR/demo` prints the figures of a kept run's campaign directory (the `demo` folder
inside the directory `--keep` names) without running anything; its BENCH lines carry the load
of when they are printed, not of the run.
(`--max-rounds 3`: only the three fixed rounds, a short check that the bench works; the
goals are for the study as written.)
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from benchlib import emit, machine_line  # noqa: E402

STUDY = REPO / "examples" / "study-demo.toml"
BUSY_LOOP = "while True:\n    pass\n"


def study_copy(src: Path, dst: Path, max_rounds: int | None) -> Path:
    """The study file with its relative paths made absolute (it is read from `dst`), and
    [decide] max_rounds (and min_rounds, never above it) overridden when asked."""
    text = src.read_text(encoding="utf-8")

    def absolute(m: re.Match[str]) -> str:
        value = m.group(1)
        p = src.parent / value
        relative_path = not value.startswith("/") and ("/" in value or value.endswith(".json"))
        return f'"{p.resolve()}"' if relative_path and p.exists() else m.group(0)

    text = re.sub(r'"([^"\n]+)"', absolute, text)
    if max_rounds is not None:
        text = re.sub(r"(?m)^max_rounds\s*=\s*\d+", f"max_rounds = {max_rounds}", text)
        m = re.search(r"(?m)^min_rounds\s*=\s*(\d+)", text)
        if m and int(m.group(1)) > max_rounds:
            text = re.sub(r"(?m)^min_rounds\s*=\s*\d+", f"min_rounds = {max_rounds}", text)
    out = dst / src.name
    out.write_text(text, encoding="utf-8")
    return out


def run_validity(runs_csv: Path) -> tuple[int, int, list[str]]:
    """(valid runs, runs, one line per run) from the final analysis's verdicts."""
    import pandas as pd

    v = pd.read_csv(runs_csv, keep_default_na=False, na_values=[""])
    lines, n_valid = [], 0
    for rid, g in v.groupby("run_id", sort=False):
        ok = bool(g["valid"].astype(str).str.lower().eq("true").all())
        n_valid += ok
        req = g[g["phase"] == "request"]
        cv = float(req["cv"].iloc[0]) if len(req) and req["cv"].iloc[0] != "" else float("nan")
        reasons = "; ".join(f"{r.phase}: {r.reasons}" for r in g.itertuples()
                            if str(r.reasons) not in ("", "nan"))
        lines.append(f"  {g['config'].iloc[0]:<28} {str(rid)[:12]}  request CV {cv:.2%}  "
                     f"{'valid' if ok else 'INVALID: ' + reasons}")
    return n_valid, v["run_id"].nunique(), lines


def configs_validity(runs_csv: Path) -> tuple[int, int]:
    """(configurations with, for each of prefill, decode and request, a run whose phase is
    valid — not necessarily the same run —, configurations): the results table aggregates
    each phase over its own valid runs, so such a configuration has a figure in every phase."""
    import pandas as pd

    v = pd.read_csv(runs_csv, keep_default_na=False, na_values=[""])
    ok = v[v["valid"].astype(str).str.lower().eq("true")]
    phases = {"prefill", "decode", "request"}
    valid = sum(1 for _, g in ok.groupby("config") if phases <= set(g["phase"]))
    return valid, int(v["config"].nunique())


def gross_net_cv(repeats_csv: Path) -> dict[str, tuple[float, float]]:
    """run_id → (net CV, gross CV) of the request phase's J per generated token."""
    import numpy as np
    import pandas as pd

    r = pd.read_csv(repeats_csv)
    r = r[(r["scope"] == "all") & (r["phase"] == "request") & (r["unit"] == "generated")]
    out: dict[str, tuple[float, float]] = {}
    for rid, g in r.groupby("run_id"):
        cvs = []
        for basis in ("net", "gross"):
            x = g[g["basis"] == basis]["j_per_token"].to_numpy(np.float64)
            cvs.append(float(np.std(x, ddof=1) / np.mean(x)) if len(x) > 1 else float("nan"))
        out[str(rid)] = (cvs[0], cvs[1])
    return out


def undecided_without_count(decisions: Path) -> tuple[int | None, list[str]]:
    if not decisions.is_file():
        return None, []
    lines = [str(x) for x in json.loads(decisions.read_text())["lines"]]
    bad = [x for x in lines if "gives no round count" in x or "undecided so far" in x]
    return len(bad), lines


def console_figures(console: str) -> tuple[bool, bool]:
    """(the first answer is asked of a matched pair, the sizing is stated) from the demo's
    console (its last lines are the report's answers, host/campaign/console_answers.py)."""
    first = re.search(r"(?m)^\s+1\. \[([^\]]+)\]", console)
    asked = first is not None and first.group(1) != "cannot be answered from this study"
    stated = "sized to this machine" in console or "cannot fit:" in console
    return asked, stated


def decided_count(decisions: Path) -> int:
    """Comparisons the final decision left decided or equivalent."""
    if not decisions.is_file():
        return 0
    states = json.loads(decisions.read_text()).get("states", {})
    return int(states.get("decided", 0)) + int(states.get("equivalent", 0))


def report(out: Path, note: str) -> int:
    """Print a finished demo campaign's runs and decisions, and its BENCH lines."""
    n_valid, n_runs, lines = run_validity(out / "analysis" / "runs.csv")
    n_cfg_valid, n_cfg = configs_validity(out / "analysis" / "runs.csv")
    cvs = gross_net_cv(out / "analysis" / "repeats.csv")
    print(f"runs valid (every phase): {n_valid} of {n_runs}; configurations with a valid figure "
          f"in every phase: {n_cfg_valid} of {n_cfg}")
    for line in lines:
        rid = line.split()[1]
        match = [v for k, v in cvs.items() if k.startswith(rid)]
        extra = f"  [net CV {match[0][0]:.2%}, gross CV {match[0][1]:.2%}]" if match else ""
        print(line + extra)
    takes = sorted(str(p.relative_to(out)) for p in (out / "runs").glob("*/round*-take*")
                   if p.is_dir() and not p.name.endswith(".interrupted"))
    print(f"re-measures of refused runs ([decide] remeasure): {len(takes)}"
          + (f" ({', '.join(takes)})" if takes else ""))
    n_bad, dlines = undecided_without_count(out / "analysis" / "decisions.json")
    print("decisions:" if dlines else "decisions: none recorded (no [decide] in the study)")
    for x in dlines:
        print("  " + x)
    emit("demo-configs-valid-frac", round(n_cfg_valid / n_cfg, 4) if n_cfg else None, n_cfg,
         None, note)
    emit("demo-runs-valid-frac", round(n_valid / n_runs, 4) if n_runs else None, n_runs, None,
         note)
    emit("demo-undecided-without-round-count", n_bad, len(dlines), None, note)
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--busy-cores", type=int, default=1,
                    help="busy loops to start beside the demo (default 1)")
    ap.add_argument("--max-rounds", type=int, default=None,
                    help="override [decide] max_rounds (a short check; goals are for the study)")
    ap.add_argument("--keep", action="store_true", help="keep the campaign directory")
    ap.add_argument("--runs", type=int, default=1,
                    help="whole demos, each from a fresh campaign directory (default 1)")
    ap.add_argument("--from", dest="done", type=Path, default=None,
                    help="a kept run's campaign directory: print its figures, run nothing")
    args = ap.parse_args()
    if args.done is not None:
        return report(args.done, f"from {args.done}")
    if args.busy_cores < 0 or (args.max_rounds is not None and args.max_rounds < 3):
        ap.error("--busy-cores must be >= 0 and --max-rounds >= 3")
    if args.runs < 1:
        ap.error("--runs must be >= 1")
    rows = [one_demo(args, k) for k in range(args.runs)]
    done = [r for r in rows if r is not None]
    note = f"{args.busy_cores} busy core(s), {len(done)} of {args.runs} run(s) finished"
    if done:
        emit("demo-rq1-pair-frac", round(sum(r[1] for r in done) / len(done), 4), len(done),
             None, note)
        emit("demo-two-decided-frac", round(sum(r[2] >= 2 for r in done) / len(done), 4),
             len(done), None, note + "; decided per run: " + ", ".join(str(r[2]) for r in done))
        emit("demo-sizing-stated-frac", round(sum(r[3] for r in done) / len(done), 4),
             len(done), None, note)
        warm = [r[0] for r in done[1:]]
        if warm and args.busy_cores == 0:
            emit("demo-wall-s-warm", round(max(warm), 1), len(warm), None,
                 note + "; the slowest warm run")
    return 0 if len(done) == args.runs else 1


def one_demo(args: argparse.Namespace, k: int) -> tuple[float, bool, int, bool] | None:
    """One whole demo: (wall s, RQ1 asked of a pair, comparisons decided, sizing stated)."""

    work = Path(tempfile.mkdtemp(prefix="epi-bench-demo-"))
    out = work / "demo"
    study = study_copy(STUDY, work, args.max_rounds)
    busy = [subprocess.Popen([sys.executable, "-c", BUSY_LOOP]) for _ in range(args.busy_cores)]
    print(machine_line("bench_demo.py") + f"; {args.busy_cores} busy-loop process(es) "
          f"started by this bench (PIDs {[p.pid for p in busy]}), stopped at the end", flush=True)
    print(f"study: {STUDY}" + (f" with max_rounds = {args.max_rounds}" if args.max_rounds
                               else "") + f"; campaign directory {out}", flush=True)
    t0 = time.monotonic()
    try:
        proc = subprocess.run([sys.executable, "-m", "epi", "demo", "--out", str(out),
                               "--study", str(study)], cwd=REPO, capture_output=True, text=True)
    finally:
        for p in busy:
            p.kill()
            p.wait()
    wall_s = time.monotonic() - t0
    load = os.getloadavg()
    print(f"demo wall time {wall_s:.0f} s (exit {proc.returncode}); load average at the end "
          f"{load[0]:.2f} (1 min), {load[1]:.2f} (5 min), {load[2]:.2f} (15 min)")
    if proc.returncode != 0:
        print(proc.stdout[-3000:], proc.stderr[-3000:])
        return None
    note = f"{args.busy_cores} busy core(s), run {k + 1}" + (
        f"; max_rounds {args.max_rounds}" if args.max_rounds else "")
    emit("demo-wall-s", round(wall_s, 1), 1, None, note)
    report(out, note)
    console = proc.stdout + proc.stderr
    asked, stated = console_figures(console)
    n_decided = decided_count(out / "analysis" / "decisions.json")
    print(f"run {k + 1}: first answer asked of a matched pair: {asked}; comparisons decided "
          f"or equivalent: {n_decided}; sizing stated: {stated}")
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    else:
        (work / "demo-console.txt").write_text(console, encoding="utf-8")
        print(f"kept: {work} (the demo's console output in demo-console.txt)")
    return wall_s, asked, n_decided, stated


if __name__ == "__main__":
    raise SystemExit(main())
