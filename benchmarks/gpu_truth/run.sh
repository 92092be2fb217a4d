#!/usr/bin/env bash
# GPU truth run: build llama-cpp-python with CUDA, then measure what llama.cpp
# allocates and how fast it runs next to kvtuner's plan. README.md beside this file has the details.
#
#   bash benchmarks/gpu_truth/run.sh build   [options]   # (a) carried wheels, (b) CUDA build
#   bash benchmarks/gpu_truth/run.sh measure [options]   # (c) fixtures, (d) measurements, (e) outputs
#   bash benchmarks/gpu_truth/run.sh all     [options]   # both, in one call
#
# Options:
#   --cpu            CPU rehearsal: no CUDA build, the installed (CPU) llama-cpp-python
#   --cpu-build      with --cpu: build the carried sdist for the CPU anyway (rehearses phase b)
#   --quick          a handful of rows (the pytest rehearsal)
#   --budget-s N     wall-clock budget of this call in seconds; measuring stops before it and the
#                    outputs are still written (default: build 570, measure 420, all 570)
#   --jobs N         parallel buffer rows (default GPU 4, CPU 1)
#   --build-jobs N   compiler jobs (default: all cores, nproc)
#   --keep-amx       keep AMX in the CPU backend (default: built without; see README)
#   --phases LIST    measure phases, default overhead,buffers,speed
# Environment: PYTHON (default python3), OUT (default <repo>/gpu_truth_out), GPU_TRUTH_WORK
# (default /tmp/gpu_truth: fixtures, the build, the installed site-packages; kept between calls on
# a warm machine, so `measure` after `build` reuses the build).
set -uo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
T_START=$(date +%s.%N)
CMDLINE="run.sh $*"

ACTION="${1:-}"
case "$ACTION" in
  build|measure|all) shift ;;
  -h|--help|help) sed -n '2,22p' "$0"; exit 0 ;;
  *) echo "run.sh: first argument must be build, measure or all (got '${ACTION}'); see --help" >&2; exit 2 ;;
esac
CPU=0; CPU_BUILD=0; QUICK=0; BUDGET=""; JOBS=""; BUILD_JOBS=""; KEEP_AMX=0; PHASES="overhead,buffers,speed"
while [[ $# -gt 0 ]]; do
  case "$1" in
    --cpu) CPU=1 ;;
    --cpu-build) CPU_BUILD=1 ;;
    --quick) QUICK=1 ;;
    --keep-amx) KEEP_AMX=1 ;;
    --budget-s) BUDGET="${2:-}"; shift ;;
    --jobs) JOBS="${2:-}"; shift ;;
    --build-jobs) BUILD_JOBS="${2:-}"; shift ;;
    --phases) PHASES="${2:-}"; shift ;;
    *) echo "run.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
  shift
done
for v in "$BUDGET" "$JOBS" "$BUILD_JOBS"; do
  [[ -z "$v" || "$v" =~ ^[0-9]+$ ]] || { echo "run.sh: '$v' is not a whole number" >&2; exit 2; }
done
if [[ -z "$BUDGET" ]]; then
  case "$ACTION" in build|all) BUDGET=570 ;; measure) BUDGET=420 ;; esac
fi

export PYTHONUNBUFFERED=1
PYTHON="${PYTHON:-python3}"
WORK="${GPU_TRUTH_WORK:-/tmp/gpu_truth}"
SITE="$WORK/site"
OUT="${OUT:-$ROOT/gpu_truth_out}"
CARRY="$ROOT/.gpu_truth_carry"
LCP=llama_cpp_python-0.3.36
mkdir -p "$WORK" "$SITE" "$OUT"
RUNLOG="$OUT/run_sh.log"
: >"$RUNLOG"

say() { local t; t=$(awk -v a="$T_START" -v b="$(date +%s.%N)" 'BEGIN{printf "%.1f", b-a}'); echo "[run.sh ${t}s] $*" | tee -a "$RUNLOG"; }
elapsed() { awk -v a="$T_START" -v b="$(date +%s.%N)" 'BEGIN{printf "%d", b-a}'; }
PHASES_JSON=""
record_phase() { PHASES_JSON="${PHASES_JSON:+$PHASES_JSON, }\"$1\": $2"; say "PHASE $1: $2 s"; }

