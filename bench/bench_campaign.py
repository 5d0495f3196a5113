"""What a campaign adds per run, and how long the report takes to render.

Side by side in one process tree, on the 8-layer test model (no quantization, no accuracy,
thermal wait 0, the emulated meter daemon):

- direct: `python -m epi run MODEL --meter URL ...` N times, wall time of each invocation;
- campaign: a study with the same run settings, one configuration (the base model) × N rounds;
  each run step's wall time from the journal (`started` → `done`, which includes the spec, the
  new process session, the result file and the fsynced journal lines).

The overhead per run is median(campaign step) − median(direct run). The same campaign's
analysis is then rendered by `epi report` R times (figures PNG + SVG, HTML, Markdown).

Usage: `python bench/bench_campaign.py [--rounds 4] [--renders 3]`
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from benchlib import emit, machine_line  # noqa: E402


def study_text(model: Path, rounds: int) -> str:
    return f"""
[study]
name = "bench"
repeats = {rounds}
out = "camp"

[[models]]
name = "tiny"
path = "{model}"
include_base = true

[run]
tokens = 8
repeats_per_run = 2
warmups = 0
threads = 1
idle_s = 0.5
cooldown_s = 0

[meter]
emulate = true

[thermal]
rule = "fixed"
wait_s = 0
"""


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--renders", type=int, default=3)
    args = ap.parse_args()
    print(machine_line("bench_campaign.py"), flush=True)
    from host.campaign.journal import Journal
    from host.campaign.meter import emulated_daemon
    from host.quant.tiny_model import write_test_model

    tmp = Path(tempfile.mkdtemp(prefix="epi-bench-campaign-"))
    model = write_test_model(tmp / "tiny.gguf")
    study = tmp / "study.toml"
    study.write_text(study_text(model, args.rounds))

    # campaign first (it starts and stops its own daemon)
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "epi", "campaign", str(study)], cwd=REPO,
                          capture_output=True, text=True)
    if proc.returncode != 0:
        print(proc.stdout[-2000:], proc.stderr[-2000:])
        return 1
    print(f"campaign of {args.rounds} runs + analysis + report: "
          f"{time.perf_counter() - t0:.1f} s")
    started: dict[str, int] = {}
    camp_s = []
    for line in Journal(tmp / "camp").path.read_text().splitlines():
        ev = json.loads(line)
        if str(ev.get("step", "")).startswith("run:"):
            if ev["event"] == "started":
                started[ev["step"]] = ev["t_real_ns"]
            elif ev["event"] == "done":
                camp_s.append((ev["t_real_ns"] - started[ev["step"]]) / 1e9)

    # direct `epi run`s with the same settings against an emulated daemon
    direct_s = []
    with emulated_daemon(tmp, tmp / "trace-direct", None) as url:
        for k in range(args.rounds):
            argv = [sys.executable, "-m", "epi", "run", str(model), "--out",
                    str(tmp / f"direct{k}"), "--tokens", "8", "--repeats", "2", "--warmups",
                    "0", "--threads", "1", "--idle-s", "0.5", "--cooldown-s", "0",
                    "--seed", "0", "--meter", url]
            t = time.perf_counter()
            r = subprocess.run(argv, cwd=REPO, capture_output=True, text=True)
            direct_s.append(time.perf_counter() - t)
            if r.returncode != 0:
                print(r.stderr[-2000:])
                return 1
    c, d = statistics.median(camp_s), statistics.median(direct_s)
    print(f"run step in a campaign: median {c:.2f} s over {len(camp_s)} "
          f"({', '.join(f'{x:.2f}' for x in camp_s)})")
    print(f"direct `epi run`:       median {d:.2f} s over {len(direct_s)} "
          f"({', '.join(f'{x:.2f}' for x in direct_s)})")
    print(f"overhead per run: {c - d:+.2f} s ({(c - d) / d:+.1%})")
    # spread: the widest difference of one campaign step and one direct run, each way
    emit("campaign-overhead-per-run-s", round(c - d, 3), len(camp_s),
         [round(min(camp_s) - max(direct_s), 3), round(max(camp_s) - min(direct_s), 3)],
         f"median of {len(camp_s)} campaign run steps - median of {len(direct_s)} direct "
         "`epi run`s; spread = min step - max direct .. max step - min direct")

    from host.report.build import write_report

    renders = []
    for k in range(args.renders):
        t = time.perf_counter()
        write_report(tmp / "camp" / "analysis", tmp / f"report{k}")
        renders.append(time.perf_counter() - t)
    m = statistics.median(renders)
    print(f"report render: median {m:.2f} s over {len(renders)} "
          f"({', '.join(f'{x:.2f}' for x in renders)})")
    emit("report-render-s", round(m, 3), len(renders),
         [round(min(renders), 3), round(max(renders), 3)], "median of repeated renders")
    return 0


if __name__ == "__main__":
    sys.exit(main())
