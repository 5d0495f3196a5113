"""Mutation testing: small wrong changes to the code, each run against the tests that cover it.

Each mutant is one AST change in one module of the packages below: an arithmetic operator
swapped (+ −, * /, // /, % *), a comparison flipped or its boundary moved (< ≤, > ≥, == ≠,
is / is not, in / not in), `and` ↔ `or`, a `not` dropped, a numeric constant changed
(0 → 1, 1 → 0 or 2, n → n + 1), `round` ↔ `int`, `min` ↔ `max`. A seeded random sample of
all the candidate sites is drawn, spread evenly over the packages. For each mutant the module
is rewritten in place (ast.unparse: formatting and comments differ, behaviour only by the
mutation), the fast tests of the test files that import the module are run (pytest -x, one
process, per-mutant timeout), and the original file is put back whatever happens.

A mutant is *killed* when the tests fail (or time out), *survived* when they pass. The kill
rate is killed / (killed + survived); mutants whose module has no covering test file are
counted apart ("no tests"), as are modules whose tests fail unmutated (not sampled).

    python scripts/mutate.py --n 60 --seed 1           # what `make mutate` runs
    python scripts/mutate.py --list                     # the candidate sites per module
    python scripts/mutate.py --only 'host/analysis/results.py:17'   # rerun chosen mutants

Results: out/mutate/results.json and a table on stdout (the survivors with their diff).
"""

from __future__ import annotations

import argparse
import ast
import difflib
import json
import os
import random
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from functools import cache, lru_cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("host/analysis", "host/accuracy", "meter/chip", "epi/formats")
TEST_ROOT = ROOT / "tests"
#: test files kept for mutants an earlier run saw survive: run first within the file cap
MUTANT_TESTS = ("test_caught_changes", "test_mutation_survivors", "test_chip_mutation_survivors")

BINOP_SWAP: dict[type[ast.operator], type[ast.operator]] = {
    ast.Add: ast.Sub, ast.Sub: ast.Add, ast.Mult: ast.Div, ast.Div: ast.Mult,
    ast.FloorDiv: ast.Div, ast.Mod: ast.Mult, ast.Pow: ast.Mult,
    ast.LShift: ast.RShift, ast.RShift: ast.LShift, ast.BitAnd: ast.BitOr, ast.BitOr: ast.BitAnd,
}
CMP_SWAP: dict[type[ast.cmpop], type[ast.cmpop]] = {
    ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt, ast.Eq: ast.NotEq,
    ast.NotEq: ast.Eq, ast.Is: ast.IsNot, ast.IsNot: ast.Is, ast.In: ast.NotIn,
    ast.NotIn: ast.In,
}
CALL_SWAP = {"round": "int", "int": "round", "min": "max", "max": "min"}


@dataclass(frozen=True)
class Site:
    """One candidate mutation: the k-th mutable node (in ast.walk order) of a module."""

    path: str  # relative to the repository root
    index: int
    line: int
    what: str

    @property
    def key(self) -> str:
        return f"{self.path}:{self.index}"


@dataclass
class Outcome:
    key: str
    line: int
    what: str
    status: str  # killed | survived | timeout | no tests
    seconds: float
    tests: list[str]
    failed: str
    diff: str


def _annotation_nodes(tree: ast.AST) -> set[int]:
    """ids of every node inside an annotation (not behaviour: never mutated)."""
    out: set[int] = set()
    for node in ast.walk(tree):
        anns: list[ast.AST | None] = []
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            anns.append(node.returns)
            a = node.args
            anns += [x.annotation for x in (*a.posonlyargs, *a.args, *a.kwonlyargs)]
            anns += [a.vararg.annotation if a.vararg else None,
                     a.kwarg.annotation if a.kwarg else None]
        elif isinstance(node, ast.AnnAssign):
            anns.append(node.annotation)
        for ann in anns:
            if ann is not None:
                out |= {id(n) for n in ast.walk(ann)}
    return out


def _mutation(node: ast.AST) -> tuple[str, Callable[[ast.AST], None]] | None:
    """(description, in-place change) for a mutable node, else None."""
    if isinstance(node, ast.BinOp) and type(node.op) in BINOP_SWAP:
        new = BINOP_SWAP[type(node.op)]
        return (f"{type(node.op).__name__} -> {new.__name__}",
                lambda n: setattr(n, "op", new()))
    if isinstance(node, ast.AugAssign) and type(node.op) in BINOP_SWAP:
        new = BINOP_SWAP[type(node.op)]
        return (f"{type(node.op).__name__}= -> {new.__name__}=",
                lambda n: setattr(n, "op", new()))
    if isinstance(node, ast.Compare) and type(node.ops[0]) in CMP_SWAP:
        new_c = CMP_SWAP[type(node.ops[0])]
        return (f"{type(node.ops[0]).__name__} -> {new_c.__name__}",
                lambda n: n.ops.__setitem__(0, new_c()))  # type: ignore[attr-defined]
    if isinstance(node, ast.BoolOp):
        new_b: type[ast.boolop] = ast.Or if isinstance(node.op, ast.And) else ast.And
        return (f"{type(node.op).__name__} -> {new_b.__name__}",
                lambda n: setattr(n, "op", new_b()))
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        return "drop not", lambda n: setattr(n, "op", ast.UAdd())
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        v = node.value
        new_v = 1 if v == 0 else (0 if v == 1 else v + 1)
        if isinstance(v, float):
            new_v = float(new_v)
        return f"constant {v!r} -> {new_v!r}", lambda n: setattr(n, "value", new_v)
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
            and node.func.id in CALL_SWAP):
        name = CALL_SWAP[node.func.id]
        return f"{node.func.id}() -> {name}()", lambda n: setattr(n.func, "id", name)  # type: ignore[attr-defined]
    return None


