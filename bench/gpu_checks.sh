#!/usr/bin/env bash
# The GPU checks of this repository in one time-boxed batch, for a GPU machine lent for minutes:
# build (one architecture), the `gpu` test suite beside compute-sanitizer over the kernels, the
# training acceptance runs, then the benchmarks alone on the GPU. Logs and a summary go to $OUT
# (default ./gpu-out); every step is cut at its own cap and at the global DEADLINE (seconds).
#
#   OUT=/tmp/gpu DEADLINE=500 bash bench/gpu_checks.sh
#   STEPS="tests train bench pipeline cpu" (default: all five, run in the order named; cpu: this
#   library against PyTorch on the CPU at CPU_THREADS (default 1 2 8 16), pinned; fashion-cnn's
#   layers (ours) and ops (PyTorch's profiler) on 2; bench_conv on 16; bench_gemm and the mlp's
#   layer profile on 2 and 16; the mlp's steps on 1-16; schedules, not in the default: the schedules
#   on 4 CPU ranks and data-parallel interleaved pipelines on 8, against the simulator),
#   LANE=<cap of the tests/train lanes>, CASES=<bench_gpu_step cases>,
#   BENCH_STEPS=20, BENCH_KERNELS=1 (0: no bench_kernels), DATA=<Fashion-MNIST dir>, TEXT=<training text>,
#   MEMCHECK, RACECHECK=<gpu test files under compute-sanitizer, e.g. "softmax_xent bias">,
#   ARCH=90 (CMAKE_CUDA_ARCHITECTURES), PRECISION=fp32,tf32,bf16 (bench_gpu_step), TORCH=1 (0: no
#   PyTorch columns), BUILD=build/gpu-checks, SKIP_BUILD=1 (use BUILD as it is)
#
# The summary (summary.txt) lists each step with its exit status and time, the test summary, the
# sanitizer summaries and the benchmark tables; the full output is in the other logs.
set -u
OUT=${OUT:-gpu-out}
DEADLINE=${DEADLINE:-500}
STEPS=${STEPS:-tests train bench pipeline cpu}
DATA=${DATA:-/usr/share/datasets/fashion-mnist}
TEXT=${TEXT:-/usr/share/games/fortunes/fortunes}
ARCH=${ARCH:-90}
PRECISION=${PRECISION:-fp32,tf32,bf16}
B=${BUILD:-build/gpu-checks}
# The gpu test files run under compute-sanitizer's memcheck and racecheck, in this order (their
# training runs left out: test_precision's 200 bf16 steps and its 1F1B-stash pipeline).
MEMCHECK=${MEMCHECK:-activation attention bias convert dropout embedding layer_norm optimizer pool \
softmax_xent batch_norm gemm conv precision gpu_graphs}
RACECHECK=${RACECHECK:-attention layer_norm softmax_xent bias pool}
export PATH=$PATH:/usr/local/cuda/bin PYTHONUNBUFFERED=1
[[ $(id -u) == 0 ]] && export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
mkdir -p "$OUT"
S=$OUT/summary.txt
T0=$(date +%s)
left() { echo $((DEADLINE - ($(date +%s) - T0))); }
# box CAP LOG CMD...: CMD under a timeout of min(CAP, time left); its output appended to LOG.
box() {
  local cap=$1 log=$2
  shift 2
  local l
  l=$(left)
  ((l < cap)) && cap=$l
  if ((cap < 5)); then
    echo "skipped (no time left): $*" >>"$S"
    return 99
  fi
  local t tmp rc
  t=$(date +%s)
  tmp=$(mktemp)
  timeout -k 5 "$cap" "$@" >"$tmp" 2>&1
  rc=$?
  { echo "=== [$((t - T0))s] $* (cap ${cap}s)"; cat "$tmp"; echo "--- rc=$rc in $(($(date +%s) - t))s"; } >>"$log"
  echo "[$(($(date +%s) - T0))s] rc=$rc $(($(date +%s) - t))s: $*" >>"$S"
  rm -f "$tmp"
  return $rc
}
export -f box left
export T0 S DEADLINE OUT B
has() { [[ " $STEPS " == *" $1 "* ]]; }

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader >"$S"
if [[ ${SKIP_BUILD:-0} != 1 ]]; then
  cmake --preset cuda-release -B "$B" -DCMAKE_CUDA_ARCHITECTURES="$ARCH" -DPIPELINE_BUILD_BENCH=ON \
    >"$OUT/build.log" 2>&1
  box 300 "$OUT/build.log" cmake --build "$B" -j "$(nproc)" -- -k 0 pipeline_gpu_tests \
    train_fashion_mnist train_transformer_lm bench_gpu_step bench_kernels bench_train bench_conv bench_gemm \
    bench_schedules pipeline-profile pipeline-partition pipeline-simulate ||
    grep -m20 -A6 "error" "$OUT/build.log" >>"$S"
