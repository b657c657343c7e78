#!/usr/bin/env bash
# The whole test suite: installs what is missing, builds (warnings are errors) and runs CTest; then
# the hardening steps: the unit tests built with clang's AddressSanitizer + UBSan, and every
# libFuzzer target for a few seconds over its corpus, both from one instrumented build (the asan
# preset; `ctest -L fuzz`); then the unit tests that run threads, built with ThreadSanitizer (the
# tsan preset). Each step prints how long it took.
#
# The main build compiles the CUDA code wherever the toolkit is installed (the ci preset turns
# PIPELINE_WITH_CUDA on when CMake finds nvcc, for one architecture), so a CUDA compile error fails
# the run; its gpu tests run on a GPU machine and report themselves skipped elsewhere. The asan
# build is the CPU-only configuration, so both are compiled. (One CUDA build for every test, and
# one sanitizer build for the unit tests and the fuzzers, instead of four library builds: a
# fresh 2-core machine spent 51 of its 60 minutes compiling.)
# Extra arguments go to ctest for the main build only and skip the hardening steps, e.g.
# `scripts/test.sh -L unit` for a quick run.
set -euo pipefail
cd "$(dirname "$0")/.."

step() {  # step NAME COMMAND...: runs it and reports its duration
  local name=$1 start=$SECONDS
  shift
  echo "test.sh: $name"
  "$@"
  echo "test.sh: $name took $((SECONDS - start)) s"
}

ci() {
  if [[ -z ${CUDACXX:-} ]] && ! command -v nvcc >/dev/null && [[ -x /usr/local/cuda/bin/nvcc ]]; then
    export CUDACXX=/usr/local/cuda/bin/nvcc  # the toolkit's default place, off the PATH
  fi
  PIPELINE_PRESET=ci bash scripts/build.sh
  if grep -q '^PIPELINE_WITH_CUDA:BOOL=ON' build/ci/CMakeCache.txt; then
    echo "test.sh: the CUDA code is compiled (build/ci); gpu tests run only where there is a GPU"
  else
    echo "test.sh: no nvcc (CUDA toolkit) on this machine: the CUDA code is not compiled"
  fi
  ctest --preset ci -j "$(nproc)" "$@"
}
hardening() {
  [[ -f build/asan/CMakeCache.txt ]] || cmake --preset asan
  cmake --build build/asan -j "$(nproc)" --target pipeline_unit_tests pipeline_fuzzers
  ctest --preset asan -j "$(nproc)"
  ctest --preset asan-fuzz -j "$(nproc)"
}

# The unit tests that run threads of their own (label `threads`) under ThreadSanitizer. Clang 14's
# TSan cannot map its shadow memory under the wider address randomisation of newer kernels
# (vm.mmap_rnd_bits above 28: "unexpected memory mapping"); there they run with it off (setarch -R).
thread_checks() {
  [[ -f build/tsan/CMakeCache.txt ]] || cmake --preset tsan
  cmake --build build/tsan -j "$(nproc)" --target pipeline_unit_tests
  local run=()
  if (($(cat /proc/sys/vm/mmap_rnd_bits 2>/dev/null || echo 0) > 28)); then
    run=(setarch "$(uname -m)" -R)
  fi
  "${run[@]}" ctest --preset tsan -j "$(nproc)"
}

step "ci build and tests (build/ci)" ci "$@"
if (($# == 0)); then
  step "unit tests and fuzzers under ASan + UBSan (build/asan)" hardening
  step "threaded unit tests under ThreadSanitizer (build/tsan)" thread_checks
fi
