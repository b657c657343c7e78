#!/usr/bin/env bash
# In-process pipelines as a user runs them (--in-process: every rank of the plan a thread of one
# process) against the same plans under mpirun (one process per rank):
#   in_process_scenario.sh TRAIN_FASHION_MNIST TRAIN_TRANSFORMER_LM|- PLANS_DIR MPIRUN...
# The trained parameters (the whole model, saved by rank 0) are bitwise those of the MPI job: 1-2-3 replication under
# 1f1b-flush (allreduces sum in group order on both transports) and 4 stages under 1f1b-stash; a
# checkpoint of an in-process run resumes under mpirun bit for bit; bf16 transfers agree both
# ways; transformer-lm (if given) prints the same validation loss both ways.
set -euo pipefail
train=$1
lm=$2
plans=$3
shift 3
mpirun=("$@")
work=$(mktemp -d "${TMPDIR:-/tmp}/in_process.XXXXXX")
trap 'rm -rf "$work"' EXIT
common=(--model mlp --batch 36 --threads 1 --eval-batch 10000 --lr 1e-3)

run() {  # run NAME COMMAND...: the command's output in $work/NAME.log, shown if it fails
  local name=$1
  shift
  "$@" > "$work/$name.log" 2>&1 || { cat "$work/$name.log"; exit 1; }
}
same_parameters() {  # same_parameters A B: the whole model each run saved (--save)
  cmp -s "$work/$1.safetensors" "$work/$2.safetensors" ||
    { echo "--in-process parameters differ from the MPI job's ($1 vs $2)"; exit 1; }
}

flush=(--plan "$plans/mlp_6_uneven.json" --schedule 1f1b-flush --microbatches 6 --steps 12)
run flush_local "$train" "${common[@]}" "${flush[@]}" --in-process --save "$work/flush_local.safetensors"
run flush_mpi "${mpirun[@]}" 6 "$train" "${common[@]}" "${flush[@]}" --save "$work/flush_mpi.safetensors"
same_parameters flush_local flush_mpi
grep -q "in-process pipeline: the plan's 6 ranks as threads of this process, on cpu" \
  "$work/flush_local.log" || { cat "$work/flush_local.log"; exit 1; }

stash=(--plan "$plans/mlp_4.json" --schedule 1f1b-stash --steps 16)
run stash_local "$train" "${common[@]}" "${stash[@]}" --in-process --save "$work/stash_local.safetensors"
run stash_mpi "${mpirun[@]}" 4 "$train" "${common[@]}" "${stash[@]}" --save "$work/stash_mpi.safetensors"
same_parameters stash_local stash_mpi

# A checkpoint written by an in-process run resumes under mpirun, bit for bit.
ckpt=(--plan "$plans/mlp_2.json" --schedule 1f1b-flush --microbatches 2 --lr-schedule constant)
run ckpt_first "$train" "${common[@]}" "${ckpt[@]}" --in-process --steps 10 \
  --checkpoint-dir "$work/ckpt"
run ckpt_resumed "${mpirun[@]}" 2 "$train" "${common[@]}" "${ckpt[@]}" --steps 20 \
  --resume "$work/ckpt" --save "$work/ckpt_resumed.safetensors"
grep -q "resuming from .* at step 10" "$work/ckpt_resumed.log" ||
  { cat "$work/ckpt_resumed.log"; exit 1; }
run ckpt_straight "$train" "${common[@]}" "${ckpt[@]}" --in-process --steps 20 \
  --save "$work/ckpt_straight.safetensors"
same_parameters ckpt_resumed ckpt_straight

accuracy() { grep -o "test accuracy: [0-9.]*" "$work/$1.log"; }
[[ "$(accuracy flush_local)" == "$(accuracy flush_mpi)" ]] ||
  { echo "test accuracy differs: $(accuracy flush_local) vs $(accuracy flush_mpi)"; exit 1; }
# The 6-rank job's --save is the whole model: one process loads it and scores what the job scored
# (a step at a learning rate of 1e-30 changes no weight).
run loaded "$train" --model mlp --batch 36 --threads 1 --eval-batch 10000 --lr 1e-30 --steps 1 \
  --load "$work/flush_mpi.safetensors"
[[ "$(accuracy loaded)" == "$(accuracy flush_mpi)" ]] ||
  { echo "the saved model scores $(accuracy loaded) in one process, $(accuracy flush_mpi) in the job"; exit 1; }
summary="1-2-3 1f1b-flush and 4-stage 1f1b-stash: --in-process equals mpirun bit for bit; an"
summary+=" in-process checkpoint resumed under mpirun equals the uninterrupted run; the job's --save"
summary+=" loads in one process"

# bf16 on the wire: the same bits both ways, and the losses of float32 transfers within 2%.
bf16=(--plan "$plans/mlp_4.json" --schedule 1f1b-flush --microbatches 4 --steps 60)
run bf16_local "$train" "${common[@]}" "${bf16[@]}" --transfer-dtype bf16 --in-process \
  --save "$work/bf16_local.safetensors" --metrics "$work/bf16.jsonl"
run bf16_mpi "${mpirun[@]}" 4 "$train" "${common[@]}" "${bf16[@]}" --transfer-dtype bf16 \
  --save "$work/bf16_mpi.safetensors"
same_parameters bf16_local bf16_mpi
run f32_local "$train" "${common[@]}" "${bf16[@]}" --in-process --metrics "$work/f32.jsonl"
summary+="; $(python3 - "$work/f32.jsonl" "$work/bf16.jsonl" <<'PY'
import json, sys
def losses(path):
    return [r["loss"] for r in map(json.loads, open(path)) if "step" in r]
f32, bf16 = map(losses, sys.argv[1:3])
assert len(f32) == len(bf16) == 60, (len(f32), len(bf16))
a, b = sum(f32[-10:]) / 10, sum(bf16[-10:]) / 10
assert abs(a - b) <= 0.02 * a, f"bf16 transfers end at loss {b:.4f}, float32 at {a:.4f}"
assert f32 != bf16, "bf16 transfers changed nothing"
print(f"bf16 transfers: loss {b:.4f} vs {a:.4f} with float32 after 60 steps")
PY
)"

if [[ "$lm" != "-" ]]; then
  lm_args=(--steps 8 --lr-schedule constant --threads 1 --schedule 1f1b-flush --microbatches 2)
  run lm_local "$lm" "${lm_args[@]}" --in-process --plan "$plans/transformer_lm_2.json"
  run lm_mpi "${mpirun[@]}" 2 "$lm" "${lm_args[@]}" --plan "$plans/transformer_lm_2.json"
  loss() { grep -o "validation loss: [0-9.]*" "$work/$1.log"; }
  [[ "$(loss lm_local)" == "$(loss lm_mpi)" && -n "$(loss lm_mpi)" ]] ||
    { echo "transformer-lm: $(loss lm_local) in-process vs $(loss lm_mpi) under mpirun"; exit 1; }
  summary+="; transformer-lm 2 stages: $(loss lm_local) both ways"
fi
echo "$summary"
