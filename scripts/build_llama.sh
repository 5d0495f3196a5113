#!/usr/bin/env bash
# Build llama.cpp (libraries + llama-quantize, llama-perplexity, ggml-rpc-server) from the
# pinned llama-cpp-python sdist, portable (GGML_NATIVE=OFF) with RPC, into a cache directory
# that later runs on the same machine reuse. Then install the Python bindings alone from the
# same sdist into the given Python and put the freshly built libraries next to them, so
# `import llama_cpp` loads exactly this build (no LLAMA_CPP_LIB_PATH needed).
#
# usage: scripts/build_llama.sh PYTHON
set -euo pipefail

PY=${1:?usage: build_llama.sh PYTHON}
VERSION=0.3.36
CACHE=${EPI_HOME:-$HOME/.cache/epi}
FLAGS=(-DBUILD_SHARED_LIBS=ON -DGGML_NATIVE=OFF -DGGML_RPC=ON -DLLAMA_OPENSSL=OFF
       -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER=OFF
       -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=ON -DCMAKE_BUILD_TYPE=Release
       # RUNPATH relative to the binary: the libraries copied next to the bindings load each
       # other (one libggml, one device registry), never the build cache's copies.
       -DCMAKE_BUILD_WITH_INSTALL_RPATH=ON '-DCMAKE_INSTALL_RPATH=$ORIGIN:$ORIGIN/../lib')
TARGETS=(llama ggml-rpc-server llama-quantize llama-perplexity)
KEY=$(printf '%s ' "$VERSION" "${FLAGS[@]}" | sha256sum | cut -c1-12)
ROOT="$CACHE/llama.cpp/$VERSION-$KEY"
SDIST="$CACHE/dl/llama_cpp_python-$VERSION.tar.gz"
JOBS=${EPI_BUILD_JOBS:-$(nproc)}

log() { printf '[build-llama] %s\n' "$*" >&2; }

if [ ! -f "$SDIST" ]; then
  log "downloading llama-cpp-python==$VERSION source (about 77 MB)"
  mkdir -p "$CACHE/dl"
  "$PY" -m pip download --quiet --no-deps --no-binary :all: "llama-cpp-python==$VERSION" -d "$CACHE/dl.tmp"
  mv "$CACHE/dl.tmp/llama_cpp_python-$VERSION.tar.gz" "$SDIST"
  rm -rf "$CACHE/dl.tmp"
fi

if [ ! -f "$ROOT/.built" ]; then
  log "building llama.cpp $VERSION (GGML_NATIVE=OFF, GGML_RPC=ON) in $ROOT — about 7 min on 2 cores"
  rm -rf "$ROOT"
  mkdir -p "$ROOT"
  tar -xzf "$SDIST" -C "$ROOT"
  SRC="$ROOT/llama_cpp_python-$VERSION"
  start=$(date +%s)
  cmake -S "$SRC/vendor/llama.cpp" -B "$ROOT/build" "${FLAGS[@]}" >"$ROOT/configure.log" 2>&1 \
    || { tail -30 "$ROOT/configure.log" >&2; exit 1; }
  cmake --build "$ROOT/build" -j "$JOBS" --target "${TARGETS[@]}" >"$ROOT/build.log" 2>&1 \
    || { tail -40 "$ROOT/build.log" >&2; exit 1; }
  printf '%s\n' "${FLAGS[@]}" >"$ROOT/flags.txt"
  touch "$ROOT/.built"
  log "built in $(( $(date +%s) - start )) s"
fi

SRC="$ROOT/llama_cpp_python-$VERSION"
SITE=$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
if [ ! -f "$SITE/llama_cpp/.epi-build-$KEY" ]; then
  log "installing llama-cpp-python $VERSION bindings against the cached build"
  CMAKE_ARGS="-DLLAMA_BUILD=OFF -DLLAVA_BUILD=OFF -DMTMD_BUILD=OFF" \
    "$PY" -m pip install --quiet --no-cache-dir --force-reinstall "$SRC"
  mkdir -p "$SITE/llama_cpp/lib"
  # -P keeps the soname symlinks: one real copy of each library, one ggml device registry.
  find "$ROOT/build/bin" -maxdepth 1 -name 'lib*.so*' -exec cp -P {} "$SITE/llama_cpp/lib/" \;
  mkdir -p "$SITE/llama_cpp/bin"
  for t in llama-quantize llama-perplexity ggml-rpc-server; do
    cp "$ROOT/build/bin/$t" "$SITE/llama_cpp/bin/$t"
  done
  # llama.cpp's vocab-only GGUFs: real tokenizers for generated test models.
  mkdir -p "$SITE/llama_cpp/vocab"
  cp "$SRC/vendor/llama.cpp/models/ggml-vocab-llama-spm.gguf" "$SITE/llama_cpp/vocab/"
  printf '%s\n' "${FLAGS[@]}" >"$SITE/llama_cpp/.epi-build-flags"
  touch "$SITE/llama_cpp/.epi-build-$KEY"
fi
log "llama.cpp ready: $SITE/llama_cpp"
