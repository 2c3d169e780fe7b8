#!/usr/bin/env bash
# The cuda backend's device check: one command on a machine with an NVIDIA GPU. It builds the cuda backend
# (every default architecture, sm_80 to sm_121: CMakeLists.txt), then runs
#   1. the C++ conformance suite on `cuda` (bf16 and fp8 against the reference backend, shared prompts as a
#      cascade, suffix rows, left padding, guidance, determinism, rebinding, concurrent sessions, seam errors)
#      and the cuda backend's own tests (caches bound from GPU memory, the device-side NaN scan, graph replay ==
#      eager launches), listing every test it skipped and why;
#   2. the full-size accuracy check (bench/cuda_check.cpp): the seed's model (64 layers, synthetic weights)
#      and a 4,700-row context, cuda bf16 and fp8 against the fp32 reference backend: step 0's every layer,
#      every v_k, x_N and the trajectory in metres (10 Euler steps, or 2 when the build ran long);
#   3. the benchmark: ms per step and per 10-step sample, bf16 and fp8, 1, 6 and 20 samples sharing one
#      4,700-row prompt (stored once),
#      GB/s against the measured copy bandwidth; then, while the time budget lasts, PyTorch on the same GPU
#      (bench/bench_cuda_torch.py: transformers eager as the release runs it, plain torch eager and under a
#      CUDA graph), the other matmul implementation of each format, and the rest of the C++ suite;
# then prints one summary table and writes it as JSON ($OUT/device-check.json, or device-check-out/).
# Exit status 0 when the build, every test and the accuracy bars pass; the speed bars (stated for an H200)
# are reported in the table and the JSON.
#
# The GPU machine has the CUDA toolkit, cmake, ninja and Python with torch and transformers, but no Debian
# -dev packages and no network. The build therefore uses -DALPAMAYO_CPU_BACKEND=OFF (no oneDNN) and takes
# nlohmann-json, CLI11 and GoogleTest from deps/ (cmake/Dependencies.cmake), a folder that
#   scripts/device-check.sh --prepare
# fills from this machine's packages (about 6 MB; deps/ is git-ignored, so pass it along explicitly, e.g.
# as a carried path). Then, on the GPU machine, from the repository root:
#   OUT=/some/dir scripts/device-check.sh
# Budget: under 6 minutes on an H200 (16 cores) including the build. Environment: OUT (results),
# DEVICE_CHECK_WORK (synthetic model and context, ~6 GB, reused; default /tmp/alpamayo-device-check),
# PYTHON (default python3), JOBS (build parallelism, default nproc), BUDGET (seconds before the optional
# stages stop starting, default 345).
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT="$PWD"

if [ "${1:-}" = "--prepare" ]; then
  set -e
  rm -rf deps && mkdir -p deps/include
  for h in /usr/include/nlohmann /usr/include/CLI; do
    [ -d "$h" ] || { echo "missing $h: install nlohmann-json3-dev and libcli11-dev (scripts/setup.sh does)" >&2; exit 1; }
    cp -r "$h" deps/include/
  done
  [ -f /usr/src/googletest/CMakeLists.txt ] || { echo "missing /usr/src/googletest: install googletest" >&2; exit 1; }
  cp -r /usr/src/googletest deps/googletest
  echo "deps/ ready ($(du -sh deps | cut -f1)): nlohmann-json, CLI11, GoogleTest sources."
  echo "On the GPU machine, with deps/ next to the sources: OUT=<dir> scripts/device-check.sh"
  exit 0
fi

START=$(date +%s)
OUT_DIR="${OUT:-$ROOT/device-check-out}"
mkdir -p "$OUT_DIR"
WORK="${DEVICE_CHECK_WORK:-/tmp/alpamayo-device-check}"
PY="${PYTHON:-python3}"
JOBS="${JOBS:-$(nproc)}"
BUILD="$ROOT/build-device"
elapsed() { echo $(( $(date +%s) - START )); }
STAGES=()
declare -A RC SECS ENFORCE