# --- which machine ---------------------------------------------------------------------------------
DEVICE=cpu
if [[ $CPU -eq 0 && -n "${GPU_TRUTH_FORCE_ARCH:-}" ]]; then
  DEVICE=gpu; ARCH="$GPU_TRUTH_FORCE_ARCH"; CAP="forced"   # rehearses the CUDA build without a GPU (build only)
elif [[ $CPU -eq 0 ]]; then
  if command -v nvidia-smi >/dev/null 2>&1 && CAP=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1) && [[ -n "$CAP" ]]; then
    DEVICE=gpu
    ARCH="${CAP//./}"
    ARCH="${ARCH//[[:space:]]/}"
  else
    say "no NVIDIA GPU answered nvidia-smi: CPU mode (pass --cpu to say so)"
  fi
fi
say "$CMDLINE: device $DEVICE${ARCH:+ (compute capability ${CAP}, CUDA architecture $ARCH)}, python $("$PYTHON" -c 'import sys; print(sys.version.split()[0])' 2>&1), budget ${BUDGET} s, work $WORK, out $OUT"

# --- (a) carried wheels ------------------------------------------------------------------------------
phase_wheels() {
  local t0; t0=$(date +%s.%N)
  if [[ ! -d "$CARRY/wheels" ]]; then
    say "wheels: no $CARRY/wheels (run prepare.sh here first); using the installed packages"
  elif [[ -f "$SITE/.wheels.sha" ]] && cmp -s <(cat "$CARRY"/wheels/*.whl | sha256sum) "$SITE/.wheels.sha"; then
    say "wheels: already installed in $SITE"
  else
    if "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" \
         "$CARRY"/wheels/*.whl >>"$RUNLOG" 2>&1; then
      cat "$CARRY"/wheels/*.whl | sha256sum >"$SITE/.wheels.sha"
      say "wheels: installed $(ls "$CARRY"/wheels/*.whl | xargs -n1 basename | tr '\n' ' ')into $SITE"
    else
      say "wheels: pip install FAILED (see $RUNLOG); going on with what is installed"
    fi
  fi
  record_phase wheels "$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN{printf "%.1f", b-a}')"
}

# --- (b) llama-cpp-python with CUDA for this GPU only ------------------------------------------------
cuda_libpath() {  # the CUDA library folders the build linked against (cuBLAS may live in a pip wheel)
  [[ -f "$SITE/.cuda_libdirs" ]] && export LD_LIBRARY_PATH="$(cat "$SITE/.cuda_libdirs")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  return 0
}

llama_check() {  # prints "<file> <gpu_offload>" of the llama_cpp the measure phase will import
  PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}" "$PYTHON" -c \
    'import llama_cpp as l; print(l.__file__, bool(l.llama_supports_gpu_offload()))' 2>"$WORK/llama_check.err" | tail -1
}
llama_error() {  # why the last llama_check printed nothing (the import's last error line)
  grep -v '^\s*$' "$WORK/llama_check.err" 2>/dev/null | tail -2 | cut -c1-300 | tr '\n' ' '
}

# Echoes "<CUDA toolkit root CMake should use>|<extra CMake flags>". A toolkit put
# together from NVIDIA's pip wheels (this workplace's /usr/local/cuda-13.0 is: nvcc, cudart, nvvm,
# cccl ... but no cuBLAS, no stubs/libcuda.so) makes llama.cpp's CMake fail ("Target ggml-cuda links
# to CUDA::cublas / CUDA::cuda_driver but the target was not found"). Then assemble
# $WORK/cudaroot: a copy of the toolkit plus cuBLAS from a pip wheel (nvidia/cu13 in a site-packages,
# e.g. PyTorch's) and libcuda.so pointing at the driver's libcuda.so.1.
cuda_root() {
  local t="" d lib have_cublas=0 have_drv=0 r rlib found="" drv="" sp sub extra=""
  for d in "${CUDA_HOME:-}" "${CUDA_PATH:-}" /usr/local/cuda /usr/local/cuda-*; do
    if [[ -n "$d" && -x "$d/bin/nvcc" && -f "$d/include/cuda_runtime.h" ]]; then t="$d"; break; fi
  done
  [[ -n "$t" ]] || { echo "cuda_root: no CUDA toolkit with bin/nvcc and include/cuda_runtime.h" >&2; return 1; }
  for d in "$t/lib64" "$t/targets/x86_64-linux/lib" "$t/lib"; do [[ -e "$d/libcudart.so" ]] && { lib="$d"; break; }; done
  lib="${lib:-$t/lib64}"
  [[ -e "$lib/libcublas.so" && ( -f "$t/include/cublas_v2.h" || -f "$t/targets/x86_64-linux/include/cublas_v2.h" ) ]] && have_cublas=1
  # where FindCUDAToolkit looks for CUDA::cuda_driver (the toolkit's stubs and the default library paths)
  for d in "$lib/stubs/libcuda.so" "$lib/libcuda.so" /usr/lib/x86_64-linux-gnu/libcuda.so /usr/lib64/libcuda.so; do
    [[ -e "$d" ]] && { have_drv=1; break; }
  done
  echo "cuda_root: toolkit $t (libraries $lib), cuBLAS $([[ $have_cublas -eq 1 ]] && echo found || echo missing), libcuda.so $([[ $have_drv -eq 1 ]] && echo found || echo missing)" >&2
  if [[ $have_cublas -eq 1 && $have_drv -eq 1 ]]; then echo "$t|"; return 0; fi
  r="$WORK/cudaroot"
  rm -rf "$r"; mkdir -p "$r"; cp -a "$t/." "$r/"
  rlib="$r/${lib#"$t"/}"
  if [[ $have_cublas -eq 0 ]]; then
    while IFS= read -r sp; do
      for sub in nvidia/cu13 nvidia/cublas nvidia/cu12; do
        if compgen -G "$sp/$sub/lib/libcublas.so.*" >/dev/null && [[ -f "$sp/$sub/include/cublas_v2.h" ]]; then found="$sp/$sub"; break 2; fi
      done
    done < <( { "$PYTHON" -c 'import sys; print("\n".join(p for p in sys.path if p))' 2>/dev/null; ls -d /opt/*/lib/python3*/site-packages /opt/*/.venv/lib/python3*/site-packages /usr/local/lib/python3*/dist-packages /usr/lib/python3/dist-packages 2>/dev/null; } )
    [[ -n "$found" ]] || { echo "cuda_root: no cuBLAS (libcublas.so.* + cublas_v2.h) in the toolkit or any site-packages" >&2; return 1; }
    echo "cuda_root: cuBLAS from $found" >&2
    cp "$found"/include/cublas*.h "$r/include/" 2>/dev/null || cp "$found"/include/cublas*.h "$r/targets/x86_64-linux/include/"
    for f in "$found"/lib/libcublas*.so.*; do
      ln -sf "$f" "$rlib/$(basename "$f")"
      ln -sf "$(basename "$f")" "$rlib/$(basename "$f" | sed -E 's/\.so\..*/.so/')"
    done
  fi
  if [[ $have_drv -eq 0 ]]; then
    drv="${GPU_TRUTH_LIBCUDA:-}"
    if [[ -z "$drv" ]]; then
      drv="$(ldconfig -p 2>/dev/null | awk '/libcuda\.so\.1 /{print $NF; exit}')"
      for d in /usr/local/nvidia/lib64/libcuda.so.1 /usr/lib/x86_64-linux-gnu/libcuda.so.1 /usr/lib64/libcuda.so.1; do
        [[ -z "$drv" && -e "$d" ]] && drv="$d"
      done
    fi
    if [[ -n "$drv" && -e "$drv" ]]; then
      mkdir -p "$rlib/stubs"; ln -sf "$drv" "$rlib/stubs/libcuda.so"
      echo "cuda_root: libcuda.so -> $drv" >&2
    else
      extra="-DGGML_CUDA_NO_VMM=ON"
      echo "cuda_root: no libcuda.so.1 found: building with GGML_CUDA_NO_VMM (legacy memory pool)" >&2
    fi
  fi
  echo "$r|$extra"
}

