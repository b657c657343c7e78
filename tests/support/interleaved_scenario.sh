#!/usr/bin/env bash
# An interleaved plan as a user makes and runs it:
#   interleaved_scenario.sh PIPELINE_PROFILE PIPELINE_PARTITION PIPELINE_SIMULATE TRAIN MPIRUN...
# profile the mlp, plan it with --virtual-stages 2 on 2 workers (plan.json version 2, 4 stages,
# stage k on rank k mod 2), draw its interleaved timeline, train it on 2 ranks under mpirun with
# the plan's default schedule (interleaved-1f1b) and its zero-bubble form (interleaved-zb-h1):
# the loss trajectories equal one process's (fp32 rounding: microbatch gradients accumulate
# instead of one batch's); a schedule for one stage per rank is refused, naming the fix. Then 4
# workers as data-parallel interleaved pipelines (the partitioner's own plan, and one given by
# hand), checkpointed and resumed. Last, the same in a V (--stage-placement v, zb-v): on 2 and
# on 4 workers the partitioner's plans train as one process, and the looped data-parallel run's
# checkpoint resumes on the V.
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
"${mpirun[@]}" 2 "$train" "${common[@]}" --plan "$work/plan.json" --steps 16 --schedule interleaved-zb-h1 \
  --metrics "$work/zero_bubble.jsonl" > "$work/zero_bubble.log" 2>&1 ||
  { cat "$work/zero_bubble.log"; exit 1; }
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
zero_bubble = losses(sys.argv[3].replace("interleaved.jsonl", "zero_bubble.jsonl"))
assert len(single) == len(run) == len(zero_bubble) == 16, (len(single), len(run), len(zero_bubble))
worst = max(abs(a - b) / abs(b) for a, b in zip(run, single))
assert worst < 1e-4, f"interleaved 1F1B drifts from one process by {worst:.2e}"
assert max(abs(a - b) / abs(b) for a, b in zip(zero_bubble, single)) < 1e-4, "interleaved ZB-H1 drifts"
print(f"interleaved plan (2 stages per rank, 2 ranks): within {worst:.1e} of one process over 16 steps")
PY

# Four workers: the partitioner's own plan (one pipeline of 4 or two data-parallel pipelines of
# 2, whichever it predicts faster), and two pipelines of 2 evaluated by hand through the CLI;
# both train to one process's losses, and the data-parallel one checkpoints and resumes
# bit-identically (each stage's shard written by its first replica).
"$partition" --profile "$work/profile.json" --workers 4 --bandwidth 10Gbit/s --virtual-stages 2 \
  -o "$work/plan4.json" > "$work/partition4.log" 2>&1 || { cat "$work/partition4.log"; exit 1; }
"$partition" --profile "$work/profile.json" --workers 4 --bandwidth 10Gbit/s --virtual-stages 2 \
  --stages 0:2x2,2:3x2,3:5x2,5:6x2 -o "$work/plan_dp.json" > "$work/partition_dp.log" 2>&1 ||
  { cat "$work/partition_dp.log"; exit 1; }
grep -q "2 data-parallel pipelines of 2 ranks" "$work/partition_dp.log" || { cat "$work/partition_dp.log"; exit 1; }
"$simulate" --profile "$work/profile.json" --plan "$work/plan_dp.json" --schedule interleaved \
  --level 4:10Gbit/s > "$work/simulate_dp.log" 2>&1 || { cat "$work/simulate_dp.log"; exit 1; }
grep -q "schedule interleaved-1f1b: 4 ranks" "$work/simulate_dp.log" || { cat "$work/simulate_dp.log"; exit 1; }
for plan in plan4 plan_dp; do
  "${mpirun[@]}" 4 "$train" "${common[@]}" --plan "$work/$plan.json" --steps 16 \
    --metrics "$work/$plan.jsonl" > "$work/$plan.log" 2>&1 || { cat "$work/$plan.log"; exit 1; }
done
"${mpirun[@]}" 4 "$train" "${common[@]}" --plan "$work/plan_dp.json" --steps 16 \
  --checkpoint-dir "$work/ckpt" --checkpoint-every 8 --checkpoint-keep 4 --metrics "$work/a.jsonl" \
  > "$work/a.log" 2>&1 || { cat "$work/a.log"; exit 1; }
mkdir "$work/resume" && cp -r "$work/ckpt/step-000000008" "$work/resume/"
"${mpirun[@]}" 4 "$train" "${common[@]}" --plan "$work/plan_dp.json" --steps 16 \
  --resume "$work/resume" --metrics "$work/b.jsonl" > "$work/b.log" 2>&1 || { cat "$work/b.log"; exit 1; }
for s in 0 1 2 3; do
  cmp "$work/ckpt/step-000000016/stage-$s.safetensors" "$work/resume/step-000000016/stage-$s.safetensors" ||
    { echo "the resumed data-parallel run's stage $s differs"; exit 1; }
done