# run_stage NAME ENFORCE TIMEOUT_S CMD...: output to $OUT_DIR/NAME.log, its tail on failure.
run_stage() {
  local name="$1" enforce="$2" limit="$3"
  shift 3
  echo "== $name ($(elapsed) s)"
  local t0=$(date +%s)
  timeout "$limit" "$@" > "$OUT_DIR/$name.log" 2>&1
  local rc=$?
  STAGES+=("$name")
  RC[$name]=$rc
  SECS[$name]=$(( $(date +%s) - t0 ))
  ENFORCE[$name]=$enforce
  if [ $rc -ne 0 ]; then
    echo "   $name failed (rc $rc$([ $rc -eq 124 ] && echo ', timed out after '"$limit"' s')); last lines of $name.log:"
    tail -n 25 "$OUT_DIR/$name.log" | sed 's/^/   | /'
  fi
  return $rc
}

write_stages() {
  {
    printf '{"order": ['
    local sep=""
    for s in "${STAGES[@]}"; do printf '%s"%s"' "$sep" "$s"; sep=", "; done
    printf ']'
    for s in "${STAGES[@]}"; do
      printf ', "%s": {"rc": %d, "seconds": %d, "enforce": %s}' "$s" "${RC[$s]}" "${SECS[$s]}" "${ENFORCE[$s]}"
    done
    printf ', "total_seconds": %d}\n' "$(elapsed)"
  } > "$OUT_DIR/stages.json"
}

finish() {
  write_stages
  "$PY" scripts/device_check_summary.py "$OUT_DIR"
  local rc=$?
  echo "total $(elapsed) s; logs and JSON in $OUT_DIR"
  exit $rc
}