fi

# The `gpu` suite and compute-sanitizer beside the training acceptance runs (GPU work that shares
# the device well), each lane cut at LANE seconds (default a third of what is left).
checks() {
  lane=${LANE:-$(($(left) / 3))}
  export lane
  if has tests; then
    (box "$lane" "$OUT/gpu-tests.log" ctest --test-dir "$B" -L gpu -j 6 --timeout "$lane" --output-on-failure
     grep -E "tests passed|\((Failed|Timeout|SEGFAULT|Subprocess.*)\)" "$OUT/gpu-tests.log" >>"$S") &
    # The deliberate out-of-memory requests of gpu/test_device_memory.cpp are API errors, not bugs.
    (for t in $MEMCHECK; do echo "memcheck $t"; done
     for t in $RACECHECK; do echo "racecheck $t"; done) |
      xargs -P 4 -L 1 bash -c 'box $((lane - 5)) "$OUT/sanitizer.log" compute-sanitizer --tool $0 \
        --error-exitcode 9 "$B/tests/gpu_tests" "--source-file=*/gpu/test_$1.cpp" \
        "--test-case-exclude=*after 200 steps*,*1F1B-stash on one GPU*"' &
    # The direct first-layer kernels (a shared-memory window, barriers, warp reductions) under
    # racecheck by themselves: test_conv as a whole would spend the lane in cuDNN's kernels.
    box $((lane - 5)) "$OUT/sanitizer.log" compute-sanitizer --tool racecheck --error-exitcode 9 \
      "$B/tests/gpu_tests" "--source-file=*/gpu/test_conv.cpp" "--test-case=*direct kernels*" &
  fi
  if has train; then
    (box 120 "$OUT/train.log" "$B/examples/train_fashion_mnist" --device cuda --data "$DATA"
     box 120 "$OUT/train.log" "$B/examples/train_fashion_mnist" --device cuda --data "$DATA" \
       --cuda-graphs
     box 120 "$OUT/train.log" mpirun -np 1 "$B/examples/train_fashion_mnist" --device cuda \
       --in-process --plan examples/plans/fashion_cnn_4stages.json --schedule 1f1b-stash --data "$DATA"
     box 60 "$OUT/train.log" "$B/examples/train_transformer_lm" --device cuda --text "$TEXT" --steps 200
     box 60 "$OUT/train.log" "$B/examples/train_transformer_lm" --device cuda --text "$TEXT" \
       --steps 200 --dtype bf16) &
  fi
  wait
  [[ -f $OUT/sanitizer.log ]] && grep -E "ERROR SUMMARY|RACECHECK SUMMARY" "$OUT/sanitizer.log" | sort | uniq -c >>"$S"
  [[ -f $OUT/train.log ]] && grep -E "test accuracy:|steps in|step 200/" "$OUT/train.log" >>"$S"
}

