#!/usr/bin/env bash
# Installs everything, builds, and runs every test: GoogleTest through ctest, then pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
# Each stage's start in seconds since this script began, so that a slow machine's log shows where the time goes.
stage() { echo "== $* (at ${SECONDS} s)"; }
scripts/setup.sh --python
. scripts/compiler-env.sh  # the same compiler and ccache for the builds below
VENV="${ALPAMAYO_VENV:-$HOME/.cache/alpamayo-expert/venv}"
stage "ctest"
# The emulated cuda backend's determinism test (several samples, rebinding, two concurrent sessions) runs in the
# host SIMT emulator at one to two minutes per shape on its three largest shapes: it runs on the four smaller ones
# here (shared prompts included), which take the same orchestration paths; scripts/device-check.sh runs every shape
# on a GPU.
ctest --test-dir build --output-on-failure -j"$(nproc)" \
  -E 'DeterministicAcrossRunsRebindsAndSessions/cuda_emu_.*_(gqa4_d128_B2_f16_chunks|gqa2_d32_T64_B1_bf16|shared_G1_B6_chunks_f16)'

stage "reference-only build (no oneDNN, no CUDA): the whole C++ suite"
# Proves the engine builds and passes without the cpu and cuda backends.
cmake -S . -B build-ref -DALPAMAYO_CPU_BACKEND=OFF -DALPAMAYO_CUDA_BACKEND=OFF -DALPAMAYO_BUILD_BENCH=OFF \
  -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build-ref -j"$(nproc)" --target alpamayo_tests
build-ref/alpamayo_tests --gtest_brief=1
if grep -q '^ALPAMAYO_CUDA_BACKEND:BOOL=ON' build/CMakeCache.txt; then
  stage "cuda-only build (the cuda backend without the cpu one): the CLI"
  # The cuda backend's code paths that do not assume a cpu backend beside it: the library and the CLI build, and
  # the CLI lists the reference and cuda backends only. Seconds: ccache has the main build's objects.
  cmake -S . -B build-cuda-only -DALPAMAYO_CPU_BACKEND=OFF -DALPAMAYO_BUILD_BENCH=OFF -DALPAMAYO_BUILD_TESTS=OFF \
    -DCMAKE_BUILD_TYPE=Release >/dev/null
  cmake --build build-cuda-only -j"$(nproc)" --target alpamayo-expert
  build-cuda-only/alpamayo-expert backends | tee build-cuda-only/backends.txt
  if ! grep -q '^cuda ' build-cuda-only/backends.txt || grep -q '^cpu ' build-cuda-only/backends.txt; then
    echo "the cuda-only build's backends should be reference and cuda" >&2
    exit 1
  fi
fi
stage "ThreadSanitizer build with the cpu backend: the concurrency tests"
# Sessions sharing a model from several threads (reference and cpu backends), the cpu backend's thread pool, its
# work stealing and its results for 1 to 5 threads, and threads sharing one model through the C API.
TSAN="-fsanitize=thread"
# The sanitizer builds keep line tables only (-g1): reports still name functions, files and lines, and the heaviest
# test file compiled in 46 s instead of 65 (ASan flags, AMD EPYC Zen 3).
sanbuild() {  # $1: the optimisation level
  SANBUILD=(-DCMAKE_BUILD_TYPE=RelWithDebInfo "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=$1 -g1 -DNDEBUG"
            "-DCMAKE_C_FLAGS_RELWITHDEBINFO=$1 -g1 -DNDEBUG")
}
sanbuild -O2
cmake -S . -B build-tsan -DALPAMAYO_CUDA_BACKEND=OFF -DALPAMAYO_BUILD_BENCH=OFF "${SANBUILD[@]}" \
  -DCMAKE_CXX_FLAGS="$TSAN" -DCMAKE_C_FLAGS="$TSAN" -DCMAKE_EXE_LINKER_FLAGS="$TSAN" \
  -DCMAKE_SHARED_LINKER_FLAGS="$TSAN" >/dev/null
# The C API program compares its results with this build's CLI bit for bit (the Release CLI, -O3, differed from
# this -O2 build in the last bits).
cmake --build build-tsan -j"$(nproc)" --target alpamayo_concurrency_tests alpamayo-expert test_capi
# The reference backend's sessions run the same sharing code for every weight format, shape and thread count, so
# under TSan only its f32 weights on the smaller shapes, with 2 threads (its determinism tests). On a 2-core AMD EPYC
# Zen 3 its block formats and largest shapes took 6 of the 13 minutes of these tests, and its thread-count tests
# (3 and 5 threads) 58 of 215 s; they add no other code path.
TSAN_TESTS=('*Deterministic*' '*ThreadCount*' '*ThreadPool*' '*StealQueue*' '*CpuProfile*' 'Api.*')
for t in "${TSAN_TESTS[@]}"; do  # a renamed test must not drop out of this stage unnoticed
  build-tsan/alpamayo_concurrency_tests --gtest_list_tests --gtest_filter="$t" | grep '^  ' >/dev/null ||
    { echo "no concurrency test matches $t" >&2; exit 1; }