phase_build() {
  local t0 kind marker args log left
  t0=$(date +%s.%N)
  kind="$DEVICE"
  marker="$SITE/.llama_build.json"
  if [[ "$DEVICE" == cpu && $CPU_BUILD -eq 0 ]]; then
    say "build: skipped in CPU mode (the installed llama-cpp-python: $(llama_check))"
    record_phase build 0
    return 0
  fi
  if [[ ! -f "$CARRY/$LCP-stripped.tar.gz" ]]; then
    say "build: $CARRY/$LCP-stripped.tar.gz is missing: run benchmarks/gpu_truth/prepare.sh here and carry .gpu_truth_carry"
    record_phase build 0
    return 1
  fi
  if [[ -f "$marker" ]] && grep -q "\"kind\": \"$kind\"" "$marker" && grep -q "\"arch\": \"${ARCH:-none}\"" "$marker"; then
    local chk; chk="$(llama_check)"
    if [[ "$chk" == "$SITE"* ]]; then
      say "build: already built ($chk)"
      record_phase build 0
      return 0
    fi
  fi
  rm -rf "$WORK/src"; mkdir -p "$WORK/src"
  tar -xzf "$CARRY/$LCP-stripped.tar.gz" -C "$WORK/src"
  args="-DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAVA_BUILD=OFF"
  if [[ "$kind" == gpu ]]; then
    local croot cextra cr
    cr="$(cuda_root 2> >(tee -a "$RUNLOG" >&2))" || { say "build: no usable CUDA toolkit"; record_phase build 0; return 1; }
    croot="${cr%%|*}"; cextra="${cr#*|}"
    # at run time libggml-cuda.so needs libcudart/libcublas from there (RPATH may hold only $ORIGIN)
    local d dirs=""
    for d in "$croot/lib64" "$croot/targets/x86_64-linux/lib" "$croot/lib"; do
      [[ -d "$d" ]] && dirs="${dirs:+$dirs:}$(cd "$d" && pwd -P)"
    done
    echo "$dirs" >"$SITE/.cuda_libdirs"
    cuda_libpath
    export CUDACXX="$croot/bin/nvcc" PATH="$croot/bin:$PATH"
    say "build: $("$CUDACXX" --version | tail -2 | head -1) from $croot"
    args="-DGGML_CUDA=on -DCMAKE_CUDA_ARCHITECTURES=$ARCH -DCUDAToolkit_ROOT=$croot -DCMAKE_CUDA_COMPILER=$croot/bin/nvcc${cextra:+ $cextra} $args"
  else
    args="-DGGML_CUDA=off $args"
  fi
  # AMX: without it by default. On this workplace's Firecracker VMs llama.cpp's AMX matrix kernels
  # die of SIGILL (tileloadd in ggml_backend_amx_mul_mat; README), which would kill every CPU-side row.
  if [[ $KEEP_AMX -eq 0 ]] && echo 'int main(void){return 0;}' | gcc -x c -mno-amx-tile -mno-amx-int8 -mno-amx-bf16 -o /dev/null - 2>/dev/null; then
    export CFLAGS="${CFLAGS:-} -mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
    export CXXFLAGS="${CXXFLAGS:-} -mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
    say "build: CPU backend without AMX (CFLAGS/CXXFLAGS -mno-amx-*)"
  fi
  export CMAKE_ARGS="$args"
  export CMAKE_BUILD_PARALLEL_LEVEL="${BUILD_JOBS:-$(nproc)}"
  log="$WORK/build.log"
  left=$(( BUDGET - $(elapsed) - 15 ))
  (( left > 60 )) || left=60
  say "build: CMAKE_ARGS='$CMAKE_ARGS', $CMAKE_BUILD_PARALLEL_LEVEL jobs, at most ${left} s; log $log"
  local tf="$WORK/build.time" rc
  { TIMEFORMAT='%R %U %S'; time timeout "$left" "$PYTHON" -m pip install -v --no-build-isolation --no-deps --no-index \
      --no-cache-dir --upgrade --target "$SITE" --config-settings=build-dir="$WORK/build" "$WORK/src/$LCP" >"$log" 2>&1; } 2>"$tf"
  rc=$?
  local cpu_s; cpu_s=$(awk '{printf "%.0f", $2 + $3}' "$tf" 2>/dev/null)
  say "build: pip exit $rc; wall/user/sys seconds $(cat "$tf" 2>/dev/null) (${cpu_s:-?} CPU seconds)"
  {
    echo "# $CMDLINE: pip install of $LCP (CMAKE_ARGS=$CMAKE_ARGS, CMAKE_BUILD_PARALLEL_LEVEL=$CMAKE_BUILD_PARALLEL_LEVEL) exit $rc"
    echo "# wall / user / sys seconds: $(cat "$tf" 2>/dev/null); CFLAGS='${CFLAGS:-}'"
    echo "# ninja steps: $(grep -oE '^ *\[[0-9]+/[0-9]+\]' "$log" | tail -1 | tr -d ' '), of which nvcc: $(grep -cE '^ *\[[0-9]+/[0-9]+\].*nvcc' "$log")"
    tail -150 "$log"
  } >"$OUT/build_log_tail.txt"
  local secs; secs=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN{printf "%.1f", b-a}')
  if [[ $rc -ne 0 ]]; then
    say "build: FAILED with exit $rc after ${secs} s (124 = out of time); tail in $OUT/build_log_tail.txt"
    # the error lines, cut short (nvcc command lines are kilobytes long; the tool shows 12,000 characters)
    grep -iE "error|fatal|not found|failed" "$log" | grep -v -- "-Werror" | tail -20 | cut -c1-300
    tail -5 "$log" | cut -c1-300
    record_phase build "$secs"
    return 1
  fi
  local chk; chk="$(llama_check)"
  say "build: done in ${secs} s: llama_cpp ${chk:-NOT importable: $(llama_error)}"
  if [[ "$kind" == gpu && "$chk" != *" True" ]]; then
    say "build: the built llama_cpp does not offload to the GPU (LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-})"
    record_phase build "$secs"
    return 1
  fi
  printf '{"kind": "%s", "arch": "%s", "seconds": %s, "cpu_seconds": %s, "cmake_args": "%s", "jobs": %s, "cflags": "%s", "nvcc": "%s"}\n' \
    "$kind" "${ARCH:-none}" "$secs" "${cpu_s:-null}" "$CMAKE_ARGS" "$CMAKE_BUILD_PARALLEL_LEVEL" "${CFLAGS:-}" \
    "$(command -v nvcc >/dev/null && nvcc --version | tail -2 | head -1)" >"$marker"
  record_phase build "$secs"
  return 0
}