bench() {
  local kernels_torch=() step_torch=()
  if [[ ${TORCH:-1} == 1 ]]; then
    kernels_torch=(--torch)
    step_torch=(--torch --torch-compile)
  fi
  [[ ${BENCH_KERNELS:-1} == 1 ]] && box 60 "$OUT/bench.log" "$B/bench/bench_kernels" "${kernels_torch[@]}"
  box 400 "$OUT/bench.log" "$B/bench/bench_gpu_step" "${step_torch[@]}" \
    --precision "$PRECISION" --steps "${BENCH_STEPS:-20}" --warmup 5 ${CASES:+--cases "$CASES"}
  # Our steps replayed from CUDA graphs against PyTorch eager, fashion-cnn at batch 64.
  box 100 "$OUT/bench.log" "$B/bench/bench_gpu_step" --cases fashion-cnn-b64 --cuda-graphs \
    --precision fp32,tf32,bf16 ${step_torch[@]:+--torch} --steps "${BENCH_STEPS:-20}" --warmup 5
  # Shallow first layers (fashion-cnn's conv1) on the direct kernels always (1) and never (0),
  # against the default above, where each shape takes them only if they timed faster than cuDNN:
  # graphed float32 steps, then conv1's own times in the profile.
  for direct in 1 0; do
    box 60 "$OUT/bench.log" env PIPELINE_CUDA_CONV_DIRECT=$direct "$B/bench/bench_gpu_step" \
      --cases fashion-cnn-b64,fashion-cnn-b1024 --cuda-graphs --precision fp32 --steps 20 --warmup 5
    box 30 "$OUT/conv-direct.log" env PIPELINE_CUDA_CONV_DIRECT=$direct \
      "$B/partitioner/pipeline-profile" --model fashion-cnn --device cuda --batch 64 --repeat 5 \
      -o "$OUT/fashion-direct$direct.json"
  done
  [[ -f $OUT/conv-direct.log ]] && grep -E "^===|conv1" "$OUT/conv-direct.log" >>"$S"
  # The transformer's bf16 step with every layer writing float32 (the products converting what
  # they read, the attention widening a bf16 qkv) against the default, where the layers that only
  # products read write bf16 and the attention reads the bf16 qkv as it is (ops::OutputAs).
  box 100 "$OUT/bench.log" env PIPELINE_BF16_OUTPUTS=0 "$B/bench/bench_gpu_step" \
    --cases transformer-lm-b16 --precision bf16 --steps 10 --warmup 3
  # bf16 convolutions through cuDNN's legacy API (TF32 on bf16 operands) against the graph API's
  # bf16 engines (the default; cuda/dnn_graph.hpp), same run.
  box 100 "$OUT/bench.log" env PIPELINE_CUDNN_GRAPH=none "$B/bench/bench_gpu_step" \
    --cases vgg16-b64,fashion-cnn-b1024 --precision bf16 --steps 10 --warmup 3
  # float32 with cuDNN's FFT and Winograd algorithms allowed, as PyTorch's cudnn.benchmark allows
  # them (cuda::set_transformed_convolutions), beside PyTorch in the same run.
  box 100 "$OUT/bench.log" "$B/bench/bench_gpu_step" --transformed-convolutions ${step_torch[@]:+--torch} \
    --cases vgg16-b64,fashion-cnn-b1024 --precision fp32 --steps 10 --warmup 3
  grep -E "^\| " "$OUT/bench.log" >>"$S"
  # Where VGG-16's bf16 step goes, layer by layer (convolutions, bias, ReLU and pools), as
  # bench_gpu_step's vgg16-b64 case runs it.
  box 90 "$OUT/vgg-profile.log" "$B/partitioner/pipeline-profile" --model vgg16 --device cuda \
    --dtype bf16 --image-size 224 --classes 1000 --batch 64 --warmup 1 --repeat 5 \
    -o "$OUT/vgg16-bf16.json"
  grep -E "^ +[0-9]+ +[a-z_0-9]+ +[A-Z]|^total|^optimizer" "$OUT/vgg-profile.log" >>"$S"
}

