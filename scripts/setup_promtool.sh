#!/usr/bin/env bash
# promtool, Prometheus's own lint, for tests/meter/test_metrics_lint.py (`promtool check
# metrics` on the meter's /metrics). Taken from Debian's prometheus package without installing
# it: `apt-get install prometheus` would also enable a Prometheus server listening on every
# interface, which a test machine has no use for. The binary goes to the git-ignored
# .fwtools/bin/ beside the firmware tools; a promtool already on PATH is used as it is.
# Usage: scripts/setup_promtool.sh
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
DEST="$ROOT/.fwtools/bin"
if command -v promtool >/dev/null 2>&1 || [[ -x "$DEST/promtool" ]]; then
    exit 0
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
if ! apt-get download -q prometheus >/dev/null 2>&1; then
    SUDO=""; [[ $(id -u) -ne 0 ]] && SUDO="sudo"
    $SUDO apt-get update -qq
    apt-get download -q prometheus >/dev/null
fi
dpkg-deb -x prometheus_*.deb root
mkdir -p "$DEST"
cp root/usr/bin/promtool "$DEST/promtool"
echo "[promtool] $("$DEST/promtool" --version 2>&1 | head -1) in $DEST" >&2
