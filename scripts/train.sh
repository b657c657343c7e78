#!/usr/bin/env bash
# The main job: trains fashion-cnn on Fashion-MNIST as a 4-stage pipeline — one MPI rank per
# stage, PipeDream's 1F1B schedule with weight stashing — and prints the plan, the test accuracy
# after every epoch and, last, "test accuracy: 0.9xxx".
#
# Extra arguments go to the trainer, e.g. `scripts/train.sh --epochs 1`. PIPELINE_RANKS sets the
# number of ranks (default 4). With 4 ranks and no --plan the job uses
# examples/plans/fashion_cnn_4stages.json (conv1..pool1 | conv2..flatten | fc1 | relu3, fc2):
# for a model this small on one host the partitioner prefers data parallelism, and the main job
# is meant to be a pipeline. Other rank counts, without --plan, profile and partition at start-up.
# --oversubscribe lets the ranks share fewer cores; each rank then uses cores / ranks threads, at
# least one (the trainer's default for --threads).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh
ranks=${PIPELINE_RANKS:-4}
mpirun_flags=(--oversubscribe)
if [[ $(id -u) -eq 0 ]]; then
  mpirun_flags+=(--allow-run-as-root)
fi
plan=()
if [[ $ranks == 4 && " $* " != *" --plan"* ]]; then
  plan=(--plan examples/plans/fashion_cnn_4stages.json)
fi
exec mpirun "${mpirun_flags[@]}" -np "$ranks" \
  build/cpu-release/examples/train_fashion_mnist --schedule 1f1b-stash "${plan[@]}" "$@"