pipeline() {
  # A 4-stage transformer-lm pipeline of the GPU's own profile, in one process on the one GPU,
  # beside the same model trained sequentially; the partitioner prints what 4 GPUs would give.
  local lm=(--dtype bf16 --seq-len 1024 --dim 1024 --heads 16 --blocks 8 --batch 8)
  box 40 "$OUT/pipeline.log" "$B/partitioner/pipeline-profile" --model transformer-lm --device cuda \
    "${lm[@]}" -o "$OUT/lm8.json" &&
    box 15 "$OUT/pipeline.log" "$B/partitioner/pipeline-partition" --profile "$OUT/lm8.json" \
      --workers 4 --bandwidth 450GB/s --memory 80GB --straight --optimizer adamw \
      -o "$OUT/lm8-plan4.json" &&
    box 40 "$OUT/pipeline.log" "$B/examples/train_transformer_lm" --device cuda "${lm[@]}" \
      --steps 60 --text "$TEXT" &&
    box 60 "$OUT/pipeline.log" mpirun -np 1 "$B/examples/train_transformer_lm" --device cuda \
      --in-process --plan "$OUT/lm8-plan4.json" "${lm[@]}" --steps 60 --text "$TEXT"
  grep -E "samples/s|config|bubble" "$OUT/pipeline.log" >>"$S"
  # Each rank's allocator peak beside the plan (now with the profile's working memory).
  grep -A5 "^memory per rank" "$OUT/pipeline.log" >>"$S"
  grep -o '"runtime_bytes": [0-9]*\|"workspace_bytes": [0-9]*\|"gradient_bytes": [0-9]*' "$OUT/lm8.json" | sort | uniq -c >>"$S"
  # A model larger than the GPU (4.8e9 parameters), profiled four blocks at a time, and its plans
  # on one GPU (none fits), one 8-GPU server and two.
  box 120 "$OUT/pipeline.log" "$B/partitioner/pipeline-profile" --model transformer-lm \
    --device cuda --dtype bf16 --seq-len 2048 --dim 4096 --heads 32 --blocks 24 --batch 2 \
    --warmup 1 --repeat 5 --layers-per-pass 4 -o "$OUT/lm4b.json" &&
    for levels in "--workers 1 --bandwidth 450GB/s" "--level 8:450GB/s" \
      "--level 8:450GB/s --level 2:50GB/s"; do
      # shellcheck disable=SC2086
      box 15 "$OUT/pipeline.log" "$B/partitioner/pipeline-partition" --profile "$OUT/lm4b.json" \
        $levels --memory 80GB --optimizer adamw -o "$OUT/lm4b-plan.json"
    done
  grep -E "^config|samples/s|no plan fits" "$OUT/pipeline.log" >>"$S"
}

