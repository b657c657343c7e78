#!/usr/bin/env bash
# Configures and builds with a CMake preset (default: cpu-release), installing dependencies first.
set -euo pipefail
cd "$(dirname "$0")/.."
preset=${PIPELINE_PRESET:-cpu-release}
bash scripts/setup.sh
[[ -f build/$preset/CMakeCache.txt ]] || cmake --preset "$preset"
cmake --build "build/$preset" -j "$(nproc)"
