#!/usr/bin/env bash
# A straggler among replicas, measured and predicted:
#   slow_rank_scenario.sh PIPELINE_PROFILE PIPELINE_SIMULATE TRAIN_FASHION_MNIST PLAN FACTOR MPIRUN...
# trains PLAN (a stage on 2 replicas) on 2 ranks, nominal and with rank 1 slowed FACTOR times
# (PIPELINE_TEST_SLOW_RANK=1:FACTOR), in two nominal-then-slowed pairs, and checks that the
# measured throughput drops by the factor `pipeline-simulate --slow-rank 1:FACTOR` predicts on this
# machine's profile: in one pair at least, the slowed rate within TOLERANCE (default 0.25, a shared
# 2-core machine) of that pair's nominal rate with the simulator's slowdown applied (straggler.py:
# as a ratio, or as added time per sample).
set -euo pipefail
profile_tool=$1
simulate=$2
train=$3
plan=$4
factor=$5
shift 5
mpirun=("$@")
tolerance=${TOLERANCE:-0.25}
steps=${STEPS:-200}
work=$(mktemp -d "${TMPDIR:-/tmp}/slow_rank.XXXXXX")
trap 'rm -rf "$work"' EXIT
batch=${BATCH:-1024}

"$profile_tool" --model mlp --batch $batch --threads 1 -o "$work/profile.json" > "$work/profile.log" 2>&1 ||
  { cat "$work/profile.log"; exit 1; }
"$simulate" --profile "$work/profile.json" --plan "$plan" --json > "$work/nominal.json"
"$simulate" --profile "$work/profile.json" --plan "$plan" --slow-rank "1:$factor" --json \
  > "$work/slow.json"

run() {  # run NAME [ENV...]: samples/s of a training run
  local name=$1
  shift
  env "$@" "${mpirun[@]}" 2 "$train" --model mlp --plan "$plan" --schedule 1f1b-stash \
    --steps "$steps" --batch $batch --threads 1 --eval-batch 10000 > "$work/$name.log" 2>&1 ||
    { cat "$work/$name.log"; exit 1; }
  sed -n 's/.*of training: \([0-9.]*\) samples\/s.*/\1/p' "$work/$name.log" | tail -1
}
# Two pairs, each a nominal run and the slowed run right after it: each slowed rate is judged
# against the nominal rate measured next to it, on the machine as it was then (a shared machine's
# speed drifts between runs: one CI run measured the two slowed runs 36% apart, and the faster
# slowed run against the faster nominal one, taken from the other pair, failed by 39%). The case
# passes when one pair agrees within the tolerance.
n1=$(run nominal1)
s1=$(run slow1 PIPELINE_TEST_SLOW_RANK="1:$factor")
n2=$(run nominal2)
s2=$(run slow2 PIPELINE_TEST_SLOW_RANK="1:$factor")
echo "measured samples/s: nominal $n1, $n2; slowed $s1, $s2"
PYTHONPATH="$(dirname "$0")" python3 - "$work/nominal.json" "$work/slow.json" "$n1" "$s1" "$n2" \
  "$s2" "$factor" "$tolerance" <<'PY'
import json, sys
from straggler import check
nom, slow = (json.load(open(p))["samples_per_s"] for p in sys.argv[1:3])
pairs = [(float(sys.argv[3]), float(sys.argv[4])), (float(sys.argv[5]), float(sys.argv[6]))]
factor, tolerance = float(sys.argv[7]), float(sys.argv[8])
problems = []
for i, (measured_nominal, measured_slow) in enumerate(pairs, 1):
    line, problem = check(f"pair {i}: rank 1 of a 2-replica stage slowed {factor:g}x",
                          measured_nominal, measured_slow, nom, slow, tolerance)
    print(line)
    problems.append(problem)
assert any(p is None for p in problems), "; ".join(problems)
PY
