#!/usr/bin/env bash
# Pipelines on one GPU as a user runs them (label gpu; exits 77, "skipped", without a GPU):
#   gpu_pipeline_scenario.sh TRAIN_FASHION_MNIST PLANS_DIR DATA_DIR MPIRUN...
# mlp on the 2-stage plan under 1f1b-flush, trained three ways on cuda:0: as 2 MPI ranks that share
# the GPU through staged MPI (--comm mpi), as 2 threads of one process (--in-process), and in one
# process without a pipeline. The two pipelines end with bitwise the same parameters (the same
# kernels on the same GPU, the same bytes moved), and their loss trajectory is the single
# process's to fp32 rounding.
set -euo pipefail
train=$1
plans=$2
data=$3
shift 3
mpirun=("$@")
work=$(mktemp -d "${TMPDIR:-/tmp}/gpu_pipeline.XXXXXX")
trap 'rm -rf "$work"' EXIT

if ! nvidia-smi -L 2>/dev/null | grep -q "^GPU"; then
  echo "no CUDA device: skipped"
  exit 77
fi

run() {  # run NAME COMMAND...: the command's output in $work/NAME.log, shown if it fails
  local name=$1
  shift
  "$@" > "$work/$name.log" 2>&1 || { cat "$work/$name.log"; exit 1; }
}
common=(--model mlp --batch 36 --threads 1 --eval-batch 10000 --lr 1e-3 --device cuda
        --data "$data" --steps 24)
pipe=(--plan "$plans/mlp_2.json" --schedule 1f1b-flush --microbatches 2)

run single "$train" "${common[@]}" --metrics "$work/single.jsonl"
run staged "${mpirun[@]}" 2 "$train" "${common[@]}" "${pipe[@]}" --comm mpi \
  --metrics "$work/staged.jsonl" --save "$work/staged.safetensors"
grep -q "transport: MPI with device staging (--comm mpi)" "$work/staged.log" ||
  { cat "$work/staged.log"; echo "the staged transport was not announced"; exit 1; }
run local "$train" "${common[@]}" "${pipe[@]}" --in-process --metrics "$work/local.jsonl" \
  --save "$work/local.safetensors"

cmp -s "$work/staged.safetensors" "$work/local.safetensors" ||
  { echo "staged MPI and in-process parameters differ"; exit 1; }
python3 - "$work/single.jsonl" "$work/staged.jsonl" <<'PY'
import json, sys
def losses(path):
    return [r["loss"] for r in map(json.loads, open(path)) if "step" in r]
single, staged = map(losses, sys.argv[1:3])
assert len(single) == len(staged) == 24, (len(single), len(staged))
worst = max(abs(a - b) / abs(b) for a, b in zip(staged, single))
assert worst < 1e-4, f"the GPU pipeline drifts from one GPU process by {worst:.2e}"
print(f"mlp 2 stages on one GPU: staged MPI == in-process bit for bit; within {worst:.1e} of "
      f"one process over 24 steps")
PY