def _mutable_nodes(tree: ast.AST) -> Iterator[tuple[ast.AST, str]]:
    skip = _annotation_nodes(tree)
    # docstrings and the `from __future__` line are never mutated (constants there are text)
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        m = _mutation(node)
        if m is not None:
            yield node, m[0]


def sites(path: str) -> list[Site]:
    tree = ast.parse((ROOT / path).read_text(), path)
    return [Site(path, k, getattr(node, "lineno", 0), what)
            for k, (node, what) in enumerate(_mutable_nodes(tree))]


def mutated_source(site: Site) -> str:
    tree = ast.parse((ROOT / site.path).read_text(), site.path)
    for k, (node, _) in enumerate(_mutable_nodes(tree)):
        if k == site.index:
            m = _mutation(node)
            assert m is not None
            m[1](node)
            return ast.unparse(ast.fix_missing_locations(tree)) + "\n"
    raise ValueError(f"{site.key}: no such mutation site")


def modules(packages: tuple[str, ...] = PACKAGES) -> list[str]:
    out = []
    for pkg in packages:
        for p in sorted((ROOT / pkg).glob("*.py")):
            if p.name != "__init__.py":
                out.append(p.relative_to(ROOT).as_posix())
    return out


def _importers_pattern(path: str) -> re.Pattern[str]:
    dotted = path[:-3].replace("/", ".")
    pkg, mod = dotted.rsplit(".", 1)
    return re.compile(rf"\b{re.escape(dotted)}\b|from {re.escape(pkg)} import [^\n]*\b{mod}\b"
                      rf"|from {re.escape(pkg)} import \([^)]*\b{mod}\b")


@lru_cache(maxsize=1)
def _test_files() -> list[Path]:
    return sorted(TEST_ROOT.rglob("test_*.py"))


@cache
def _direct_tests(path: str) -> list[str]:
    pat = _importers_pattern(path)
    return [t.relative_to(ROOT).as_posix() for t in _test_files()
            if pat.search(t.read_text(errors="replace"))]


@cache
def covering_tests(path: str, limit: int = 8) -> list[str]:
    """Test files that import the module (by dotted name or `from pkg import mod`), then
    those of the library modules that import it (a module reached only through another,
    such as a checker its protocol calls), and the tests written against earlier survivors
    that import the module's package (they reach a module through a driver or a protocol two
    imports away, as the register-wrap test reaches meter/chip/energy_account.py); at most
    `limit` files."""
    mod = Path(path).stem
    found = list(_direct_tests(path))  # a copy: the cached list stays as it was
    pkg = re.escape(path.rsplit("/", 1)[0].replace("/", "."))
    found += [t.relative_to(ROOT).as_posix() for t in _test_files()
              if t.stem in MUTANT_TESTS and re.search(rf"\b{pkg}\b", t.read_text())]
    pat = _importers_pattern(path)
    for lib in sorted(p for pkg in ("epi", "host", "meter") for p in (ROOT / pkg).rglob("*.py")):
        rel = lib.relative_to(ROOT).as_posix()
        if rel != path and pat.search(lib.read_text(errors="replace")):
            found += [t for t in _direct_tests(rel) if t not in found]
    # first the tests written against mutants (they name the module's edge cases), then the
    # one named after the module, then the rest in path order
    found = sorted(dict.fromkeys(found), key=lambda t: (Path(t).stem not in MUTANT_TESTS,
                                                        mod not in Path(t).stem))
    return found[:limit]  # a list shared by the cache: callers do not change it


