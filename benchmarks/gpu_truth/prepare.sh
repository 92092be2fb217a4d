#!/usr/bin/env bash
# Prepare the GPU truth run's carry folder, here (a machine with PyPI access), once.
#
#   bash benchmarks/gpu_truth/prepare.sh          # PYTHON=... to choose the interpreter
#
# Writes <repo>/.gpu_truth_carry/ (ignored by git; name it in the device tool's `carry`):
#   llama_cpp_python-0.3.36-stripped.tar.gz  the sdist without what a CUDA/CPU build of the
#                                            Python package does not read (see STRIP below)
#   wheels/*.whl                             pure-Python wheels the device image lacks
#                                            (gguf, diskcache, platformdirs; KINDS.md's list)
#   gemma3-270m.header.gguf.gz + .json       the embedded default model's header (metadata,
#                                            vocabulary, tensor table) for a zero-weight copy
#   MANIFEST.json                            what is where, sizes, sha256
# The sdist comes from $SDIST_TARBALL, else /tmp/sdist/llama_cpp_python-0.3.36.tar.gz, else
# `pip download --no-deps --no-binary :all: llama-cpp-python==0.3.36`.
# The stripped tree is checked with a CPU cmake configure (LLAVA_BUILD off, like run.sh).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
CARRY="$ROOT/.gpu_truth_carry"
PYTHON="${PYTHON:-}"
if [[ -z "$PYTHON" ]]; then
  if [[ -x "$ROOT/.venv/bin/python" ]]; then PYTHON="$ROOT/.venv/bin/python"; else PYTHON=python3; fi
fi
LCP_VERSION=0.3.36
# Wheel versions: the ones kvtuner is tested with here (pyproject: gguf>=0.17, platformdirs>=4.0;
# llama-cpp-python needs diskcache>=5.6.1). All py3-none-any, so they install on the device's 3.12.
WHEELS=("gguf==0.19.0" "diskcache==5.6.3" "platformdirs==4.14.9")
SDIST_NAME="llama_cpp_python-$LCP_VERSION"
TMP="$(mktemp -d /tmp/gpu_truth_prepare.XXXXXX)"
trap 'rm -rf "$TMP"' EXIT

echo "== prepare: python $("$PYTHON" -c 'import sys; print(sys.version.split()[0])') -> $CARRY"
rm -rf "$CARRY"
mkdir -p "$CARRY/wheels"

# --- (a) llama-cpp-python sdist, stripped -----------------------------------------------------
TARBALL="${SDIST_TARBALL:-/tmp/sdist/$SDIST_NAME.tar.gz}"
if [[ ! -f "$TARBALL" ]]; then
  echo "-- downloading the sdist (pip download)"
  "$PYTHON" -m pip download -q --no-deps --no-binary :all: "llama-cpp-python==$LCP_VERSION" -d "$TMP/dl"
  TARBALL="$(ls "$TMP"/dl/llama_cpp_python-*.tar.gz | head -1)"
fi
echo "-- sdist: $TARBALL ($(du -h "$TARBALL" | cut -f1))"
tar -xzf "$TARBALL" -C "$TMP"
SRC="$TMP/$SDIST_NAME"
[[ -f "$SRC/pyproject.toml" ]] || { echo "prepare: $TARBALL has no $SDIST_NAME/pyproject.toml" >&2; exit 1; }
before=$(du -sm "$SRC" | cut -f1)

# What the build does not read: llama-cpp-python's docs/tests/examples/git history; llama.cpp's
# models (vocab files), docs, media, tests, benches, examples, tools other than mtmd (kept so a
# build with LLAVA_BUILD on still configures), conversion scripts, gguf-py, CI files, and every
# ggml backend except CPU and CUDA (ggml_add_backend only enters the folders of enabled backends).
STRIP=(
  .git .github docker docs examples tests scripts CHANGELOG.md CONTRIBUTING.md mkdocs.yml
  .readthedocs.yaml Makefile .dockerignore .gitignore .gitmodules
  vendor/llama.cpp/{models,docs,media,tests,benches,examples,pocs,gguf-py,scripts,conversion}
  vendor/llama.cpp/{grammars,requirements,requirements.txt,.devops,.github,.gemini,.pi,ci,skills,app}
  vendor/llama.cpp/{AUTHORS,flake.nix,build-xcframework.sh,mypy.ini,pyrightconfig.json,ty.toml}
  vendor/llama.cpp/{convert_hf_to_gguf.py,convert_hf_to_gguf_update.py,convert_llama_ggml_to_gguf.py}
  vendor/llama.cpp/convert_lora_to_gguf.py vendor/llama.cpp/.git
)
for p in "${STRIP[@]}"; do rm -rf "${SRC:?}/$p"; done
for t in "$SRC"/vendor/llama.cpp/tools/*; do
  [[ "$(basename "$t")" == mtmd || "$(basename "$t")" == CMakeLists.txt ]] || rm -rf "$t"
done
for b in "$SRC"/vendor/llama.cpp/ggml/src/ggml-*/; do
  case "$(basename "$b")" in ggml-cpu|ggml-cuda) ;; *) rm -rf "$b" ;; esac
done
after=$(du -sm "$SRC" | cut -f1)
echo "-- stripped: ${before} MiB -> ${after} MiB"

