#!/usr/bin/env bash
# A straggler among replicas, with and without re-dealing its microbatches to its peer:
#   rebalance_scenario.sh PIPELINE_PROFILE PIPELINE_SIMULATE TRAIN_FASHION_MNIST PLAN FACTOR MPIRUN...
# trains PLAN (a stage on 2 replicas) on 2 ranks under 1f1b-flush with 8 microbatches per
# minibatch: nominal, with rank 1 slowed FACTOR times (PIPELINE_TEST_SLOW_RANK=1:FACTOR) and
# round-robin dealing, and slowed with --rebalance; each twice, alternating, the faster kept. It
# checks that re-dealing recovers throughput (at least MIN_GAIN x the round-robin run, default
# 1.3) and that each slowed run's rate is within TOLERANCE (default 0.25) of the measured nominal
# rate with the slowdown `pipeline-simulate --slow-rank 1:FACTOR [--rebalance]` predicts on this
# machine's profile applied (straggler.py: as a ratio, or as added time per sample).
# Prints one row for bench/RESULTS.md.
set -euo pipefail
profile_tool=$1
simulate=$2
train=$3
plan=$4
factor=$5
shift 5
mpirun=("$@")
tolerance=${TOLERANCE:-0.25}
min_gain=${MIN_GAIN:-1.3}
steps=${STEPS:-200}
batch=${BATCH:-1024}
micro=8
work=$(mktemp -d "${TMPDIR:-/tmp}/rebalance.XXXXXX")
trap 'rm -rf "$work"' EXIT

"$profile_tool" --model mlp --batch $((batch / micro)) --threads 1 -o "$work/profile.json" \
  > "$work/profile.log" 2>&1 || { cat "$work/profile.log"; exit 1; }
sim() {  # sim NAME [FLAGS...]
  local name=$1
  shift
  "$simulate" --profile "$work/profile.json" --plan "$plan" --schedule 1f1b-flush \
    --microbatches $micro --minibatches 20 --json "$@" > "$work/$name.json"
}
sim nominal
sim slowed --slow-rank "1:$factor"
sim rebalanced --slow-rank "1:$factor" --rebalance

run() {  # run NAME [ENV...] [-- FLAGS...]: samples/s of a training run
  local name=$1
  shift
  local envs=() flags=()
  while [[ $# -gt 0 && $1 != -- ]]; do envs+=("$1"); shift; done
  [[ $# -gt 0 ]] && shift && flags=("$@")
  env "${envs[@]}" "${mpirun[@]}" 2 "$train" --model mlp --plan "$plan" --schedule 1f1b-flush \
    --microbatches $micro --steps "$steps" --batch $batch --threads 1 --eval-batch 10000 \
    "${flags[@]}" > "$work/$name.log" 2>&1 || { cat "$work/$name.log"; exit 1; }
  grep -h "rebalance at" "$work/$name.log" >&2 || true
  sed -n 's/.*of training: \([0-9.]*\) samples\/s.*/\1/p' "$work/$name.log" | tail -1
}
slow="PIPELINE_TEST_SLOW_RANK=1:$factor"
n1=$(run nominal1 PIPELINE_PROGRESS=lines)
s1=$(run slowed1 "$slow")
r1=$(run rebalanced1 "$slow" -- --rebalance)
n2=$(run nominal2 PIPELINE_PROGRESS=lines)
s2=$(run slowed2 "$slow")
r2=$(run rebalanced2 "$slow" -- --rebalance)
echo "measured samples/s: nominal $n1, $n2; slowed $s1, $s2; slowed with --rebalance $r1, $r2"
PYTHONPATH="$(dirname "$0")" python3 - "$work" "$factor" "$tolerance" "$min_gain" "$n1" "$n2" \
  "$s1" "$s2" "$r1" "$r2" <<'PY'
import json, sys
from straggler import check
work, factor, tolerance, min_gain = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
n, s, r = (max(float(a), float(b)) for a, b in zip(sys.argv[5::2], sys.argv[6::2]))
sim = {k: json.load(open(f"{work}/{k}.json"))["samples_per_s"] for k in ("nominal", "slowed", "rebalanced")}
pred_s, pred_r = sim["slowed"] / sim["nominal"], sim["rebalanced"] / sim["nominal"]
print(f"| {factor:g}x | {n:,.0f} | {s:,.0f} (x{s / n:.3f}) | {r:,.0f} (x{r / n:.3f}) | "
      f"{r / s:.2f}x | x{pred_s:.3f} / x{pred_r:.3f} ({pred_r / pred_s:.2f}x) |")
failed = []
if r < min_gain * s:
    failed.append(f"re-dealing gained only {r / s:.2f}x over round-robin (at least {min_gain}x expected)")
for name, measured, simulated in (("round-robin", s, sim["slowed"]), ("re-dealt", r, sim["rebalanced"])):
    line, problem = check(name, n, measured, sim["nominal"], simulated, tolerance)
    print(line)
    if problem:
        failed.append(problem)
assert not failed, "; ".join(failed)
PY