def run_tests(tests: list[str], timeout_s: float) -> tuple[str, float, str]:
    """('pass' | 'fail' | 'timeout', seconds, first failure line)."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), PYTHONDONTWRITEBYTECODE="1")
    cmd = [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider",
           "-m", "not slow", *tests]
    t0 = time.monotonic()
    try:
        r = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True,
                           timeout=timeout_s, start_new_session=True)
    except subprocess.TimeoutExpired:
        return "timeout", time.monotonic() - t0, ""
    dt = time.monotonic() - t0
    first = next((x for x in r.stdout.splitlines() if x.startswith(("FAILED", "ERROR"))), "")
    if r.returncode == 5:
        return "no tests", dt, ""
    return ("pass" if r.returncode == 0 else "fail"), dt, first


def sample(all_sites: dict[str, list[Site]], n: int, seed: int) -> list[Site]:
    """n sites, drawn per package in turn (seeded), so each package gets about n / 4."""
    rng = random.Random(seed)
    by_pkg: dict[str, list[Site]] = {}
    for path, ss in all_sites.items():
        by_pkg.setdefault(path.rsplit("/", 1)[0], []).extend(ss)
    for ss in by_pkg.values():
        rng.shuffle(ss)
    picked: list[Site] = []
    pools = [by_pkg[p] for p in sorted(by_pkg)]
    while len(picked) < n and any(pools):
        for pool in pools:
            if pool and len(picked) < n:
                picked.append(pool.pop())
    return picked


def run_mutant(site: Site, tests: list[str], timeout_s: float) -> Outcome:
    target = ROOT / site.path
    original = target.read_text()
    src = mutated_source(site)
    diff = "".join(difflib.unified_diff(
        ast.unparse(ast.parse(original)).splitlines(True), src.splitlines(True), n=0))
    diff = "\n".join(x for x in diff.splitlines() if x[:1] in "+-" and x[:3] not in ("+++", "---"))
    if not tests:
        return Outcome(site.key, site.line, site.what, "no tests", 0.0, [], "", diff)
    try:
        target.write_text(src)
        res, dt, first = run_tests(tests, timeout_s)
    finally:
        target.write_text(original)
    status = {"pass": "survived", "fail": "killed", "timeout": "timeout"}.get(res, res)
    return Outcome(site.key, site.line, site.what, status, dt, tests, first, diff)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=60, help="mutants to sample (default 60)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--timeout", type=float, default=240.0, help="per mutant, seconds")
    ap.add_argument("--max-tests", type=int, default=8,
                    help="covering test files run per mutant (default 8)")
    ap.add_argument("--packages", nargs="*", default=list(PACKAGES))
    ap.add_argument("--only", nargs="*", default=None, help="mutant keys PATH:INDEX to run")
    ap.add_argument("--list", action="store_true", help="list the candidate sites and stop")
    ap.add_argument("--out", default=str(ROOT / "out" / "mutate" / "results.json"))
    a = ap.parse_args(argv)
    all_sites = {m: sites(m) for m in modules(tuple(a.packages))}
    if a.list:
        for m, ss in all_sites.items():
            print(f"{m}: {len(ss)} sites, tests: {len(covering_tests(m, a.max_tests))} files")
        print(f"total {sum(len(s) for s in all_sites.values())} sites")
        return 0
    if a.only:
        index = {s.key: s for ss in all_sites.values() for s in ss}
        unknown = [k for k in a.only if k not in index]
        if unknown:
            print(f"--only: no such mutant(s): {', '.join(unknown)}", file=sys.stderr)
            return 2
        picked = [index[k] for k in a.only]
    else:
        picked = sample(all_sites, a.n, a.seed)
    outcomes: list[Outcome] = []
    baseline: dict[str, bool] = {}
    t_all = time.monotonic()
    for i, site in enumerate(picked, 1):
        tests = covering_tests(site.path, a.max_tests)
        if tests and site.path not in baseline:
            res, _, first = run_tests(tests, a.timeout)
            baseline[site.path] = res == "pass"
            if res != "pass":
                print(f"  baseline of {site.path} does not pass ({res}: {first}); its mutants "
                      "are not counted", flush=True)
        if tests and not baseline[site.path]:
            continue
        o = run_mutant(site, tests, a.timeout)
        outcomes.append(o)
        print(f"[{i}/{len(picked)}] {o.status:8s} {o.seconds:6.1f}s {o.key} (line {o.line}: "
              f"{o.what})", flush=True)
    counted = [o for o in outcomes if o.status in ("killed", "survived", "timeout")]
    killed = [o for o in counted if o.status != "survived"]
    rate = len(killed) / len(counted) if counted else float("nan")
    summary = {"seed": a.seed, "max_tests": a.max_tests, "n_sampled": len(picked),
               "n_counted": len(counted),
               "killed": len(killed), "survived": len(counted) - len(killed),
               "no_tests": sum(o.status == "no tests" for o in outcomes),
               "kill_rate": rate, "minutes": (time.monotonic() - t_all) / 60,
               "baseline_failing": sorted(p for p, ok in baseline.items() if not ok),
               "mutants": [asdict(o) for o in outcomes]}
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(summary, indent=1))
    print(f"\nkill rate {len(killed)}/{len(counted)} = {rate:.1%} "
          f"({summary['no_tests']} without tests; {summary['minutes']:.1f} min); {out}")
    for o in outcomes:
        if o.status == "survived":
            print(f"\nSURVIVED {o.key} line {o.line}: {o.what}\n{o.diff}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
