#!/usr/bin/env bash
# The main job: trains fashion-cnn on Fashion-MNIST and prints the test accuracy.
# Extra arguments go to the trainer, e.g. `scripts/train.sh --epochs 1`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh
exec build/cpu-release/examples/train_fashion_mnist "$@"