# The files the default CUDA configuration compiles must all be there (ggml-cuda/CMakeLists.txt
# globs *.cu and template-instances/{fattn-tile,fattn-mma,mmq,mmf}*.cu; ggml/cmake/common.cmake
# names the fattn-vec instances of GGML_CUDA_FA_QUANTS, default q4_0-q4_0;q8_0-q8_0;f16-f16;bf16-bf16)
CU="$SRC/vendor/llama.cpp/ggml/src/ggml-cuda"
for c in q4_0-q4_0 q8_0-q8_0 f16-f16 bf16-bf16; do
  [[ -f "$CU/template-instances/fattn-vec-instance-$c.cu" ]] || { echo "prepare: missing fattn-vec-instance-$c.cu" >&2; exit 1; }
done
n_cu=$(ls "$CU"/*.cu | wc -l)
n_inst=$(ls "$CU"/template-instances/{fattn-tile,fattn-mma,mmq,mmf}*.cu | wc -l)
echo "-- CUDA translation units for one architecture: $n_cu top-level + $n_inst template instances + 4 fattn-vec = $((n_cu + n_inst + 4))"

# Configure check (CPU; this machine has no nvcc): the stripped tree must still configure.
if command -v cmake >/dev/null; then
  gen=(); command -v ninja >/dev/null && gen=(-G Ninja)
  if cmake -S "$SRC" -B "$TMP/configure" "${gen[@]}" -DLLAVA_BUILD=OFF -DLLAMA_BUILD_TESTS=OFF \
       -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF \
       -DSKBUILD_PLATLIB_DIR="$TMP/platlib" >"$TMP/configure.log" 2>&1; then
    echo "-- cmake configure of the stripped tree: ok"
  else
    tail -30 "$TMP/configure.log" >&2
    echo "prepare: the stripped tree does not configure (log above)" >&2
    exit 1
  fi
  rm -rf "$TMP/configure"
else
  echo "-- cmake not found here: configure check skipped"
fi
# configure wrote build-info into the source? (it should not); repack what the build reads
tar -C "$TMP" -czf "$CARRY/$SDIST_NAME-stripped.tar.gz" "$SDIST_NAME"

# --- (b) wheels ----------------------------------------------------------------------------------
echo "-- wheels: ${WHEELS[*]}"
"$PYTHON" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation py \
  --abi none --platform any -d "$CARRY/wheels" "${WHEELS[@]}" 2>&1 | grep -v "is ignored" || true
n_whl=$(ls "$CARRY"/wheels/*.whl 2>/dev/null | wc -l)
[[ "$n_whl" -eq ${#WHEELS[@]} ]] || { echo "prepare: expected ${#WHEELS[@]} wheels, got $n_whl" >&2; exit 1; }

# --- (c) the default model's header -------------------------------------------------------------
if PYTHONPATH="$ROOT:$ROOT/tests${PYTHONPATH:+:$PYTHONPATH}" "$PYTHON" - "$CARRY" <<'EOF'
import gzip, hashlib, json, os, subprocess, sys
carry = sys.argv[1]
r = subprocess.run([sys.executable, "-m", "kvtuner.cli", "inspect", "--json"], capture_output=True, text=True)
if r.returncode != 0:
    print("-- default model: not available here (" + r.stderr.strip() + "); skipped")
    sys.exit(0)
info = json.loads(r.stdout)
import gguf
path = info["path"]
offset = gguf.GGUFReader(path).data_offset
with open(path, "rb") as f:
    head = f.read(offset)
with gzip.open(os.path.join(carry, "gemma3-270m.header.gguf.gz"), "wb", compresslevel=9) as f:
    f.write(head)
meta = {"source": path, "file_bytes": os.path.getsize(path), "header_bytes": offset,
        "header_sha256": hashlib.sha256(head).hexdigest(), "name": info.get("name"),
        "architecture": info.get("architecture"), "file_type": info.get("file_type"),
        "note": "the real default model's header (metadata, vocabulary, tensor table); run.sh extends it "
                "with a hole to file_bytes: same shapes and tokenizer, all weights zero"}
with open(os.path.join(carry, "gemma3-270m.header.json"), "w") as f:
    json.dump(meta, f, indent=1)
print(f"-- default model header: {offset} bytes of {meta['file_bytes']} ({info.get('name')})")
EOF
then :; else echo "prepare: could not copy the default model's header" >&2; exit 1; fi

# --- manifest and sizes ----------------------------------------------------------------------------
"$PYTHON" - "$CARRY" <<'EOF'
import hashlib, json, os, sys
carry = sys.argv[1]
files = []
for dirpath, _, names in os.walk(carry):
    for n in sorted(names):
        p = os.path.join(dirpath, n)
        with open(p, "rb") as f:
            h = hashlib.sha256(f.read()).hexdigest()
        files.append({"path": os.path.relpath(p, carry), "bytes": os.path.getsize(p), "sha256": h})
with open(os.path.join(carry, "MANIFEST.json"), "w") as f:
    json.dump({"files": files}, f, indent=1)
EOF
carry_bytes=$(du -sb "$CARRY" | cut -f1)
tree_bytes=$(cd "$ROOT" && git ls-files -z | xargs -0 du -cb 2>/dev/null | tail -1 | cut -f1)
ls -l "$CARRY" "$CARRY/wheels"
echo "== carry folder: $((carry_bytes / 1048576)) MiB ($carry_bytes bytes); tracked tree: $((tree_bytes / 1024)) KiB;" \
     "together $(((carry_bytes + tree_bytes) / 1048576)) MiB of the device tool's 64 MiB"
if (( carry_bytes + tree_bytes > 60 * 1048576 )); then
  echo "prepare: over 60 MiB: the device tool sends at most 64 MiB" >&2
  exit 1
fi
