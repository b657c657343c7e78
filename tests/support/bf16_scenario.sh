#!/usr/bin/env bash
# bf16 mixed precision as a user reaches it:
#   bf16_scenario.sh PIPELINE_PROFILE PIPELINE_PARTITION TRAIN_FASHION_MNIST TRAIN_TRANSFORMER_LM MPIRUN...
# profiles the mlp with --dtype bf16 (a "bfloat16" profile that knows the bytes of weight versions
# stashed in bf16), partitions it for 2 workers (bf16 transfers by default; the plan says
# "dtype": "bfloat16"), trains that plan under 1f1b-stash as the plan says (bf16, no --dtype) and
# with --dtype float32 (a warning: the plan assumes bf16), and checks that the bf16 run learns,
# stashes its weight versions in fewer bytes and holds what the planner estimated; then trains a small
# transformer-lm for 200 steps in float32 and in bf16 and checks that the losses agree within 2%.
# TRAIN_TRANSFORMER_LM may be "-" where its training text is missing.
set -euo pipefail
profile=$1
partition=$2
train=$3
train_lm=$4
shift 4
mpirun=("$@")
work=$(mktemp -d "${TMPDIR:-/tmp}/bf16_scenario.XXXXXX")
trap 'rm -rf "$work"' EXIT
batch=128

"$profile" --model mlp --batch "$batch" --threads 1 --dtype bf16 --repeat 3 -o "$work/profile.json" \
  > "$work/profile.txt"
grep -q '"dtype": "bfloat16"' "$work/profile.json" || { cat "$work/profile.json"; exit 1; }
grep -q '"stashed_parameter_bytes"' "$work/profile.json" || { cat "$work/profile.json"; exit 1; }
"$partition" --profile "$work/profile.json" --workers 2 --bandwidth 10Gbit/s --straight --optimizer adamw \
  -o "$work/plan.json" > "$work/plan.txt"
cat "$work/plan.txt"
grep -q '"dtype": "bfloat16"' "$work/plan.json" || { cat "$work/plan.json"; exit 1; }

for dtype in bf16 float32; do
  flag=()
  [ "$dtype" = float32 ] && flag=(--dtype float32)  # bf16: as the plan says
  "${mpirun[@]}" 2 "$train" --model mlp --plan "$work/plan.json" --schedule 1f1b-stash "${flag[@]}" \
    --batch "$batch" --steps 40 --threads 1 --eval-batch 10000 \
    --metrics "$work/$dtype.jsonl" > "$work/$dtype.log" 2>&1 || { cat "$work/$dtype.log"; exit 1; }
  grep -q "test accuracy: [01]\.[0-9][0-9][0-9][0-9]" "$work/$dtype.log" || {
    cat "$work/$dtype.log"
    exit 1
  }
done
grep -q "mixed precision: bf16 products" "$work/bf16.log" || { cat "$work/bf16.log"; exit 1; }
grep -q "the plan was made from a bfloat16 profile but the run computes in float32" \
  "$work/float32.log" || { cat "$work/float32.log"; exit 1; }
grep "test accuracy" "$work/bf16.log" "$work/float32.log"

python3 - "$work/bf16.jsonl" "$work/float32.jsonl" "$work/bf16.log" "$work/float32.log" <<'PY'
import json, re, sys
def memory(path):
    return {r["memory_rank"]: r for r in map(json.loads, open(path)) if "memory_rank" in r}
bf16, fp32 = memory(sys.argv[1]), memory(sys.argv[2])
assert sorted(bf16) == [0, 1] and sorted(fp32) == [0, 1], (bf16, fp32)
def accuracy(path):
    return float(re.search(r"test accuracy: ([01]\.[0-9]+)", open(path).read()).group(1))
# 40 steps of the mlp: it learns (about 0.70), as in float32.
assert accuracy(sys.argv[3]) > 0.6 and abs(accuracy(sys.argv[3]) - accuracy(sys.argv[4])) < 0.02
for rank in (0, 1):
    b, f = bf16[rank], fp32[rank]
    print(f"rank {rank}: stashed weights bf16 {b['stashed_weight_bytes']} B, float32 "
          f"{f['stashed_weight_bytes']} B; measured peak {b['measured_peak_bytes']} B, planned "
          f"{b['planned_bytes']:.0f} B")
    assert b["parameter_bytes"] == f["parameter_bytes"], (b, f)
    if f["stashed_weight_bytes"] > 0:
        ratio = b["stashed_weight_bytes"] / f["stashed_weight_bytes"]
        assert 0.5 <= ratio < 0.55, ratio  # weight matrices in bf16, biases in float32
# The last stage holds what the planner charged for it besides the working memory of a pass
# (the input stage also holds its microbatches of input data, which no profile counts).
held = bf16[1]["planned_bytes"] - bf16[1]["planned_workspace_bytes"]
assert abs(bf16[1]["measured_peak_bytes"] - held) <= 0.02 * held, bf16[1]
PY

if [ "$train_lm" != "-" ]; then
  for dtype in float32 bf16; do
    "$train_lm" --steps 200 --threads 1 --dim 64 --blocks 2 --seq-len 32 --batch 8 \
      --dtype "$dtype" --metrics "$work/lm_$dtype.jsonl" > "$work/lm_$dtype.log" 2>&1 || {
      cat "$work/lm_$dtype.log"
      exit 1
    }
  done
  python3 - "$work/lm_float32.jsonl" "$work/lm_bf16.jsonl" <<'PY'
import json, sys
def last_loss(path):
    return [r["loss"] for r in map(json.loads, open(path)) if "loss" in r][-1]
fp32, bf16 = last_loss(sys.argv[1]), last_loss(sys.argv[2])
print(f"transformer-lm after 200 steps: float32 loss {fp32:.4f}, bf16 {bf16:.4f}")
assert abs(bf16 - fp32) <= 0.02 * fp32, (fp32, bf16)
PY
fi
