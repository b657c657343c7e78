#!/usr/bin/env bash
# Activation recomputation as a user reaches it:
#   recompute_scenario.sh PIPELINE_PROFILE PIPELINE_PARTITION TRAIN_FASHION_MNIST MPIRUN...
# profiles fashion-cnn, asks pipeline-partition for the smallest memory per worker that admits a
# plan with and without recomputation, and with a cap between the two: --recompute none fails
# naming the fix, --recompute auto writes a plan with a recomputing stage, and the trainer runs
# that plan on 2 ranks, reporting every rank's measured peak next to the planner's estimate.
set -euo pipefail
profile=$1
partition=$2
train=$3
shift 3
mpirun=("$@")
work=$(mktemp -d "${TMPDIR:-/tmp}/recompute_scenario.XXXXXX")
trap 'rm -rf "$work"' EXIT
# (fashion-cnn: recomputing a stage keeps its input instead of its convolutions' activations, many
# times larger; the mlp's first layer keeps its input whichever way, which a recomputing stage
# keeps too, and no cap admits only recomputing plans of it.)
batch=256

"$profile" --model fashion-cnn --batch "$batch" --threads 1 -o "$work/profile.json" > /dev/null
topo=(--profile "$work/profile.json" --workers 2 --bandwidth 10Gbit/s --straight --optimizer adamw)
# The smallest memory that admits a plan, from the error of a 1-byte cap.
smallest() {
  if "$partition" "${topo[@]}" --memory 1 --recompute "$1" -q > "$work/err" 2>&1; then
    echo "a 1-byte cap was accepted" >&2
    exit 1
  fi
  sed -n 's/.*admits a plan is about \([0-9.e+]*\) bytes.*/\1/p' "$work/err"
}
stash=$(smallest none)
recompute=$(smallest auto)
cap=$(python3 -c "import sys; s, r = map(float, sys.argv[1:]); assert r < s, (r, s); print(int((s + r) / 2))" \
      "$stash" "$recompute")
echo "smallest memory per worker: stashing $stash B, recomputing $recompute B; cap $cap B"

if "$partition" "${topo[@]}" --memory "$cap" --recompute none -q > "$work/none.log" 2>&1; then
  echo "--recompute none found a plan under a cap that only recomputation meets" >&2
  exit 1
fi
grep -q -- "--recompute auto" "$work/none.log" || { cat "$work/none.log"; exit 1; }

"$partition" "${topo[@]}" --memory "$cap" --recompute auto -o "$work/plan.json" | tee "$work/plan.txt"
grep -q '"recompute": true' "$work/plan.json" || { cat "$work/plan.json"; exit 1; }

"${mpirun[@]}" 2 "$train" --model fashion-cnn --plan "$work/plan.json" --schedule 1f1b-stash \
  --batch "$batch" --steps 10 --threads 1 --eval-batch 10000 --metrics "$work/metrics.jsonl" \
  > "$work/train.log" 2>&1 || { cat "$work/train.log"; exit 1; }
cat "$work/train.log" | grep -v "^\[" || true
grep -q "test accuracy: [01]\.[0-9][0-9][0-9][0-9]" "$work/train.log" || { cat "$work/train.log"; exit 1; }
python3 - "$work/metrics.jsonl" "$work/plan.json" "$cap" "$batch" <<'PY'
import json, sys
records = [json.loads(l) for l in open(sys.argv[1])]
plan = json.load(open(sys.argv[2]))
cap, batch = float(sys.argv[3]), int(sys.argv[4])
memory = {r["memory_rank"]: r for r in records if "memory_rank" in r}
assert sorted(memory) == [0, 1], memory
for rank, r in sorted(memory.items()):
    stage = plan["stages"][r["stage"]]
    assert r["recompute"] == stage.get("recompute", False), (r, stage)
    # A stashing input stage also holds its in-flight microbatches of input data (28x28 floats
    # per sample) as its first layer keeps them; a recomputing one is charged them.
    data = 2 * batch * 784 * 4 if r["stage"] == 0 and not r["recompute"] else 0
    print(f"rank {rank}: measured peak {r['measured_peak_bytes']} B, planned {r['planned_bytes']:.0f} B, "
          f"cap {cap:.0f} B, input data {data} B")
    assert r["measured_peak_bytes"] - data <= cap, (r, cap)
PY