python3 - "$work" <<'PY'
import json, sys
w = sys.argv[1]
dp = json.load(open(f"{w}/plan_dp.json"))
assert [s["ranks"] for s in dp["stages"]] == [[0, 2], [1, 3], [0, 2], [1, 3]], dp["stages"]
own = json.load(open(f"{w}/plan4.json"))
pipelines = own["stages"][0]["replicas"]
def losses(path):
    return [r["loss"] for r in map(json.loads, open(path)) if "step" in r]
single = losses(f"{w}/single.jsonl")
for name in ("plan4", "plan_dp"):
    run = losses(f"{w}/{name}.jsonl")
    assert len(run) == 16, (name, len(run))
    worst = max(abs(a - b) / abs(b) for a, b in zip(run, single))
    assert worst < 1e-4, f"{name} drifts from one process by {worst:.2e}"
b = losses(f"{w}/b.jsonl")
assert b == losses(f"{w}/a.jsonl")[8:], "the resumed data-parallel run's losses differ"
print(f"4 workers: the partitioner's plan ({pipelines} pipeline(s)) and 2 data-parallel pipelines "
      f"by hand train as one process; resumed at step 8 bit-identically")
PY

# A V: stages k and 3 - k on rank k, under zb-v (the plan's schedule), on 2 workers and as the
# partitioner's 4-worker plan; the V resumes the looped data-parallel run's step-8 checkpoint and
# continues it as that run did (fp32 rounding: the V's microbatches sum in another order).
"$partition" --profile "$work/profile.json" --workers 2 --bandwidth 10Gbit/s --stage-placement v \
  -o "$work/plan_v.json" > "$work/partition_v.log" 2>&1 || { cat "$work/partition_v.log"; exit 1; }
grep -q "2 virtual stages per worker in a V" "$work/partition_v.log" || { cat "$work/partition_v.log"; exit 1; }
"$simulate" --profile "$work/profile.json" --plan "$work/plan_v.json" --schedule interleaved \
  --level 2:10Gbit/s > "$work/simulate_v.log" 2>&1 || { cat "$work/simulate_v.log"; exit 1; }
grep -q "schedule zb-v: 2 ranks" "$work/simulate_v.log" || { cat "$work/simulate_v.log"; exit 1; }
"$partition" --profile "$work/profile.json" --workers 4 --bandwidth 10Gbit/s --stage-placement v \
  -o "$work/plan_v4.json" > "$work/partition_v4.log" 2>&1 || { cat "$work/partition_v4.log"; exit 1; }
"${mpirun[@]}" 2 "$train" "${common[@]}" --plan "$work/plan_v.json" --steps 16 \
  --metrics "$work/v.jsonl" > "$work/v.log" 2>&1 || { cat "$work/v.log"; exit 1; }
grep -q "schedule zb-v" "$work/v.log" || { cat "$work/v.log"; exit 1; }
"${mpirun[@]}" 4 "$train" "${common[@]}" --plan "$work/plan_v4.json" --steps 16 \
  --metrics "$work/v4.jsonl" > "$work/v4.log" 2>&1 || { cat "$work/v4.log"; exit 1; }
if "${mpirun[@]}" 2 "$train" "${common[@]}" --plan "$work/plan_v.json" --steps 2 \
    --schedule interleaved-1f1b > "$work/refused_v.log" 2>&1; then
  echo "interleaved-1f1b ran on a V"; exit 1
fi
grep -q "run it with --schedule zb-v" "$work/refused_v.log" || { cat "$work/refused_v.log"; exit 1; }
mkdir "$work/resume_v" && cp -r "$work/ckpt/step-000000008" "$work/resume_v/"
"${mpirun[@]}" 2 "$train" "${common[@]}" --plan "$work/plan_v.json" --steps 16 \
  --resume "$work/resume_v" --metrics "$work/c.jsonl" > "$work/c.log" 2>&1 || { cat "$work/c.log"; exit 1; }

python3 - "$work" <<'PY'
import json, sys
w = sys.argv[1]
v = json.load(open(f"{w}/plan_v.json"))
assert v["schedule"] == "zb-v", v["schedule"]
assert [s["ranks"] for s in v["stages"]] == [[0], [1], [1], [0]], v["stages"]
def losses(path):
    return [r["loss"] for r in map(json.loads, open(path)) if "step" in r]
single = losses(f"{w}/single.jsonl")
for name in ("v", "v4"):
    run = losses(f"{w}/{name}.jsonl")
    assert len(run) == 16, (name, len(run))
    worst = max(abs(a - b) / abs(b) for a, b in zip(run, single))
    assert worst < 1e-4, f"{name} drifts from one process by {worst:.2e}"
c, a = losses(f"{w}/c.jsonl"), losses(f"{w}/a.jsonl")[8:]
assert len(c) == 8 and max(abs(x - y) / abs(y) for x, y in zip(c, a)) < 1e-4, (c, a)
print("V placement (zb-v): the partitioner's plans on 2 and 4 workers train as one process; "
      "resumed from the looped run's checkpoint")
PY
