#!/usr/bin/env bash
# The whole test suite: installs what is missing, builds (warnings are errors), runs CTest.
# Extra arguments go to ctest, e.g. `scripts/test.sh -L unit`.
set -euo pipefail
cd "$(dirname "$0")/.."
PIPELINE_PRESET=ci bash scripts/build.sh
ctest --preset ci -j "$(nproc)" "$@"
