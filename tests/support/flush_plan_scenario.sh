#!/usr/bin/env bash
# Plans made for flush schedules, used as a user would:
#   flush_plan_scenario.sh PIPELINE_PROFILE PIPELINE_PARTITION PIPELINE_SIMULATE TRAIN MPIRUN...
# pipeline-partition --schedule 1f1b-flush|zb-h1 --microbatches 8 writes the schedule and the
# microbatch count into plan.json; pipeline-simulate and the trainer take both from it (and the
# deeper depths a plan over a slow link gives its stages), and the trained losses equal one
# process's (fp32 rounding); without --plan the trainer plans for the flush schedule it is asked
# to run.
set -euo pipefail
profile_bin=$1
partition_bin=$2
simulate_bin=$3
train=$4
shift 4
mpirun=("$@")
work=$(mktemp -d "${TMPDIR:-/tmp}/flush_plan.XXXXXX")
trap 'rm -rf "$work"' EXIT
run() { "$@" > "$work/out.log" 2>&1 || { cat "$work/out.log"; exit 1; }; }

run "$profile_bin" --model mlp --batch 8 --threads 1 -o "$work/profile.json"
run "$partition_bin" --profile "$work/profile.json" --workers 2 --bandwidth 10Gbit/s \
  --schedule 1f1b-flush --microbatches 8 --optimizer adamw -o "$work/flush.json"
grep -q "for 1f1b-flush with 8 microbatches per minibatch" "$work/out.log" ||
  { cat "$work/out.log"; echo "the partitioner did not say what the plan is for"; exit 1; }
# Over a slow link the stages start more microbatches than PipeDream's depths (2 and 1) so that
# the messages' round trips hide; the trainer runs those depths, and still equals one process.
run "$partition_bin" --profile "$work/profile.json" --workers 2 --bandwidth 100Mbit/s \
  --schedule zb-h1 --microbatches 8 --straight --optimizer adamw -o "$work/zb.json"
run "$simulate_bin" --profile "$work/profile.json" --plan "$work/zb.json"
grep -q "schedule zb-h1: 2 ranks, 8 microbatch(es)" "$work/out.log" ||
  { cat "$work/out.log"; echo "pipeline-simulate did not take the plan's schedule"; exit 1; }
python3 - "$work/flush.json" "$work/zb.json" <<'PY'
import json, sys
for path, schedule in zip(sys.argv[1:], ["1f1b-flush", "zb-h1"]):
    plan = json.load(open(path))
    assert plan["schedule"] == schedule and plan["microbatches"] == 8, (path, plan)
zb = json.load(open(sys.argv[2]))
assert zb["config"] == "1-1"
assert zb["stages"][0]["in_flight"] > 2, zb["stages"]
PY

common=(--model mlp --batch 64 --threads 1 --eval-batch 10000 --steps 12)
run "$train" "${common[@]}" --metrics "$work/single.jsonl"
for plan in flush zb; do
  run "${mpirun[@]}" 2 "$train" "${common[@]}" --plan "$work/$plan.json" \
    --metrics "$work/$plan.jsonl"
  want=$(python3 -c "import json; print(json.load(open('$work/$plan.json'))['schedule'])")
  grep -q "schedule $want (8 microbatch(es) per minibatch of 64)" "$work/out.log" ||
    { cat "$work/out.log"; echo "the trainer did not run the plan's schedule and microbatches"; exit 1; }
done
# Without --plan the trainer plans for the flush schedule it is asked to run.
run "${mpirun[@]}" 2 "$train" "${common[@]}" --schedule zb-h1 --microbatches 8 \
  --metrics "$work/auto.jsonl"
grep -q "profiling mlp at batch 8 and partitioning it for 2 workers under zb-h1 with 8 microbatches" \
  "$work/out.log" &&
  grep -q "schedule zb-h1 (8 microbatch(es) per minibatch of 64)" "$work/out.log" ||
  { cat "$work/out.log"; echo "the trainer did not plan for the schedule it runs"; exit 1; }
python3 - "$work/single.jsonl" "$work/flush.jsonl" "$work/zb.jsonl" "$work/auto.jsonl" <<'PY'
import json, sys
def losses(path):
    return [r["loss"] for r in map(json.loads, open(path)) if "step" in r]
single = losses(sys.argv[1])
for name, path in zip(["1f1b-flush", "zb-h1", "zb-h1 (planned at start-up)"], sys.argv[2:]):
    run = losses(path)
    assert len(run) == len(single) == 12, (name, len(run), len(single))
    worst = max(abs(a - b) / abs(b) for a, b in zip(run, single))
    assert worst < 1e-4, f"the {name} plan drifts from one process by {worst:.2e}"
    print(f"{name} plan: within {worst:.1e} of one process over 12 steps")
PY
