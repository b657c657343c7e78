#!/usr/bin/env bash
# The planner's memory estimate against what a run's allocator measures, as a user reaches it:
#   memory_scenario.sh PIPELINE_PROFILE PIPELINE_PARTITION PIPELINE_SIMULATE TRAIN_TRANSFORMER_LM
#                      TRAIN_FASHION_MNIST MPIRUN...
# profiles a transformer-lm (each block's passes make temporaries: the profile's workspace_bytes),
# partitions it for 2 workers, trains the plan on 2 ranks and checks every rank's allocator peak
# against the plan's estimate (within 5%; 0.6-1.8% below it when measured) and the executor's own
# count against the estimate less its working memory (within 2%: 1.1% above on the input stage,
# which holds an output until it is sent; to the byte on the last, which holds the loss's
# gradient, 1.9% above when the plan charged that as working memory); without the working memory
# the estimate was 14-20% short, without the posted receive buffers 4-5%. Then fashion-cnn on a
# plan whose input stage (conv1, relu1) holds large gradients in its backward and whose second
# starts at a max pool: every rank's allocator peak within 15% of the estimate (6% and 3% when
# measured; the input stage's was 26% short without its layers' gradient pairs).
set -euo pipefail
profile=$1
partition=$2
simulate=$3
train=$4
train_fashion=$5
shift 5
mpirun=("$@")
work=$(mktemp -d "${TMPDIR:-/tmp}/memory_scenario.XXXXXX")
trap 'rm -rf "$work"' EXIT
model=(--dim 128 --blocks 4 --seq-len 64 --heads 4)

"$profile" --model transformer-lm "${model[@]}" --batch 16 --threads 1 --repeat 2 \
  -o "$work/profile.json" > /dev/null
"$partition" --profile "$work/profile.json" --workers 2 --bandwidth 10GB/s --straight \
  --optimizer adamw -o "$work/plan.json" > "$work/plan.txt"
"${mpirun[@]}" 2 "$train" --plan "$work/plan.json" "${model[@]}" --batch 16 --steps 25 \
  --threads 1 --metrics "$work/metrics.jsonl" > "$work/train.log" 2>&1 || {
  cat "$work/train.log"
  exit 1
}
grep -A3 "^memory per rank" "$work/train.log"
python3 - "$work/profile.json" "$work/plan.json" "$work/metrics.jsonl" <<'PY'
import json, sys
profile = json.load(open(sys.argv[1]))
plan = json.load(open(sys.argv[2]))
memory = {r["memory_rank"]: r for r in map(json.loads, open(sys.argv[3])) if "memory_rank" in r}
blocks = [l for l in profile["layers"] if l["kind"] == "TransformerBlock"]
assert blocks and all(l.get("workspace_bytes", 0) > 0 for l in blocks), blocks
assert sorted(memory) == [0, 1], memory
for rank, r in sorted(memory.items()):
    stage = plan["stages"][r["stage"]]["predicted"]
    assert r["planned_bytes"] == stage["memory_bytes"], (r, stage)
    assert r["planned_workspace_bytes"] == stage.get("workspace_bytes", 0) > 0, (r, stage)
    held = r["planned_bytes"] - r["planned_workspace_bytes"]
    print(f"rank {rank}: allocator peak {r['allocator_peak_bytes']} B, planned {r['planned_bytes']:.0f} B "
          f"(working memory {r['planned_workspace_bytes']:.0f} B); executor {r['measured_peak_bytes']} B")
    assert abs(r["allocator_peak_bytes"] - r["planned_bytes"]) <= 0.05 * r["planned_bytes"], r
    assert abs(r["measured_peak_bytes"] - held) <= 0.02 * held, r
PY

"$profile" --model fashion-cnn --batch 64 --threads 1 --repeat 2 -o "$work/cnn_profile.json" > /dev/null
"$partition" --profile "$work/cnn_profile.json" --workers 2 --bandwidth 10GB/s --stages 0:2,2:10 \
  --optimizer adamw -o "$work/cnn_plan.json" > "$work/cnn_plan.txt" 2>&1