done
TSAN_OPTIONS="halt_on_error=1 suppressions=$PWD/tests/sanitizers/tsan.supp" build-tsan/alpamayo_concurrency_tests \
  --gtest_brief=1 --gtest_filter="$(IFS=:; echo "${TSAN_TESTS[*]}")-*/reference_bfp*:*/reference_*_shared_G1_B6_*:\
*/reference_*_gqa4_d128_*:*ThreadCount*/reference_*"
TSAN_OPTIONS="halt_on_error=1 suppressions=$PWD/tests/sanitizers/tsan.supp" build-tsan/test_capi build-tsan/alpamayo-expert
stage "ASan + UBSan (with float-cast-overflow) build of the engine with the cpu backend: C++ suite, C API, CLI tests"
# Every finding aborts (-fno-sanitize-recover). The CLI tests (hostile inputs and error paths) run against
# this build's CLI; tests/python/cli.py fails a test whose run printed a sanitizer report.
SAN="-fsanitize=address,undefined,float-cast-overflow -fno-sanitize-recover=all -fno-omit-frame-pointer"
# -O1, as ASan's documentation suggests: on a 2-core AMD EPYC Zen 3 the build took 332 s against about 500 at -O2
# and the suite 259 s against 216, the stage 721 s against 827 (in a whole CI run 799 s against 827). TSan keeps
# -O2: its suite is the larger part of its stage.
# The test programs' own files are not instrumented (-fno-sanitize=all after the sanitizer flags): the engine, the
# C API and the CLI are, and ASan's allocator still puts redzones around every heap block the tests hand the
# engine. Instrumented, those files took 172 s of this stage's build against 74 (2-core AMD EPYC Zen 3), for
# checks of test code only.
sanbuild -O1
cmake -S . -B build-asan -DALPAMAYO_CUDA_BACKEND=OFF -DALPAMAYO_BUILD_BENCH=ON "${SANBUILD[@]}" \
  "-DALPAMAYO_TESTS_CXX_FLAGS=-fno-sanitize=all" \
  -DCMAKE_CXX_FLAGS="$SAN" -DCMAKE_C_FLAGS="$SAN" -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=address,undefined" \
  -DCMAKE_SHARED_LINKER_FLAGS="-fsanitize=address,undefined" >/dev/null
cmake --build build-asan -j"$(nproc)" --target alpamayo_tests alpamayo-expert test_capi soak
# The reference backend's block formats run its f32 code for sessions, reruns and threads: their determinism and
# thread-count tests are left to the Release suite (the block formats' own code runs in every other test here).
# The per-kernel conformance table (every cpu kernel forced in turn) runs each kernel on the two shapes with key
# chunks and shared prompts here, the rest of its shapes in the Release suite: every kernel's memory accesses stay
# checked, at a seventh of the table's cost under ASan.
KERNEL_SHAPES_LEFT_TO_RELEASE="mha_d16_B1_f32 gqa2_d64_B3_bf16 gqa2_d48_B2_mixed gqa2_d32_T64_B1_bf16 shared_G2_B4_suffix_leftpad"
ASAN_SKIP='*Deterministic*/reference_bfp*:*ThreadCount*/reference_bfp*'
for s in $KERNEL_SHAPES_LEFT_TO_RELEASE; do ASAN_SKIP="$ASAN_SKIP:Kernels/CpuKernelConformance.*_$s"; done
build-asan/alpamayo_tests --gtest_brief=1 --gtest_filter="-$ASAN_SKIP"
build-asan/test_capi build-asan/alpamayo-expert
# The soak at small sizes (bench/soak, docs/PERFORMANCE.md): 8 sessions of one model in 8 threads over random
# contexts; LeakSanitizer checks at exit that nothing leaked, the program that no descriptor or mapping is left.
build-asan/bench/soak --threads 8 --samples 400 --every 50
ALPAMAYO_CLI="$PWD/build-asan/alpamayo-expert" PYTHONPATH="$PWD/python" \
  "$VENV/bin/python" -m pytest tests/python/test_cli_errors.py tests/python/test_hostile.py \
  tests/python/test_hostile_numbers.py -q
stage "the Python module: pip install . into $VENV"
# scikit-build-core with the pinned nanobind of requirements.txt; the build directory build/python-<tag> is kept,
# so a rerun compiles only what changed. The tests then import the installed module.
CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)" "$VENV/bin/pip" install -q --no-build-isolation .
stage "pytest"
ALPAMAYO_CLI="$PWD/build/alpamayo-expert" PYTHONPATH="$PWD/python" "$VENV/bin/python" -m pytest tests/python -q
stage "done"