# skipped_tests LOG: every test a GoogleTest log reports skipped, with the reason it printed ("...: Skipped" and
# the message on the lines after it).
skipped_tests() {
  awk '/: Skipped$/ {why = ""; grab = 1; next}
       grab && /^\[/ {grab = 0}
       grab {why = why (why == "" ? "" : " ") $0; next}
       /^\[  SKIPPED \] .*\(/ {sub(/^\[  SKIPPED \] /, ""); sub(/ \([0-9]+ ms\)$/, ""); print "   skipped: " $0 ": " why; why = ""}' "$1"
}

echo "== device check: $(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null | head -1)"
command -v nvcc >/dev/null || export PATH="/usr/local/cuda/bin:$PATH"
if [ ! -f deps/include/nlohmann/json.hpp ] && [ ! -f /usr/include/nlohmann/json.hpp ]; then
  echo "nlohmann-json is neither installed nor in deps/: run scripts/device-check.sh --prepare on a machine" \
       "with the Debian packages and bring deps/ along" >&2
fi
GEN=()
command -v ninja >/dev/null && GEN=(-G Ninja)

# The default architectures (every target the toolkit has, CMakeLists.txt): the build that users get.
run_stage configure true 120 cmake -S . -B "$BUILD" "${GEN[@]}" -DCMAKE_BUILD_TYPE=Release \
  -DALPAMAYO_CPU_BACKEND=OFF -DALPAMAYO_CUDA_BACKEND=ON -DALPAMAYO_DEPS_DIR="$ROOT/deps" || finish
grep -o "cuda backend: nvcc.*" "$OUT_DIR/configure.log" | sed 's/^/   /'
TARGETS=(alpamayo_tests cuda_check)
grep -q "alpamayo-expert CLI is not built" "$OUT_DIR/configure.log" || TARGETS+=(alpamayo-expert)
run_stage build true 420 cmake --build "$BUILD" -j"$JOBS" --target "${TARGETS[@]}" || finish
echo "   built in ${SECS[build]} s"

# 1. The cuda tests (with the conformance figures). The cases cuda does not declare (BackendInfo::features) are
# skipped with the feature named; BackendFeatures.* lists them and checks that bind refuses each.
# The emulated build (cuda_emu, tests/cuda_emu) runs in CI and needs no GPU: left out here.
CUDA_FILTER='*cuda*:CudaBackend.*:Conformance.ThreadCounts*:Conformance.EveryBackend*:BackendFeatures.*:Api.*'
EMU_FILTER='*cuda_emu*:CudaKernels.*:CudaEmu/*:CudaEmulated.*'
ALPAMAYO_CONFORMANCE_REPORT=1 run_stage tests-cuda true 240 "$BUILD/alpamayo_tests" \
  --gtest_filter="$CUDA_FILTER-$EMU_FILTER" \
  --gtest_output=json:"$OUT_DIR/gtest-cuda.json"
grep -E "^\[  (PASSED|SKIPPED|FAILED)  \] [0-9]+ test|^\[  FAILED  \] " "$OUT_DIR/tests-cuda.log" | head -12 | sed 's/^/   /'
skipped_tests "$OUT_DIR/tests-cuda.log"

# 2 + 3. Full-size accuracy and the benchmark. The reference backend's 10 steps take about a minute on 16
# cores; fall back to 2 when the build and tests already used most of the budget.
REF_STEPS=10
[ "$(elapsed)" -gt 170 ] && REF_STEPS=2
run_stage cuda-check true 300 "$BUILD/bench/cuda_check" --work "$WORK" --ref-steps "$REF_STEPS" --json "$OUT_DIR/cuda_check.json"
sed -n '/^device/p;/^synthetic/p;/^== /,$p' "$OUT_DIR/cuda-check.log" | sed 's/^/   /'

# Then, while the 6-minute budget lasts (BUDGET seconds, default 345): PyTorch on the same GPU, the other
# matmul implementation of each format (one sample), the rest of the C++ suite (CI runs it too).
BUDGET="${BUDGET:-345}"
left() { echo $(( BUDGET - $(elapsed) )); }
if [ "$(left)" -gt 45 ] && "$PY" -c "import torch, transformers; assert torch.cuda.is_available()" 2>/dev/null; then
  run_stage torch false $(( $(left) - 5 )) "$PY" bench/bench_cuda_torch.py --batches 1,6,20 --json "$OUT_DIR/torch.json"
  tail -n 4 "$OUT_DIR/torch.log" | sed 's/^/   /'
else
  echo "== torch: skipped ($(left) s of the budget left, or no torch with CUDA for $PY)"
fi
if [ "$(left)" -gt 30 ]; then
  ALPAMAYO_CUDA_GEMM=own run_stage gemm-own-bf16 false 60 "$BUILD/bench/cuda_check" --work "$WORK" --no-accuracy \
    --formats bf16 --batches 1 --samples 5 --json "$OUT_DIR/cuda_check_own_bf16.json"
else
  echo "== gemm-own-bf16: skipped ($(left) s of the budget left)"
fi
if [ "$(left)" -gt 30 ]; then
  ALPAMAYO_CUDA_GEMM=cublaslt run_stage gemm-cublaslt-fp8 false 60 "$BUILD/bench/cuda_check" --work "$WORK" \
    --no-accuracy --formats fp8 --batches 1 --samples 5 --json "$OUT_DIR/cuda_check_cublaslt_fp8.json"
else
  echo "== gemm-cublaslt-fp8: skipped ($(left) s of the budget left)"
fi
if [ "$(left)" -gt 20 ]; then
  run_stage tests-rest true $(( $(left) + 60 )) "$BUILD/alpamayo_tests" --gtest_filter="-$CUDA_FILTER:$EMU_FILTER" \
    --gtest_output=json:"$OUT_DIR/gtest-rest.json"
  grep -E "^\[  (PASSED|SKIPPED|FAILED)  \] [0-9]+ test|^\[  FAILED  \] " "$OUT_DIR/tests-rest.log" | head -6 | sed 's/^/   /'
  skipped_tests "$OUT_DIR/tests-rest.log"
else
  echo "== tests-rest: skipped (budget); CI runs the whole suite"
fi
finish