# --- (c, d, e) fixtures, measurements, outputs -----------------------------------------------------
phase_measure() {
  local left chk
  chk="$(llama_check)"
  if [[ "$DEVICE" == gpu && "$chk" != "$SITE"*" True" ]]; then
    if [[ -f "$SITE/.llama_build.json" ]]; then  # built here, but it does not load: a rebuild would not help
      say "measure: the build in $SITE does not load with CUDA (${chk:-$(llama_error)}): nothing measured"
      return 1
    fi
    say "measure: no CUDA build in $SITE (${chk:-$(llama_error)}): building first"
    phase_build || return 1
    chk="$(llama_check)"
  elif [[ -z "$chk" ]]; then
    say "measure: llama_cpp is not importable: $(llama_error)"
    return 1
  fi
  say "measure: llama_cpp $chk"
  left=$(( BUDGET - $(elapsed) ))
  (( left > 20 )) || { say "measure: only ${left} s of the budget left: nothing measured"; return 1; }
  local extra=()
  [[ $QUICK -eq 1 ]] && extra+=(--quick)
  [[ -n "$JOBS" ]] && extra+=(--jobs "$JOBS")
  GPU_TRUTH_SHELL_PHASES="{${PHASES_JSON}}" GPU_TRUTH_BUILD_INFO="$SITE/.llama_build.json" \
  PYTHONPATH="$SITE:$ROOT${PYTHONPATH:+:$PYTHONPATH}" \
    "$PYTHON" "$HERE/gpu_truth.py" --mode "$DEVICE" --budget-s "$left" --out "$OUT" --work "$WORK" \
      --carry "$CARRY" --phases "$PHASES" --command "$CMDLINE" "${extra[@]}"
}

status=0
cuda_libpath
phase_wheels
case "$ACTION" in
  build) phase_build || status=1 ;;
  measure) phase_measure || status=1 ;;
  all) if phase_build; then phase_measure || status=1; else status=1; say "measure: skipped, the build failed"; fi ;;
esac
say "finished with status $status after $(elapsed) s; outputs in $OUT: $(ls "$OUT" 2>/dev/null | tr '\n' ' ')"
exit $status
