"""`make bench`: run every bench/bench_*.py, then print one table of all figures.

Each bench's own output streams through unchanged; its `BENCH {json}` lines (the contract in
bench/goals.py) are collected. The table has one row per figure: figure, goal, measured
(median, spread over the runs, number of runs), verdict (met / missed / n/a), and the load
average the bench measured it under (`start→end`: at the bench's start and when it printed the
figure; "?" when its line gave none). The
verdict of a
figure in bench/goals.py is recomputed here with `goals.met` (a bench's own `met` is ignored),
so no threshold lives anywhere but bench/goals.py. A goal in
bench/goals.py that no bench reported is shown as missing, a bench that printed no BENCH line
as "no figures", and a bench that failed as failed (exit status non-zero at the end).

    python bench/run_all.py [--only NAME ...] [--pass-args NAME='--n 8' ...]
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from benchlib import machine_line  # noqa: E402
from goals import GOALS, met  # noqa: E402


def parse_bench_lines(text: str) -> list[dict[str, Any]]:
    """The BENCH objects in `text`; a malformed line becomes an entry with an error."""
    out = []
    for line in text.splitlines():
        if not line.startswith("BENCH "):
            continue
        try:
            obj = json.loads(line[6:])
        except ValueError as exc:
            out.append({"figure": "?", "error": f"malformed BENCH line ({exc})"})
            continue
        if not isinstance(obj, dict) or "figure" not in obj:
            out.append({"figure": "?", "error": "BENCH line without a figure"})
            continue
        out.append(obj)
    return out


def run_bench(script: Path, extra: list[str]) -> tuple[int, list[dict[str, Any]]]:
    """Run one bench, echo its output as it comes, return (exit status, BENCH objects)."""
    proc = subprocess.Popen([sys.executable, str(script), *extra], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, errors="replace")
    assert proc.stdout is not None
    lines = []
    for line in proc.stdout:
        sys.stdout.write(line)
        sys.stdout.flush()
        lines.append(line)
    return proc.wait(), parse_bench_lines("".join(lines))


def _fmt(x: Any) -> str:
    if isinstance(x, float):
        return f"{x:.4g}"
    return "-" if x is None else str(x)


def _number(x: Any) -> float | None:
    """`x` as a float when it is a real number (not a bool), else None."""
    if isinstance(x, bool) or not isinstance(x, int | float):
        return None
    return float(x)


def spread_text(spread: Any) -> str:
    """A spread in any form a bench may print: [low, high] (the contract), a list of values
    (their min-max), a dict of values (per channel, say: their min-max), or one number (±)."""
    if spread is None:
        return ""
    if isinstance(spread, dict):
        spread = list(spread.values())
    if isinstance(spread, list | tuple):
        nums = [v for v in (_number(x) for x in spread) if v is not None]
        if not nums:
            return ""
        low, high = min(nums), max(nums)
        sep = " to " if low < 0 or high < 0 else "-"  # [-0.4 to 0.5], not [-0.4-0.5]
        return f" [{_fmt(low)}{sep}{_fmt(high)}]"
    num = _number(spread)
    if num is not None:
        return f" ±{_fmt(num)}"
    return f" [{spread}]"


def measured_text(obj: dict[str, Any]) -> str:
    """`median [lo-hi] unit (n runs)`."""
    if obj.get("error"):
        return obj["error"]
    text = _fmt(obj.get("measured")) + spread_text(obj.get("spread"))
    if obj.get("unit"):
        text += f" {obj['unit']}"
    if obj.get("runs") is not None:
        text += f" ({obj['runs']} run{'' if obj['runs'] == 1 else 's'})"
    return text


def verdict(obj: dict[str, Any]) -> str:
    """met / missed / n/a: from bench/goals.py for a figure there (the bench's own `met` is
    not trusted), from the line's `met` only for a figure without a goal."""
    if obj.get("error"):
        return "error"
    key = obj.get("figure")
    ok = met(key, _number(obj.get("measured"))) if key in GOALS else obj.get("met")
    return {True: "met", False: "missed"}.get(ok, "n/a")


def goal_text(key: str) -> str:
    g = GOALS[key]
    return f"{g.get('op', '')} {g['goal']}".strip()


def load_text(obj: dict[str, Any]) -> str:
    """The 1-minute load average a figure was measured under: `start→end` (the bench's start,
    its line's `load_avg_1m_start`, and when the figure was printed, which includes the bench's
    own threads), the end alone for a line without a start, "?" for a line with neither: a
    timing read without its machine's load is no figure."""
    start, end = _number(obj.get("load_avg_1m_start")), _number(obj.get("load_avg_1m"))
    if end is None:
        return "?" if start is None else f"{start:.2f}→?"
    return f"{end:.2f}" if start is None else f"{start:.2f}→{end:.2f}"


def table_rows(results: dict[str, tuple[int, list[dict[str, Any]]]]) -> list[list[str]]:
    """Rows figure | goal | measured | verdict | load | source, goals without a figure as
    missing."""
    rows: list[list[str]] = []
    seen: set[str] = set()
    for name, (rc, objs) in results.items():
        if not objs:
            rows.append([f"({name})", "-", "no figures" if rc == 0 else f"failed (exit {rc})",
                         "-" if rc == 0 else "failed", "-", name])
        for obj in objs:
            key = str(obj.get("figure"))
            seen.add(key)
            goal = goal_text(key) if key in GOALS else obj.get("goal")
            rows.append([key, _fmt(goal), measured_text(obj), verdict(obj), load_text(obj),
                         name])
        if rc != 0 and objs:
            rows.append([f"({name})", "-", f"failed (exit {rc})", "failed", "-", name])
    for key in GOALS:
        if key not in seen:
            rows.append([key, goal_text(key), "missing", "missing", "-", "-"])
    return rows


def render(rows: list[list[str]]) -> str:
    head = ["figure", "goal", "measured (median [spread] unit (runs))", "verdict",
            "load 1m start→end", "bench"]
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    line = "  ".join("-" * w for w in widths)
    out = ["  ".join(h.ljust(w) for h, w in zip(head, widths, strict=True)), line]
    out += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    return "\n".join(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", nargs="*", default=None, help="bench names (e.g. bench_align)")
    ap.add_argument("--pass-args", action="append", default=[], metavar="NAME=ARGS",
                    help="extra arguments for one bench, e.g. bench_align='--samples 1e7'")
    args = ap.parse_args()
    extra: dict[str, list[str]] = {}
    for item in args.pass_args:
        name, _, rest = item.partition("=")
        extra[name] = shlex.split(rest)
    print(machine_line("make bench"), flush=True)
    results: dict[str, tuple[int, list[dict[str, Any]]]] = {}
    for script in sorted(HERE.glob("bench_*.py")):
        if args.only and script.stem not in args.only:
            continue
        print(f"== {script.relative_to(HERE.parent)}", flush=True)
        results[script.stem] = run_bench(script, extra.get(script.stem, []))
    rows = table_rows(results)
    print()
    print(render(rows))
    failed = any(rc != 0 for rc, _ in results.values())
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
