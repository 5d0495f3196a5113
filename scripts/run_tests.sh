#!/usr/bin/env bash
# Run the test suite; "no tests collected" (pytest exit 5) is a failure, never a pass.
#
# With pytest-xdist installed (the dev extra) the suite runs in two passes (issue 33): the
# tests that may share the CPUs on $EPI_TEST_WORKERS workers (default 2), then, one at a time,
# the `slow` ones (real model, campaigns, subprocess daemons: they use both cores themselves)
# and the `serial` ones (timing-sensitive: they must not share the CPUs with another test).
# EPI_TEST_WORKERS=0 runs everything in one serial pass, as without xdist. A `-m EXPR` given
# here narrows both passes (`make test-fast` passes -m "not slow").
set -uo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
"$VENV/bin/ruff" check . || { echo "ruff found problems" >&2; exit 1; }
# the whole library (epi/, meter/, host/) at the strictness in pyproject.toml [tool.mypy]
"$VENV/bin/mypy" || { echo "mypy found problems" >&2; exit 1; }

workers=${EPI_TEST_WORKERS:-2}
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

# split off the caller's -m expression so that each pass can narrow it
marks="" args=()
while [ $# -gt 0 ]; do
  case "$1" in
    -m) marks=$2; shift 2 ;;
    -m*) marks=${1#-m}; shift ;;
    *) args+=("$1"); shift ;;
  esac
done
both() { if [ -n "$marks" ]; then echo "($marks) and ($1)"; else echo "$1"; fi; }

"$VENV/bin/python" -m pytest -n "$workers" -m "$(both "not slow and not serial")" \
  ${args[@]+"${args[@]}"}
rc1=$?
"$VENV/bin/python" -m pytest -p no:xdist -m "$(both "slow or serial")" ${args[@]+"${args[@]}"}
rc2=$?
if [ "$rc1" -eq 5 ] && [ "$rc2" -eq 5 ]; then
  echo "pytest collected no tests: treating as failure" >&2
  exit 1
fi
for rc in "$rc1" "$rc2"; do
  if [ "$rc" -ne 0 ] && [ "$rc" -ne 5 ]; then
    exit "$rc"
  fi
done
exit 0
