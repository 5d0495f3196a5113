#!/usr/bin/env bash
# Build llama.cpp (libraries + llama-quantize, llama-perplexity, ggml-rpc-server) from the
# pinned llama-cpp-python sdist, portable (GGML_NATIVE=OFF) with RPC, into a cache directory
# that later runs on the same machine reuse. Then install the Python bindings alone from the
# same sdist into the given Python and put the freshly built libraries next to them, so
# `import llama_cpp` loads exactly this build (no LLAMA_CPP_LIB_PATH needed).
#
# CPU flags per architecture (`arch_flags`, chosen from `uname -m`; EPI_MACHINE overrides the
# machine name, for tests and cross builds):
#   x86_64   GGML_NATIVE=OFF: llama.cpp still enables AVX/AVX2/FMA/F16C/BMI2, and stays off the
#            AMX path that crashed on quantized models; portable to any x86-64-v3 machine.
#   aarch64  GGML_NATIVE=OFF + GGML_CPU_ARM_ARCH=armv8.2-a+dotprod+fp16: the Raspberry Pi 5's
#            Cortex-A76 (dot product and fp16 arithmetic, which the quantized kernels use);
#            without it llama.cpp compiles for baseline armv8-a. EPI_LLAMA_ARM_ARCH=native
#            builds for the build machine's own CPU (GGML_NATIVE=ON) instead.
#   other    GGML_NATIVE=OFF (llama.cpp's portable default).
# EPI_LLAMA_CUDA=1 adds -DGGML_CUDA=ON (needs the CUDA toolkit's nvcc): a GPU host built this
# way serves as an accuracy scoring worker (docs/accuracy.md, "A GPU host as a worker").
# The flags are part of the cache key, so every variant has its own build directory.
#
# usage: scripts/build_llama.sh PYTHON
#        scripts/build_llama.sh --print-flags   (the machine name, cache key and flags; no build)
set -euo pipefail

VERSION=0.3.36
CACHE=${EPI_HOME:-$HOME/.cache/epi}
COMMON=(-DBUILD_SHARED_LIBS=ON -DGGML_RPC=ON -DLLAMA_OPENSSL=OFF
       -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER=OFF
       -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=ON -DCMAKE_BUILD_TYPE=Release
       # RUNPATH relative to the binary: the libraries copied next to the bindings load each
       # other (one libggml, one device registry), never the build cache's copies.
       -DCMAKE_BUILD_WITH_INSTALL_RPATH=ON '-DCMAKE_INSTALL_RPATH=$ORIGIN:$ORIGIN/../lib')

# The CPU flags for machine name $1 (as `uname -m` prints it), one per line.
arch_flags() {
  case "$1" in
    aarch64|arm64)
      if [ "${EPI_LLAMA_ARM_ARCH:-}" = native ]; then
        echo -DGGML_NATIVE=ON
      else
        echo -DGGML_NATIVE=OFF
        echo "-DGGML_CPU_ARM_ARCH=${EPI_LLAMA_ARM_ARCH:-armv8.2-a+dotprod+fp16}"
      fi ;;
    *) echo -DGGML_NATIVE=OFF ;;
  esac
}

MACHINE=${EPI_MACHINE:-$(uname -m)}
mapfile -t ARCH < <(arch_flags "$MACHINE")
# x86-64 keeps the flag order of earlier builds (GGML_NATIVE=OFF second), so its cache key,
# and with it the cached build, stays the same.
FLAGS=("${COMMON[0]}" "${ARCH[@]}" "${COMMON[@]:1}")
if [ "${EPI_LLAMA_CUDA:-}" = 1 ]; then FLAGS+=(-DGGML_CUDA=ON); fi
TARGETS=(llama ggml-rpc-server llama-quantize llama-perplexity)
KEY=$(printf '%s ' "$VERSION" "${FLAGS[@]}" | sha256sum | cut -c1-12)

if [ "${1:-}" = --print-flags ]; then
  printf 'machine %s\nkey %s\n' "$MACHINE" "$KEY"
  printf '%s\n' "${FLAGS[@]}"
  exit 0
fi
PY=${1:?usage: build_llama.sh PYTHON | --print-flags}
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
  log "building llama.cpp $VERSION for $MACHINE (${ARCH[*]}, GGML_RPC=ON) in $ROOT — about 3–7 min on 2 cores"
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
