#!/usr/bin/env bash
# The whole test suite: installs what is missing, builds (warnings are errors), runs CTest; then
# the hardening steps: the unit tests built with AddressSanitizer + UBSan (the asan preset, only
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
fuzz() {
  [[ -f build/fuzz/CMakeCache.txt ]] || cmake --preset fuzz
  cmake --build build/fuzz -j "$(nproc)" --target pipeline_fuzzers
  ctest --preset fuzz -j "$(nproc)"
}

step "ci build and tests" ci "$@"
if (($# == 0)); then
  step "unit tests under ASan + UBSan (build/asan)" asan
  step "fuzzers, a few seconds each (build/fuzz)" fuzz
fi