cpu() {
  # Which CPUs are threads of one core: the pinned runs take one per core first.
  bash bench/cpu_list.sh --show >>"$OUT/cpu.log"
  for t in 1 2 8 16; do echo "$t threads: CPUs $(bash bench/cpu_list.sh "$t")"; done >>"$S"
  for t in ${CPU_THREADS:-1 2 8 16}; do
    box 60 "$OUT/cpu.log" env PYTHON=python3 REPS=2 bash bench/compare_torch.sh "$B" "$t" 64
  done
  grep -E "^\| (fashion|mlp)|run [12]:" "$OUT/cpu.log" >>"$S"
  # Where fashion-cnn's step goes on 2 cores (the open target there): this library's layers
  # inside whole training passes, and PyTorch's ops under its profiler.
  local two
  two=$(bash bench/cpu_list.sh 2)
  box 30 "$OUT/cpu.log" taskset -c "$two" "$B/partitioner/pipeline-profile" --model fashion-cnn \
    --device cpu --threads 2 --batch 64 -o "$OUT/fashion-2.json"
  box 40 "$OUT/cpu.log" taskset -c "$two" python3 bench/torch_train.py --model fashion-cnn \
    --threads 2 --steps 30 --profile
  grep -E "^ +[0-9]+ +[a-z]+[0-9]* +[A-Z]|^total|^optimizer|^  aten::|^  Optimizer" "$OUT/cpu.log" >>"$S"
  # The convolutions' two algorithms (lowered, Winograd) on 16 cores.
  box 40 "$OUT/conv.log" taskset -c "$(bash bench/cpu_list.sh 16)" "$B/bench/bench_conv" --threads 16 --min-seconds 0.2
  grep -E "^(conv2|vgg16)" "$OUT/conv.log" >>"$S"
  # Where a small model's step goes as threads grow: the products alone (bench_gemm) and each
  # layer's passes inside whole training passes (the mlp's profile), on 2 and 16 cores.
  box 40 "$OUT/threads.log" taskset -c "$(bash bench/cpu_list.sh 16)" "$B/bench/bench_gemm" --threads 1,2,4,8,16 \
    --min-seconds 0.1
  for t in 2 16; do
    box 20 "$OUT/threads.log" taskset -c "$(bash bench/cpu_list.sh "$t")" "$B/partitioner/pipeline-profile" \
      --model mlp --device cpu --threads "$t" --batch 64 -o "$OUT/mlp-$t.json"
  done
  # The mlp's whole steps as threads grow (it slowed down past 2 threads while OpenMP ended and
  # re-created threads all through each step; one team for every region since).
  for t in 1 2 4 8 16; do
    box 20 "$OUT/threads.log" taskset -c "$(bash bench/cpu_list.sh "$t")" "$B/bench/bench_train" --model mlp \
      --threads "$t" --steps 200
  done
  grep -E "^\| (empty|mlp)|^ +[0-9]+ +fc|^optimizer" "$OUT/threads.log" >>"$S"
}

schedules() {
  # The schedules on CPU ranks of a core each, measured beside the simulator: bench_schedules on 4
  # ranks (transformer-lm), then data-parallel interleaved pipelines on 8: the partitioner's own
  # interleaved plan (it weighs 1, 2 and 4 pipelines) against one pipeline of 8 (--straight), each
  # trained under mpirun beside the plan's prediction.
  box 150 "$OUT/schedules.log" mpirun --bind-to core -np 4 "$B/bench/bench_schedules" --repeat 3 \
    --minibatches 4 --schedules 1f1b-flush,zb-h1,interleaved-1f1b,interleaved-zb-h1
  grep -A5 "^schedule " "$OUT/schedules.log" >>"$S"
  local lm=(--seq-len 64 --dim 128 --heads 4 --blocks 16 --batch 16)
  box 60 "$OUT/schedules.log" "$B/partitioner/pipeline-profile" --model transformer-lm --threads 1 \
    "${lm[@]}" -o "$OUT/lm-cpu.json" || return
  for pipes in straight own; do
    local flags=()
    [[ $pipes == straight ]] && flags=(--straight)
    box 20 "$OUT/schedules.log" "$B/partitioner/pipeline-partition" --profile "$OUT/lm-cpu.json" \
      --workers 8 --bandwidth 10GB/s --virtual-stages 2 --optimizer adamw "${flags[@]}" \
      -o "$OUT/lm-cpu-$pipes.json" &&
      box 120 "$OUT/schedules.log" mpirun --bind-to core -np 8 "$B/examples/train_transformer_lm" \
        --plan "$OUT/lm-cpu-$pipes.json" "${lm[@]}" --threads 1 --steps 60 --text "$TEXT"
  done
  grep -E "^config|^interleaved:|^time per mi(ni|cro)batch|samples/s through" "$OUT/schedules.log" >>"$S"
}

# Steps run in the order STEPS names them; tests and train together, where the first of them is.
ran_checks=0
for step in $STEPS; do
  case $step in
    tests | train) ((ran_checks)) || checks; ran_checks=1 ;;
    bench | pipeline | cpu | schedules) $step ;;
    *) echo "unknown step '$step' (tests, train, bench, pipeline, cpu, schedules)" >>"$S" ;;
  esac
done
echo "[$(($(date +%s) - T0))s] done" >>"$S"
cat "$S"
