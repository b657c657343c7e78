#!/usr/bin/env bash
# Single-process training throughput of fashion-cnn and mlp: this library (bench_train) against
# PyTorch on the CPU (bench/torch_train.py, Debian's python3-torch), same architecture, batch,
# optimizer (SGD, momentum 0.9) and thread count, measured back to back in one run.
#
#   bench/compare_torch.sh [BUILD_DIR] [THREADS] [BATCH] [--results]
#
# Each figure is the best of REPS (default 3) alternating runs (noise on a shared machine only
# ever slows a run down); each run's figure is printed to stderr as it comes. Both sides are
# pinned with taskset (where it exists) to the same THREADS CPUs, one per physical core first
# (bench/cpu_list.sh); the list is printed.
# --results appends the table to bench/RESULTS.md. PYTHON names the python that has PyTorch
# (default /usr/bin/python3).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build/cpu-release}
threads=${2:-2}
batch=${3:-64}
record=${4:-}
python=${PYTHON:-/usr/bin/python3}
pin=()
if command -v taskset >/dev/null; then
  cpus=$(bash bench/cpu_list.sh "$threads")
  pin=(taskset -c "$cpus")
  echo "pinned to CPUs $cpus" >&2
fi
$python -c "import torch" 2>/dev/null || {
  echo "PyTorch is missing: apt-get install python3-torch" >&2
  exit 1
}
[[ -x $build/bench/bench_train ]] || { echo "build $build/bench/bench_train first" >&2; exit 1; }

peak=$(awk -F: '/^cpu MHz/ {gsub(/ /, "", $2); print $2; exit}' /proc/cpuinfo)
flags=$(grep -m1 '^flags' /proc/cpuinfo)
fma_width=8   # fp32 lanes per FMA: 8 with AVX2, 16 with AVX-512
[[ $flags == *avx512f* ]] && fma_width=16
# Peak fp32 GFLOP/s = threads × 2 FMA units × lanes × 2 flops × GHz.
peak_gflops=$(awk -v mhz="${peak:-2500}" -v t="$threads" -v w="$fma_width" 'BEGIN {printf "%.0f", t*2*w*2*mhz/1000}')

best() { sort -g | tail -1; }
table="| model | batch | threads | pipeline samples/s | PyTorch samples/s | ratio | pipeline GFLOP/s | of fp32 peak ($peak_gflops GFLOP/s) |
|---|---|---|---|---|---|---|---|"
for model in fashion-cnn mlp; do
  ours=() theirs=() gflops=()
  for ((rep = 1; rep <= ${REPS:-3}; ++rep)); do
    line=$("${pin[@]}" $build/bench/bench_train --model $model --batch $batch --threads $threads --steps 40 --json)
    ours+=("$(echo "$line" | $python -c 'import json,sys; print(json.load(sys.stdin)["samples_per_s"])')")
    gflops+=("$(echo "$line" | $python -c 'import json,sys; print(json.load(sys.stdin)["gflops"])')")
    line=$("${pin[@]}" $python bench/torch_train.py --model $model --batch $batch --threads $threads --steps 40)
    theirs+=("$(echo "$line" | $python -c 'import json,sys; print(json.load(sys.stdin)["samples_per_s"])')")
    echo "$model threads $threads run $rep: pipeline ${ours[-1]} samples/s, PyTorch ${theirs[-1]}" >&2
  done
  o=$(printf '%s\n' "${ours[@]}" | best)
  t=$(printf '%s\n' "${theirs[@]}" | best)
  g=$(printf '%s\n' "${gflops[@]}" | best)
  table+=$'\n'$(awk -v m=$model -v b=$batch -v th=$threads -v o=$o -v t=$t -v g=$g -v p=$peak_gflops \
    'BEGIN {printf "| %s | %d | %d | %.1f | %.1f | %.2fx | %.1f | %.1f%% |", m, b, th, o, t, o/t, g, 100*g/p}')
done
echo "$table"
if [[ $record == --results ]]; then
  {
    echo
    echo "### Training throughput against PyTorch ($(date -u +%Y-%m-%d), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) cores)"
    echo
    echo "Command: \`bench/compare_torch.sh $build $threads $batch --results\`; PyTorch $($python -c 'import torch; print(torch.__version__)'). Training FLOPs = 3 × forward FLOPs."
    echo
    echo "$table"
  } >> bench/RESULTS.md
fi
