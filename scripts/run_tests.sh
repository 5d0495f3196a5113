#!/usr/bin/env bash
# Run the test suite; "no tests collected" (pytest exit 5) is a failure, never a pass.
set -uo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
"$VENV/bin/ruff" check . || { echo "ruff found problems" >&2; exit 1; }
# the whole library (epi/, meter/, host/) at the strictness in pyproject.toml [tool.mypy]
"$VENV/bin/mypy" || { echo "mypy found problems" >&2; exit 1; }
"$VENV/bin/python" -m pytest "$@"
rc=$?
if [ "$rc" -eq 5 ]; then
  echo "pytest collected no tests: treating as failure" >&2
  exit 1
fi
exit "$rc"
