#!/usr/bin/env bash
# The whole test suite: installs what is missing, builds (warnings are errors), runs CTest; then
# the CUDA build (compiled where the toolkit is; its gpu tests skip without a GPU) and the
# hardening steps: the unit tests built with AddressSanitizer + UBSan (the asan preset, only
# the unit test targets), and every libFuzzer target for a few seconds over its corpus (the fuzz
# preset, `ctest -L fuzz`). Each step prints how long it took.
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
  PIPELINE_PRESET=ci bash scripts/build.sh
  ctest --preset ci -j "$(nproc)" "$@"
}
asan() {
  [[ -f build/asan/CMakeCache.txt ]] || cmake --preset asan
  cmake --build build/asan -j "$(nproc)" --target pipeline_unit_tests
  ctest --preset asan -j "$(nproc)"
}
# The CUDA build (library, gpu tests, header checks, and the trainers, whose GPU pipeline code —
# NCCL start-up, the device memory report — exists only there) compiles wherever the CUDA toolkit
# is installed; its gpu tests run on a GPU machine and report themselves skipped elsewhere.
cuda() {
  local nvcc
  nvcc=$(command -v nvcc || true)
  [[ -z $nvcc && -x /usr/local/cuda/bin/nvcc ]] && nvcc=/usr/local/cuda/bin/nvcc
  if [[ -z $nvcc ]]; then
    echo "test.sh: no nvcc (CUDA toolkit) on this machine: the CUDA build is not compiled"
    return 0
  fi
  [[ -f build/cuda-ci/CMakeCache.txt ]] ||
    CUDACXX=$nvcc cmake --preset cuda-release -B build/cuda-ci -DPIPELINE_WERROR=ON \
      -DPIPELINE_BUILD_EXAMPLES=ON -DPIPELINE_BUILD_BENCH=OFF -DPIPELINE_BUILD_TOOLS=OFF \
      -DCMAKE_CUDA_ARCHITECTURES=90  # one architecture: CI only compiles (half the nvcc time)
  cmake --build build/cuda-ci -j "$(nproc)" --target pipeline pipeline_gpu_tests \
    pipeline_header_check train_fashion_mnist train_transformer_lm
  ctest --test-dir build/cuda-ci -L gpu --output-on-failure
}
fuzz() {
  [[ -f build/fuzz/CMakeCache.txt ]] || cmake --preset fuzz
  cmake --build build/fuzz -j "$(nproc)" --target pipeline_fuzzers
  ctest --preset fuzz -j "$(nproc)"
}

step "ci build and tests" ci "$@"
if (($# == 0)); then
  step "CUDA build, compiled (build/cuda-ci; gpu tests run only where there is a GPU)" cuda
  step "unit tests under ASan + UBSan (build/asan)" asan
  step "fuzzers, a few seconds each (build/fuzz)" fuzz
fi