"${mpirun[@]}" 2 "$train_fashion" --plan "$work/cnn_plan.json" --batch 64 --steps 20 --threads 1 \
  --eval-batch 2000 --metrics "$work/cnn_metrics.jsonl" > "$work/cnn_train.log" 2>&1 || {
  cat "$work/cnn_train.log"
  exit 1
}
grep -A3 "^memory per rank" "$work/cnn_train.log"
python3 - "$work/cnn_metrics.jsonl" <<'PY'
import json, sys
memory = {r["memory_rank"]: r for r in map(json.loads, open(sys.argv[1])) if "memory_rank" in r}
assert sorted(memory) == [0, 1], memory
for rank, r in sorted(memory.items()):
    ratio = r["allocator_peak_bytes"] / r["planned_bytes"]
    print(f"fashion-cnn rank {rank}: allocator peak {r['allocator_peak_bytes']} B, planned "
          f"{r['planned_bytes']:.0f} B ({ratio:.3f})")
    assert abs(ratio - 1) <= 0.15, r
PY

# The same model under schedules the plan was not made for, as pipeline-simulate predicts them
# (profiled at the microbatch size): GPipe holds every microbatch of a minibatch, ZB-H1 the
# output gradients its weight passes read. What the executor holds equals the simulation to the
# byte on the last stage (the input stage holds an output until it is sent besides: the working
# memory's unfinished send; its data are its microbatches' in flight, loaded one at a time);
# the allocator's peak within 15% of the simulated peak (0.96-1.06 when measured). Given --profile,
# the trainer reports the same simulated peak itself.
"$profile" --model fashion-cnn --batch 16 --threads 1 --repeat 2 -o "$work/cnn16.json" > /dev/null
"$partition" --profile "$work/cnn16.json" --workers 2 --bandwidth 10GB/s --stages 0:4,4:10 \
  --optimizer momentum -o "$work/cnn16_plan.json" > /dev/null 2>&1
for schedule in gpipe zb-h1; do
  "$simulate" --profile "$work/cnn16.json" --plan "$work/cnn16_plan.json" --schedule $schedule \
    --microbatches 4 --microbatch-size 16 --json > "$work/sim_$schedule.json"
  "${mpirun[@]}" 2 "$train_fashion" --plan "$work/cnn16_plan.json" --profile "$work/cnn16.json" \
    --schedule $schedule \
    --microbatches 4 --batch 64 --steps 12 --threads 1 --optimizer sgd --momentum 0.9 \
    --eval-batch 2000 --metrics "$work/m_$schedule.jsonl" > "$work/train_$schedule.log" 2>&1 || {
    cat "$work/train_$schedule.log"
    exit 1
  }
  python3 - "$schedule" "$work/sim_$schedule.json" "$work/m_$schedule.jsonl" "$work/cnn16.json" <<'PY'
import json, sys
schedule = sys.argv[1]
sim = {r["rank"]: r for r in json.load(open(sys.argv[2]))["per_rank"]}
memory = {r["memory_rank"]: r for r in map(json.loads, open(sys.argv[3])) if "memory_rank" in r}
output = json.load(open(sys.argv[4]))["layers"][3]["output_bytes"]  # conv2's, per microbatch
assert sorted(memory) == [0, 1], memory
for rank, r in sorted(memory.items()):
    s = sim[rank]
    held = s["peak_memory_bytes"] - s["workspace_bytes"]
    ratio = r["allocator_peak_bytes"] / s["peak_memory_bytes"]
    print(f"{schedule} rank {rank}: allocator peak {r['allocator_peak_bytes']} B, simulated "
          f"{s['peak_memory_bytes']} B ({ratio:.3f}); executor {r['measured_peak_bytes']} B, "
          f"simulated {held} B besides working memory")
    assert abs(ratio - 1) <= 0.15, (r, s)
    assert r["simulated_peak_bytes"] == s["peak_memory_bytes"], (r, s)  # the trainer's --profile
    if rank == 1:
        assert abs(r["measured_peak_bytes"] - held) <= 0.001 * held, (r, s)
    else:
        assert held <= r["measured_peak_bytes"] <= held + output, (r, s)
PY
done
