#!/usr/bin/env bash
# An interleaved plan as a user makes and runs it:
#   interleaved_scenario.sh PIPELINE_PROFILE PIPELINE_PARTITION PIPELINE_SIMULATE TRAIN MPIRUN...
# profile the mlp, plan it with --virtual-stages 2 on 2 workers (plan.json version 2, 4 stages,
# stage k on rank k mod 2), draw its interleaved timeline, train it on 2 ranks under mpirun with
# the plan's default schedule (interleaved-1f1b): the loss trajectory equals one process's
# (fp32 rounding: microbatch gradients accumulate instead of one batch's); a schedule for one
# stage per rank is refused, naming the fix.
set -euo pipefail
profile=$1
partition=$2
simulate=$3
train=$4
shift 4
mpirun=("$@")
work=$(mktemp -d "${TMPDIR:-/tmp}/interleaved.XXXXXX")
trap 'rm -rf "$work"' EXIT
common=(--model mlp --batch 32 --threads 1 --eval-batch 10000 --lr 1e-3)

"$profile" --model mlp --batch 32 --repeat 2 -o "$work/profile.json" > "$work/profile.log" 2>&1 ||
  { cat "$work/profile.log"; exit 1; }
"$partition" --profile "$work/profile.json" --workers 2 --bandwidth 10Gbit/s --virtual-stages 2 \
  -o "$work/plan.json" > "$work/partition.log" 2>&1 || { cat "$work/partition.log"; exit 1; }
"$simulate" --profile "$work/profile.json" --plan "$work/plan.json" --schedule interleaved \
  --level 2:10Gbit/s --svg "$work/timeline.svg" > "$work/simulate.log" 2>&1 ||
  { cat "$work/simulate.log"; exit 1; }
grep -q "schedule interleaved-1f1b: 2 ranks" "$work/simulate.log" || { cat "$work/simulate.log"; exit 1; }
grep -q "<svg" "$work/timeline.svg"

"$train" "${common[@]}" --steps 16 --metrics "$work/single.jsonl" > "$work/single.log" 2>&1 ||
  { cat "$work/single.log"; exit 1; }
"${mpirun[@]}" 2 "$train" "${common[@]}" --plan "$work/plan.json" --steps 16 \
  --metrics "$work/interleaved.jsonl" > "$work/interleaved.log" 2>&1 ||
  { cat "$work/interleaved.log"; exit 1; }
grep -q "schedule interleaved-1f1b" "$work/interleaved.log" || { cat "$work/interleaved.log"; exit 1; }
if "${mpirun[@]}" 2 "$train" "${common[@]}" --plan "$work/plan.json" --steps 2 \
    --schedule 1f1b-flush > "$work/refused.log" 2>&1; then
  echo "1f1b-flush ran on an interleaved plan"; exit 1
fi
grep -q "interleaved-1f1b" "$work/refused.log" || { cat "$work/refused.log"; exit 1; }

python3 - "$work/plan.json" "$work/single.jsonl" "$work/interleaved.jsonl" <<'PY'
import json, sys
plan = json.load(open(sys.argv[1]))
assert plan["format"] == "pipeline.plan/2" and plan["virtual_stages"] == 2, plan["format"]
assert [s["ranks"] for s in plan["stages"]] == [[0], [1], [0], [1]], plan["stages"]
def losses(path):
    return [r["loss"] for r in map(json.loads, open(path)) if "step" in r]
single, run = losses(sys.argv[2]), losses(sys.argv[3])
assert len(single) == len(run) == 16, (len(single), len(run))
worst = max(abs(a - b) / abs(b) for a, b in zip(run, single))
assert worst < 1e-4, f"interleaved 1F1B drifts from one process by {worst:.2e}"
print(f"interleaved plan (2 stages per rank, 2 ranks): within {worst:.1e} of one process over 16 steps")
PY
