#!/usr/bin/env bash
# Builds the libFuzzer targets (the `fuzz` preset: clang, ASan + UBSan) and runs each for
# SECONDS (default 5) over its corpus, then prints per target the inputs executed, the coverage
# reached and the corpus size. New inputs are kept in build/fuzz/fuzz/corpus/<target> (the seeds
# in fuzz/corpus/ are only read); a finding leaves its input in build/fuzz/fuzz/artifacts/ and
# makes the script fail. Extra arguments go to every fuzzer, e.g. `scripts/fuzz.sh 60 -jobs=2`.
#   bash scripts/fuzz.sh            # 5 s per target
#   bash scripts/fuzz.sh 600        # the longer run recorded in bench/RESULTS.md
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-5}
shift || true
[[ $seconds =~ ^[0-9]+$ ]] || { echo "usage: scripts/fuzz.sh [SECONDS] [libFuzzer flags...]" >&2; exit 2; }

bash scripts/setup.sh
[[ -f build/fuzz/CMakeCache.txt ]] || cmake --preset fuzz
cmake --build build/fuzz -j "$(nproc)" --target pipeline_fuzzers

dir=build/fuzz/fuzz
# shellcheck source=/dev/null
source "$dir/sanitizer_env.sh"
mkdir -p "$dir/logs" "$dir/artifacts"
failed=()
rows=()
for bin in "$dir"/fuzz_*; do
  [[ -x $bin ]] || continue
  name=${bin##*/fuzz_}
  mkdir -p "$dir/corpus/$name"
  log="$dir/logs/$name.log"
  echo "fuzz: $name for ${seconds}s (log: $log)"
  status=0
  "$bin" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
    -artifact_prefix="$dir/artifacts/$name-" "$@" "$dir/corpus/$name" "fuzz/corpus/$name" \
    >"$log" 2>&1 || status=$?
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  per_s=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
  # The last status line: "#N DONE cov: C ft: F corp: U/SIZE ..."
  last=$(grep -E '^#[0-9]+.*cov: ' "$log" | tail -1 || true)
  cov=$(sed -nE 's/.* cov: ([0-9]+).*/\1/p' <<<"$last")
  ft=$(sed -nE 's/.* ft: ([0-9]+).*/\1/p' <<<"$last")
  corp=$(sed -nE 's/.* corp: ([0-9]+\/[0-9]+[a-zA-Z]*).*/\1/p' <<<"$last")
  result=ok
  if ((status != 0)); then
    result="FAILED (exit $status)"
    failed+=("$name")
    grep -E '^(==[0-9]+==ERROR|SUMMARY|.*runtime error|artifact_prefix|Test unit written)' "$log" \
      | head -20 || true
  fi
  rows+=("$(printf '%-16s %6ss %12s %9s %6s %7s %14s  %s' "$name" "$seconds" "${runs:-?}" \
    "${per_s:-?}" "${cov:-?}" "${ft:-?}" "${corp:-?}" "$result")")
done

printf '\n%-16s %7s %12s %9s %6s %7s %14s  %s\n' target time runs runs/s cov ft corpus result
printf '%s\n' "${rows[@]}"
if ((${#failed[@]})); then
  echo "fuzz: findings in ${failed[*]}; inputs in $dir/artifacts/, logs in $dir/logs/" >&2
  exit 1
fi
