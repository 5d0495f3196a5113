#!/usr/bin/env bash
# Run the test suite; "no tests collected" (pytest exit 5) is a failure, never a pass.
#
# With pytest-xdist installed (the dev extra) the suite runs on $EPI_TEST_WORKERS workers
# (default 2); EPI_TEST_WORKERS=0 runs everything in one serial pass, as without xdist.
set -uo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
workers=${EPI_TEST_WORKERS:-2}
case $workers in
  ''|*[!0-9]*) echo "EPI_TEST_WORKERS must be a whole number, got '$workers'" >&2; exit 2 ;;
esac
"$VENV/bin/ruff" check . || { echo "ruff found problems" >&2; exit 1; }
# the whole library (epi/, meter/, host/) at the strictness in pyproject.toml [tool.mypy]
"$VENV/bin/mypy" || { echo "mypy found problems" >&2; exit 1; }

if [ "$workers" -gt 1 ] && ! "$VENV/bin/python" -c "import xdist" 2>/dev/null; then
  echo "pytest-xdist is not installed: one serial pass" >&2
  workers=0
fi
if [ "$workers" -le 1 ]; then
  "$VENV/bin/python" -m pytest "$@"
  rc=$?
  if [ "$rc" -eq 5 ]; then
    echo "pytest collected no tests: treating as failure" >&2
    exit 1
  fi
  exit "$rc"
fi

# One xdist session over the whole suite: every test holds a lock on the CPUs
# (tests/conftest.py, _CpuShare), shared by default, exclusive for the `serial` tests
# (timing-sensitive) and the `slow` ones not marked `shares_cpu`, so those run with no other
# test beside them while the rest run two at a time. --dist loadfile keeps a file's tests on
# one worker, so the module fixtures of a file whose tests share one mode live under one hold;
# the files go out in the order tests/conftest.py gives them (the exclusive ones first,
# _cpu_lock_order), not pytest-xdist's own (most tests first).
lockdir=$(mktemp -d "${TMPDIR:-/tmp}/epi-cpu-lock.XXXXXX")
trap 'rm -rf "$lockdir"' EXIT
EPI_TEST_CPU_LOCK=$lockdir "$VENV/bin/python" -m pytest -n "$workers" --dist loadfile \
  --no-loadscope-reorder "$@"
rc=$?
if [ "$rc" -eq 5 ]; then
  echo "pytest collected no tests: treating as failure" >&2
  exit 1
fi
exit "$rc"
