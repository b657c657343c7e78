#!/usr/bin/env bash
# Checkpoint, resume and stop-signal scenarios of the example trainers, as users run them:
#
#   checkpoint_scenarios.sh CASE TRAIN_FASHION_MNIST PLANS_DIR MPIRUN...
#
# CASE is one of
#   bitwise-<schedule>  a pipelined run resumed at step 20 (from a copy of its checkpoints) ends
#                       with exactly the parameters and losses of the run that never stopped
#                       (schedule: sequential, gpipe, 1f1b-flush)
#   stash               the same for 1f1b-stash, whose resumed pipeline starts afresh (its
#                       in-flight microbatches are not saved): it resumes at step 20 and its
#                       losses continue those of the run that never stopped
#   replan              a 4-rank 4-stage checkpoint resumed on 2 ranks (2 stages) and on 3 ranks
#                       (a replicated stage): the first losses after resuming equal the 4-rank
#                       run's, and training continues
#   sigkill             a rank SIGKILLed mid-run; the relaunch with --resume continues from the
#                       last complete checkpoint and loses at most one checkpoint interval
#   interrupted         a checkpoint whose write was cut short (no manifest, truncated shard) is
#                       never loaded: the previous one is; a rank killed while its checkpoint is
#                       being written leaves only complete checkpoints to resume from; a complete
#                       one damaged later (a shard's CRC-32) is passed over by every rank and
#                       moved aside, and with none intact the run stops
#   sigterm             SIGTERM to mpirun: every rank finishes its step, the job checkpoints,
#                       names the checkpoint and exits; --resume continues from that step
#                       (1f1b-flush on 2 ranks; sigterm-stash: 1f1b-stash on 4 ranks;
#                       sigterm-rank1: SIGTERM to rank 1 alone, which the coordinator announces;
#                       sigterm-all: to mpirun and every rank, as a scheduler does, so each rank
#                       gets two, after a second job given the same directory was refused)
#   finished            a finished job started again (--resume at its last step, or past a lowered
#                       --steps), single-process and on 2 ranks: it trains nothing, says so,
#                       scores what the job scored and leaves its checkpoint as it was
#   interleaved         an interleaved plan (2 stages per rank; a shard per stage): resumed at
#                       step 20 it ends bit-identical to the run that never stopped; its
#                       checkpoint resumed under a straight 2-stage plan, and that one's under the
#                       interleaved plan again, continue the losses; --save/--load of the plan's
#                       parameters; SIGTERM (sigterm-interleaved)
#   replicated          a 1-2 plan under 1f1b-stash (the replicas step on pairs of minibatches) over
#                       epochs of an odd 1875 minibatches: a checkpoint every 10 steps in the
#                       second epoch too, each complete, and the last resumes; a single process's
#                       checkpoint of step 15 resumed on it continues at 16, and a job restarted
#                       with one step left that makes no pair ends as finished
#   schedule-csv        a hand-written schedule of 2 minibatches a copy (flush_2x2.csv): a
#                       checkpoint cadence that is no multiple of it is refused naming it; --steps
#                       41 trains 40, says so, and checkpoints at multiples of 2 and at 40
#   refused             resuming with another seed, batch, optimizer or model, from a corrupt
#                       shard, or from a file, fails with the problem and the fix named; with
#                       TRAIN_TRANSFORMER_LM set (its binary), also another --heads; resuming
#                       without those options takes the checkpoint's
# Exits non-zero with a message on the first failed check.
set -euo pipefail

case_name=$1
train=$2
plans=$3
shift 3
mpirun=("$@")
work=$(mktemp -d "${TMPDIR:-/tmp}/checkpoint_${case_name}.XXXXXX")
trap 'rm -rf "$work"' EXIT

fail() {
  echo "FAIL ($case_name): $*" >&2
  exit 1
}

common=(--model mlp --batch 32 --threads 1 --eval-batch 10000)

# Losses per step from a metrics file, one "step loss" line each (repr keeps every bit).
losses() {
  python3 -c '
import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    if "step" in r:
        print(r["step"], repr(r["loss"]))' "$1"
}

# The step a run resumed from, from its log.
resumed_step() {
  sed -n "s/.*resuming from '.*' at step \([0-9]*\).*/\1/p" "$1" | head -1
}

run_bitwise() {
  # Flags after the schedule go to the uninterrupted run only: the resumed run takes them from
  # the checkpoint (--dtype).
  local schedule=$1 job
  local -a first=("${@:2}")
  if [[ $schedule == sequential ]]; then
    job=("$train")
  else
    job=("${mpirun[@]}" 2 "$train" --plan "$plans/mlp_2.json" --schedule "$schedule")
  fi
  "${job[@]}" "${common[@]}" "${first[@]}" --steps 40 --checkpoint-dir "$work/a" --checkpoint-every 10 \
    --checkpoint-keep 10 --metrics "$work/a.jsonl" --save "$work/a.safetensors" > "$work/a.log" 2>&1 ||
    { cat "$work/a.log"; fail "the uninterrupted run failed"; }
  mkdir "$work/b"
  cp -r "$work/a/step-000000010" "$work/a/step-000000020" "$work/b/"
  "${job[@]}" "${common[@]}" --steps 40 --resume "$work/b" --checkpoint-every 10 \
    --metrics "$work/b.jsonl" --save "$work/b.safetensors" > "$work/b.log" 2>&1 ||
    { cat "$work/b.log"; fail "the resumed run failed"; }
  [[ $(resumed_step "$work/b.log") == 20 ]] || { cat "$work/b.log"; fail "did not resume at step 20"; }
  if [[ " ${first[*]} " == *" --dtype bf16 "* ]]; then
    grep -q -- "--resume: .*--dtype bf16" "$work/b.log" ||
      { cat "$work/b.log"; fail "the resumed run did not take --dtype bf16 from the checkpoint"; }
  fi
  losses "$work/a.jsonl" | awk '$1 > 20' > "$work/a.losses"
  losses "$work/b.jsonl" > "$work/b.losses"
  [[ $(wc -l < "$work/b.losses") == 20 ]] || fail "the resumed run logged $(wc -l < "$work/b.losses") steps, not 20"
  if [[ $schedule == 1f1b-stash ]]; then
    python3 - "$work/a.losses" "$work/b.losses" <<'EOF'
import math, sys
a = [float(l.split()[1]) for l in open(sys.argv[1])]
b = [float(l.split()[1]) for l in open(sys.argv[2])]
assert all(math.isfinite(x) for x in b), "non-finite loss after resuming"
ma, mb = sum(a) / len(a), sum(b) / len(b)
# Steps 21-40 of both runs see the same minibatches; only the weight staleness differs.
assert abs(mb - ma) <= 0.1 * ma, f"mean loss of steps 21-40: {mb:.4f} resumed, {ma:.4f} uninterrupted"
print(f"1f1b-stash: resumed at step 20; mean loss of steps 21-40 {mb:.4f} (uninterrupted {ma:.4f})")
EOF
    return
  fi
  diff "$work/a.losses" "$work/b.losses" || fail "losses after resuming differ from the run that never stopped"
  local n=0
  for f in "$work"/a*.safetensors; do
    cmp "$f" "$work/b${f#"$work"/a}" || fail "parameters $f differ after resuming"
    n=$((n + 1))
  done
  cmp "$work/a/step-000000040/stage-0.safetensors" "$work/b/step-000000040/stage-0.safetensors" ||
    fail "the final checkpoints differ"
  echo "$schedule: resumed at step 20, losses of steps 21-40 and $n parameter file(s) bit-identical"
}

run_interleaved() {
  local interleaved=(--plan "$plans/mlp_2x2_interleaved.json" --microbatches 4)
  local straight=(--plan "$plans/mlp_2.json" --schedule 1f1b-flush --microbatches 4)
  "${mpirun[@]}" 2 "$train" "${common[@]}" "${interleaved[@]}" --steps 40 --checkpoint-dir "$work/a" \
    --checkpoint-every 10 --checkpoint-keep 10 --metrics "$work/a.jsonl" --save "$work/a.safetensors" \
    > "$work/a.log" 2>&1 || { cat "$work/a.log"; fail "the interleaved run failed"; }
  grep -q "schedule interleaved-1f1b" "$work/a.log" || { cat "$work/a.log"; fail "not an interleaved run"; }
  local shards
  shards=$(python3 -c 'import json, sys; print(" ".join(s["file"] for s in json.load(open(sys.argv[1]))["shards"]))' \
    "$work/a/step-000000040/manifest.json")
  [[ $shards == "stage-0.safetensors stage-1.safetensors stage-2.safetensors stage-3.safetensors" ]] ||
    fail "the checkpoint's shards are '$shards', not one per stage"
  losses "$work/a.jsonl" > "$work/a.losses"

  # The same plan resumed at step 20: bit-identical (a flush schedule).
  mkdir "$work/b" && cp -r "$work/a/step-000000010" "$work/a/step-000000020" "$work/b/"
  "${mpirun[@]}" 2 "$train" "${common[@]}" "${interleaved[@]}" --steps 40 --resume "$work/b" \
    --checkpoint-every 10 --metrics "$work/b.jsonl" --save "$work/b.safetensors" > "$work/b.log" 2>&1 ||
    { cat "$work/b.log"; fail "the resumed interleaved run failed"; }
  [[ $(resumed_step "$work/b.log") == 20 ]] || { cat "$work/b.log"; fail "did not resume at step 20"; }
  losses "$work/b.jsonl" > "$work/b.losses"
  awk '$1 > 20' "$work/a.losses" | diff - "$work/b.losses" ||
    fail "losses after resuming the interleaved plan differ from the run that never stopped"
  cmp "$work/a.safetensors" "$work/b.safetensors" || fail "--save after resuming differs"
  for s in 0 1 2 3; do
    cmp "$work/a/step-000000040/stage-$s.safetensors" "$work/b/step-000000040/stage-$s.safetensors" ||
      fail "the final checkpoints' stage $s differs"
  done

  # Interleaved -> straight at step 20, then straight -> interleaved at step 30: the same
  # minibatches, microbatches and weights, so each first step matches the run it continues.
  mkdir "$work/c" && cp -r "$work/a/step-000000020" "$work/c/"
  "${mpirun[@]}" 2 "$train" "${common[@]}" "${straight[@]}" --steps 40 --resume "$work/c" \
    --checkpoint-every 10 --metrics "$work/c.jsonl" > "$work/c.log" 2>&1 ||
    { cat "$work/c.log"; fail "the straight plan did not resume the interleaved checkpoint"; }
  grep -q "written under another plan" "$work/c.log" || { cat "$work/c.log"; fail "the plan change was not said"; }
  mkdir "$work/d" && cp -r "$work/c/step-000000030" "$work/d/"
  "${mpirun[@]}" 2 "$train" "${common[@]}" "${interleaved[@]}" --steps 40 --resume "$work/d" \
    --metrics "$work/d.jsonl" > "$work/d.log" 2>&1 ||
    { cat "$work/d.log"; fail "the interleaved plan did not resume the straight checkpoint"; }
  [[ $(resumed_step "$work/d.log") == 30 ]] || { cat "$work/d.log"; fail "did not resume at step 30"; }
  losses "$work/c.jsonl" > "$work/c.losses"
  losses "$work/d.jsonl" > "$work/d.losses"

  # --load of the interleaved run's parameters under both plans: the same first loss.
  local name
  for name in interleaved straight; do
    local -n flags=$name
    "${mpirun[@]}" 2 "$train" "${common[@]}" "${flags[@]}" --steps 4 --load "$work/a.safetensors" \
      --metrics "$work/load-$name.jsonl" > "$work/load-$name.log" 2>&1 ||
      { cat "$work/load-$name.log"; fail "--load under the $name plan failed"; }
    losses "$work/load-$name.jsonl" > "$work/load-$name.losses"
  done
  python3 - "$work" <<'EOF'
import sys
w = sys.argv[1]
def read(name):
    return {int(s): float(l) for s, l in (line.split() for line in open(f"{w}/{name}.losses"))}
a, c, d = read("a"), read("c"), read("d")
li, ls = read("load-interleaved"), read("load-straight")
def close(x, y, tol):
    return abs(x - y) <= tol * abs(y)
assert sorted(c) == list(range(21, 41)) and sorted(d) == list(range(31, 41)), (sorted(c), sorted(d))
# The first step after a resume sees the checkpoint's weights: equal up to the order in which
# the microbatch gradients were summed; later steps drift by rounding only.
assert close(c[21], a[21], 1e-6), f"straight from interleaved: step 21 {c[21]} against {a[21]}"
assert close(d[31], c[31], 1e-6), f"interleaved from straight: step 31 {d[31]} against {c[31]}"
worst = max(max(abs(c[s] - a[s]) / abs(a[s]) for s in c), max(abs(d[s] - c[s]) / abs(c[s]) for s in d))
assert worst < 1e-4, f"the resumed runs drift by {worst:.2e}"
assert close(li[1], ls[1], 1e-6), f"--load: first loss {li[1]} interleaved, {ls[1]} straight"
print(f"interleaved <-> straight: step 21 {c[21]} (interleaved run {a[21]}), step 31 {d[31]} "
      f"(straight run {c[31]}), within {worst:.1e} after; --load under both plans: {li[1]} / {ls[1]}")
EOF
  echo "interleaved: a shard per stage; resumed at step 20 bit-identical (losses, --save, final checkpoint)"
}

run_replan() {
  "${mpirun[@]}" 4 "$train" "${common[@]}" --plan "$plans/mlp_4.json" --schedule 1f1b-flush \
    --microbatches 4 --steps 40 --checkpoint-dir "$work/a" --checkpoint-every 10 \
    --checkpoint-keep 10 --metrics "$work/a.jsonl" > "$work/a.log" 2>&1 ||
    { cat "$work/a.log"; fail "the 4-rank run failed"; }
  losses "$work/a.jsonl" > "$work/a.losses"
  for ranks in 2 3; do
    local plan=$plans/mlp_2.json
    [[ $ranks == 3 ]] && plan=$plans/mlp_3_replicated.json
    rm -rf "$work/b" && mkdir "$work/b" && cp -r "$work/a/step-000000020" "$work/b/"
    "${mpirun[@]}" "$ranks" "$train" "${common[@]}" --plan "$plan" --schedule 1f1b-flush \
      --microbatches 4 --steps 40 --resume "$work/b" --metrics "$work/b$ranks.jsonl" \
      > "$work/b.log" 2>&1 || { cat "$work/b.log"; fail "the resume on $ranks ranks failed"; }
    [[ $(resumed_step "$work/b.log") == 20 ]] || { cat "$work/b.log"; fail "$ranks ranks did not resume at step 20"; }
    grep -q "written under another plan" "$work/b.log" || fail "the resume on $ranks ranks did not say the plan changed"
    losses "$work/b$ranks.jsonl" > "$work/b.losses"
    python3 - "$work/a.losses" "$work/b.losses" "$ranks" <<'EOF'
import sys
a = dict(l.split() for l in open(sys.argv[1]))
b = [l.split() for l in open(sys.argv[2])]
ranks = sys.argv[3]
assert len(b) == 20 and b[0][0] == "21", f"{ranks} ranks trained steps {b[0][0]}..{b[-1][0]}"
# The same minibatch, microbatches and weights: the first step is exact; later steps may differ
# in the last bits (the replicas' allreduce sums microbatch gradients in another order).
worst = max(abs(float(l) - float(a[s])) / abs(float(a[s])) for s, l in b)
assert b[0][1] == a["21"] or abs(float(b[0][1]) - float(a["21"])) <= 1e-6 * abs(float(a["21"])), \
    f"{ranks} ranks: loss at step 21 is {b[0][1]}, the 4-rank run had {a['21']}"
assert worst < 1e-4, f"{ranks} ranks drift from the 4-rank run by {worst:.2e}"
print(f"4 ranks -> {ranks} ranks: loss at step 21 {b[0][1]} (4 ranks: {a['21']}), "
      f"steps 21-40 within {worst:.1e} relative")
EOF
  done
}

run_sigkill() {
  # Steps of 512 samples: the 40 steps between checkpoint 150 and the kill at 190 take far longer
  # than writing a checkpoint, so the test does not depend on how fast this machine's disk is.
  local every=50 die=190
  local opts=(--model mlp --batch 512 --threads 1 --eval-batch 10000 --plan "$plans/mlp_2.json"
    --schedule 1f1b-flush --steps 400)
  PIPELINE_TEST_DIE_AT_STEP=1:$die:kill "${mpirun[@]}" 2 "$train" "${opts[@]}" \
    --checkpoint-dir "$work/a" --checkpoint-every $every > "$work/a.log" 2>&1 &&
    fail "the job with a killed rank succeeded"
  "${mpirun[@]}" 2 "$train" "${opts[@]}" --resume "$work/a" --checkpoint-every $every \
    > "$work/b.log" 2>&1 || { cat "$work/b.log"; fail "the relaunch failed"; }
  local from
  from=$(resumed_step "$work/b.log")
  [[ -n $from ]] || { cat "$work/b.log"; fail "the relaunch did not resume"; }
  local lost=$((die - from))
  ((lost >= 0 && lost <= every)) || fail "resumed at step $from after dying at step $die: $lost steps lost, more than the interval $every"
  grep -q "test accuracy" "$work/b.log" || fail "the resumed run did not finish"
  echo "rank 1 SIGKILLed at step $die; resumed at step $from: $lost steps lost (interval $every)"
}

run_interrupted() {
  "$train" "${common[@]}" --steps 30 --checkpoint-dir "$work/a" --checkpoint-every 10 \
    --checkpoint-keep 3 > "$work/a.log" 2>&1 || { cat "$work/a.log"; fail "the run failed"; }
  # The newest write cut short: its shard half-written, no manifest yet.
  rm "$work/a/step-000000030/manifest.json"
  truncate -s 100 "$work/a/step-000000030/stage-0.safetensors"
  "$train" "${common[@]}" --steps 40 --resume "$work/a" > "$work/b.log" 2>&1 ||
    { cat "$work/b.log"; fail "the resume failed"; }
  [[ $(resumed_step "$work/b.log") == 20 ]] || { cat "$work/b.log"; fail "did not resume from the previous checkpoint (20)"; }
  grep -q "step-000000030.*no manifest" "$work/b.log" || fail "the skipped checkpoint was not named"
  echo "an interrupted checkpoint (step 30) was skipped; resumed from step 20"

  # A rank killed right after a checkpoint's write began (its shard may be incomplete). Steps of
  # 512 samples leave checkpoint 50 ample time to complete before step 100.
  local big=(--model mlp --batch 512 --threads 1 --eval-batch 10000)
  PIPELINE_TEST_DIE_AT_STEP=1:100:kill "${mpirun[@]}" 2 "$train" "${big[@]}" \
    --plan "$plans/mlp_2.json" --schedule gpipe --steps 400 --checkpoint-dir "$work/c" \
    --checkpoint-every 50 > "$work/c.log" 2>&1 && fail "the job with a killed rank succeeded"
  for d in "$work"/c/step-*; do
    [[ -f $d/manifest.json ]] || echo "left incomplete by the kill: $(basename "$d")"
  done
  "${mpirun[@]}" 2 "$train" "${big[@]}" --plan "$plans/mlp_2.json" --schedule gpipe \
    --steps 120 --resume "$work/c" > "$work/d.log" 2>&1 || { cat "$work/d.log"; fail "the resume failed"; }
  local from
  from=$(resumed_step "$work/d.log")
  [[ $from == 50 || $from == 100 ]] || { cat "$work/d.log"; fail "resumed from step '$from', expected 50 or 100"; }
  echo "rank killed as checkpoint 100 was written: resumed from the complete checkpoint of step $from"

  # A complete checkpoint damaged afterwards (a byte of rank 1's shard): every rank resumes from
  # the older one, and the damaged one is moved aside, out of the way of the run's own step 30.
  "${mpirun[@]}" 2 "$train" "${common[@]}" --plan "$plans/mlp_2.json" --steps 30 \
    --checkpoint-dir "$work/e" --checkpoint-every 10 > "$work/e.log" 2>&1 || { cat "$work/e.log"; fail "the run failed"; }
  printf 'x' | dd of="$work/e/step-000000030/stage-1.safetensors" bs=1 seek=100 conv=notrunc 2> /dev/null
  "${mpirun[@]}" 2 "$train" "${common[@]}" --plan "$plans/mlp_2.json" --steps 40 \
    --resume "$work/e" > "$work/f.log" 2>&1 || { cat "$work/f.log"; fail "the resume past a damaged checkpoint failed"; }
  grep -q "\[rank 1\] warn: checkpoint shard '.*step-000000030/stage-1.safetensors' is corrupt" "$work/f.log" &&
    grep -q "resuming from the older '.*step-000000020' at step 20 instead" "$work/f.log" ||
    { cat "$work/f.log"; fail "the damaged checkpoint was not named, or not passed over"; }
  [[ -d $work/e/step-000000030.damaged && -f $work/e/step-000000040/manifest.json ]] ||
    { ls "$work/e"; fail "the damaged checkpoint was not moved aside"; }
  # With no older one left, the run stops rather than start from step 0.
  printf 'x' | dd of="$work/e/step-000000040/stage-0.safetensors" bs=1 seek=100 conv=notrunc 2> /dev/null
  printf 'x' | dd of="$work/e/step-000000020/stage-0.safetensors" bs=1 seek=100 conv=notrunc 2> /dev/null
  for _ in 1 2; do  # and again at the next restart: the last one is not moved aside
    expect_refusal "step-000000020' is damaged .* holds no older complete checkpoint" \
      "${mpirun[@]}" 2 "$train" "${common[@]}" --plan "$plans/mlp_2.json" --steps 50 --resume "$work/e"
  done
  echo "a damaged checkpoint (step 30) was passed over on every rank; resumed from step 20"
}

# The pid of rank $1 of the job whose command line holds $2.
rank_pid() {
  local p
  for p in $(pgrep -f -- "$2"); do
    tr '\0' '\n' < "/proc/$p/environ" 2> /dev/null | grep -qx "OMPI_COMM_WORLD_RANK=$1" && { echo "$p"; return; }
  done
}

run_sigterm() {
  local schedule=$1 ranks=$2 plan=$3 target=${4:-mpirun}
  # mpirun passes SIGTERM on to the ranks after its grace period and SIGKILLs them one period
  # later (odls_base_sigkill_timeout): 3 s is ample for a step and a checkpoint of this model.
  "${mpirun[@]}" "$ranks" --mca odls_base_sigkill_timeout 3 "$train" "${common[@]}" \
    --plan "$plan" --schedule "$schedule" --steps 1000000 --checkpoint-dir "$work/a" \
    --checkpoint-every 1000 > "$work/a.log" 2>&1 &
  local job=$!
  for _ in $(seq 600); do
    [[ -f $work/a/step-000001000/manifest.json ]] && break
    sleep 0.1
  done
  [[ -f $work/a/step-000001000/manifest.json ]] || { kill -KILL $job; cat "$work/a.log"; fail "no checkpoint appeared"; }
  local signalled=$ranks by="signal 15"
  if [[ $target == all ]]; then
    # While it runs, a second job resuming from its directory (and so writing there) is refused.
    expect_refusal "checkpoint directory '$work/a' is in use by another job \(host .*, pid [0-9]+\)" \
      "$train" "${common[@]}" --steps 1000000 --resume "$work/a"
  fi
  if [[ $target == all ]]; then  # as a scheduler does: mpirun, which passes it on, and each rank
    local pids
    pids=$(pgrep -f -- "--checkpoint-dir $work/a") || true
    kill -TERM $pids 2> /dev/null || true  # (pgrep's own shell may be gone)
    sleep 0.1
    # And the ranks again, as mpirun's copy of it may come. (mpirun itself ends the job at once
    # on a second signal: a scheduler sends it one.)
    kill -TERM $(grep -vx "$job" <<< "$pids") 2> /dev/null || true
  elif [[ $target == rank1 ]]; then  # one rank alone: it asks, the others agree
    local pid
    pid=$(rank_pid 1 "--checkpoint-dir $work/a") || true
    [[ -n $pid ]] || { kill -KILL $job; fail "rank 1's process not found"; }
    kill -TERM "$pid"
    signalled=1 by="a signal to another rank"
  else
    kill -TERM $job
  fi
  local waited=0
  while kill -0 $job 2> /dev/null; do
    sleep 0.2
    waited=$((waited + 1))
    ((waited < 300)) || { kill -KILL $job; fail "the job did not stop within 60 s of SIGTERM"; }
  done
  wait $job || true
  local line step
  line=$(grep "stopped by $by after step" "$work/a.log") || { cat "$work/a.log"; fail "no stop message"; }
  step=$(sed -n 's/.*after step \([0-9]*\):.*/\1/p' <<< "$line")
  [[ -f $work/a/step-$(printf %09d "$step")/manifest.json ]] || fail "the named checkpoint of step $step is missing"
  [[ $(grep -c "stop requested (SIGTERM" "$work/a.log") == "$signalled" ]] || { cat "$work/a.log"; fail "not every signalled rank saw the stop request"; }
  ! grep -q "mpirun ended this rank" "$work/a.log" || { cat "$work/a.log"; fail "a rank was ended before its checkpoint"; }
  "${mpirun[@]}" "$ranks" "$train" "${common[@]}" --plan "$plan" --schedule "$schedule" \
    --steps $((step + 40)) --resume "$work/a" > "$work/b.log" 2>&1 || { cat "$work/b.log"; fail "the resume failed"; }
  [[ $(resumed_step "$work/b.log") == "$step" ]] || { cat "$work/b.log"; fail "did not resume at step $step"; }
  echo "$schedule, $ranks ranks, SIGTERM to $target: every rank stopped after step $step with its checkpoint; resumed there"
}

# Runs "$@", which must fail with output matching $expect.
expect_refusal() {
  local expect=$1
  shift
  if "$@" > "$work/r.log" 2>&1; then fail "accepted: $*"; fi
  grep -Eq -- "$expect" "$work/r.log" || { cat "$work/r.log"; fail "no '$expect' in the error of: $*"; }
}

run_refused() {
  "$train" "${common[@]}" --steps 10 --checkpoint-dir "$work/a" --checkpoint-every 5 \
    > "$work/a.log" 2>&1 || { cat "$work/a.log"; fail "the run failed"; }
  local run=("$train" --threads 1 --steps 20)
  local resume=("${run[@]}" --batch 32 --resume "$work/a")
  expect_refusal "resume with --seed 1" "${resume[@]}" --model mlp --seed 2
  expect_refusal "resume with --batch 32" "${run[@]}" --model mlp --batch 16 --resume "$work/a"
  expect_refusal "resume with --optimizer adamw" "${resume[@]}" --model mlp --optimizer sgd
  expect_refusal "model 'mlp'.*--model mlp" "${resume[@]}" --model fashion-cnn
  expect_refusal "is not a directory" "${run[@]}" --model mlp --resume "$work/a.log"
  expect_refusal "cannot create the checkpoint directory" "${run[@]}" --model mlp \
    --checkpoint-dir "$work/a.log/sub"
  # Left out, the run's options are the checkpoint's (a copy: this run writes checkpoints too).
  cp -r "$work/a" "$work/same"
  "${run[@]}" --resume "$work/same" > "$work/same.log" 2>&1 || { cat "$work/same.log"; fail "a resume without the run's options failed"; }
  grep -q -- "--resume: --model mlp --seed [0-9]* --batch 32 --optimizer adamw, as the checkpoint was written" "$work/same.log" ||
    { cat "$work/same.log"; fail "the resume did not take the checkpoint's options"; }
  [[ $(resumed_step "$work/same.log") == 10 ]] || { cat "$work/same.log"; fail "did not resume at step 10"; }
  # On other data (one training label changed, in a copy elsewhere): warned, naming the files.
  mkdir -p "$work/data"
  ln -sf /usr/share/datasets/fashion-mnist/{train-images-idx3-ubyte.gz,t10k-*} "$work/data/"
  python3 -c '
import gzip, sys
b = bytearray(gzip.open("/usr/share/datasets/fashion-mnist/train-labels-idx1-ubyte.gz").read())
b[8] = (b[8] + 1) % 10
gzip.open(sys.argv[1], "wb").write(bytes(b))' "$work/data/train-labels-idx1-ubyte.gz"
  cp -r "$work/a" "$work/other"
  "${run[@]}" --resume "$work/other" --data "$work/data" > "$work/other.log" 2>&1 ||
    { cat "$work/other.log"; fail "the resume on other data failed"; }
  grep -q "training data train-images-idx3-ubyte.gz ([0-9]* bytes, CRC-32 [0-9a-f]*), train-labels-idx1-ubyte.gz .*(the checkpoint's: " "$work/other.log" ||
    { cat "$work/other.log"; fail "the resume on other data was not warned"; }
  expect_refusal "--checkpoint-dir: names no path" "${run[@]}" --model mlp --checkpoint-dir ""
  expect_refusal "--resume: names no path" "${run[@]}" --model mlp --resume ""
  for step in 5 10; do  # (one damaged alone is passed over: the interrupted case)
    printf 'x' | dd of="$work/a/step-$(printf %09d $step)/stage-0.safetensors" bs=1 seek=100 conv=notrunc 2> /dev/null
  done
  expect_refusal "stage-0.safetensors' is corrupt.*CRC-32" "${resume[@]}" --model mlp
  # transformer-lm with other heads has the same tensor shapes: the recorded architecture tells.
  if [[ -n ${TRAIN_TRANSFORMER_LM:-} ]]; then
    local lm=("$TRAIN_TRANSFORMER_LM" --threads 1 --dim 32 --blocks 1 --seq-len 16)
    "${lm[@]}" --heads 4 --steps 2 --checkpoint-dir "$work/lm" > "$work/lm.log" 2>&1 ||
      { cat "$work/lm.log"; fail "the transformer-lm run failed"; }
    expect_refusal "with --heads 4 but this run builds it with --heads 2: resume with --heads 4" \
      "${lm[@]}" --heads 2 --steps 4 --resume "$work/lm"
  fi
  echo "resuming with another seed, batch, optimizer, model or architecture, from a corrupt shard or a file, or to an empty path: refused, naming the fix; without them: the checkpoint's; on other data: warned"
}

run_replicated() {
  local plan=$work/mlp_1_2.json
  python3 -c '
import json, sys
p = json.load(open(sys.argv[1]))
p["stages"][0].update(ranks=[0], replicas=1)
p["stages"][1].update(ranks=[1, 2], replicas=2)
p["config"] = "1-2"
json.dump(p, open(sys.argv[2], "w"))' "$plans/mlp_3_replicated.json" "$plan"
  local job=("${mpirun[@]}" 3 "$train" "${common[@]}" --plan "$plan" --schedule 1f1b-stash
    --comm-timeout 30)
  "${job[@]}" --steps 1950 --checkpoint-dir "$work/a" --checkpoint-every 10 --checkpoint-keep 1000 \
    > "$work/a.log" 2>&1 || { cat "$work/a.log"; fail "the run failed"; }
  python3 -c '
import json, os, sys
for step in range(10, 1951, 10):
    path = os.path.join(sys.argv[1], "step-%09d" % step, "manifest.json")
    m = json.load(open(path)) if os.path.exists(path) else {}
    if m.get("step") != step or len(m.get("shards", [])) != 2:
        sys.exit("no complete checkpoint of step %d: %s" % (step, m))' "$work/a" ||
    { ls "$work/a"; fail "a checkpoint is missing or incomplete"; }
  "${job[@]}" --steps 1990 --resume "$work/a" > "$work/b.log" 2>&1 || { cat "$work/b.log"; fail "the resume failed"; }
  [[ $(resumed_step "$work/b.log") == 1950 ]] || { cat "$work/b.log"; fail "did not resume at step 1950"; }
  "$train" "${common[@]}" --steps 15 --checkpoint-dir "$work/single" > "$work/s.log" 2>&1 ||
    { cat "$work/s.log"; fail "the single-process run failed"; }
  "${job[@]}" --steps 41 --resume "$work/single" > "$work/c.log" 2>&1 || { cat "$work/c.log"; fail "the resume at step 15 failed"; }
  grep -q "resumed at step 15: .* training continues at step 16 (1 minibatch(es) skipped)" "$work/c.log" ||
    { cat "$work/c.log"; fail "the resume at step 15 did not say it continues at 16"; }
  [[ -f $work/single/step-000000040/manifest.json ]] || { ls "$work/single"; fail "no checkpoint of step 40"; }
  "${job[@]}" --steps 41 --resume "$work/single" > "$work/d.log" 2>&1 || { cat "$work/d.log"; fail "the restart at step 40 of 41 failed"; }
  grep -q "resumed at step 40 of 41: .* no whole group is left to train" "$work/d.log" ||
    { cat "$work/d.log"; fail "the restart at step 40 of 41 did not say it trains nothing"; }
  echo "1-2 under 1f1b-stash over odd epochs: a complete checkpoint every 10 steps, resumed; a checkpoint of step 15 continues at 16; a restart with no pair left ends"
}

run_finished() {
  local job
  for job in single pipelined; do
    local cmd=("$train")
    [[ $job == pipelined ]] && cmd=("${mpirun[@]}" 2 "$train" --plan "$plans/mlp_2.json")
    "${cmd[@]}" "${common[@]}" --steps 6 --checkpoint-dir "$work/$job" > "$work/$job.log" 2>&1 ||
      { cat "$work/$job.log"; fail "the $job run failed"; }
    local manifest=$work/$job/step-000000006/manifest.json
    touch -d '2000-01-01' "$manifest"
    for steps in 6 4; do
      rm -f "$work/$job.again.jsonl"
      "${cmd[@]}" "${common[@]}" --steps $steps --resume "$work/$job" \
        --metrics "$work/$job.again.jsonl" > "$work/$job.again.log" 2>&1 ||
        { cat "$work/$job.again.log"; fail "the $job restart (--steps $steps) failed"; }
      [[ ! -s "$work/$job.again.jsonl" ]] ||
        { cat "$work/$job.again.jsonl"; fail "the $job restart (--steps $steps) wrote metrics records of a run that trained nothing"; }
      grep -q "resumed at step 6, .* the $steps steps this run asks for .*nothing to train" "$work/$job.again.log" ||
        { cat "$work/$job.again.log"; fail "the $job restart (--steps $steps) did not say it trains nothing"; }
      [[ $(grep "test accuracy:" "$work/$job.again.log") == $(grep "test accuracy:" "$work/$job.log") ]] ||
        { cat "$work/$job.log" "$work/$job.again.log"; fail "the $job restart scores differently"; }
      [[ $(stat -c %Y "$manifest") == $(date -d '2000-01-01' +%s) ]] ||
        fail "the $job restart (--steps $steps) rewrote the checkpoint it resumed from"
    done
  done
  echo "a finished job started again (single-process and 2 ranks): trains nothing, says so, scores the same, leaves its checkpoint and writes no metrics records"
}

run_schedule_csv() {
  local cmd=("${mpirun[@]}" 2 "$train" --plan "$plans/mlp_2.json" --schedule-csv "$plans/flush_2x2.csv")
  if "${cmd[@]}" "${common[@]}" --steps 41 --checkpoint-dir "$work/a" --checkpoint-every 5 > "$work/a.log" 2>&1; then
    cat "$work/a.log"; fail "a checkpoint cadence of 5 under a 2-minibatch schedule was accepted"
  fi
  grep -q -- "--checkpoint-every 5 must be a multiple of 2 for the schedule '.*flush_2x2.csv'" "$work/a.log" ||
    { cat "$work/a.log"; fail "the refused cadence did not name the schedule's length"; }
  "${cmd[@]}" "${common[@]}" --steps 41 --checkpoint-dir "$work/b" --checkpoint-every 10 > "$work/b.log" 2>&1 ||
    { cat "$work/b.log"; fail "the run of 41 steps failed"; }
  grep -q "training 40 of the 41 steps asked for: the schedule '.*flush_2x2.csv' trains whole copies of its 2 minibatch(es)" "$work/b.log" ||
    { cat "$work/b.log"; fail "the run of 41 steps did not say it trains 40"; }
  [[ -f $work/b/step-000000040/manifest.json ]] || { ls "$work/b"; fail "no checkpoint at step 40"; }
  echo "a 2-minibatch schedule CSV: an odd cadence refused naming it; 41 steps train 40, said, checkpointed"
}

case $case_name in
  schedule-csv) run_schedule_csv ;;
  bitwise-sequential-bf16) run_bitwise sequential --dtype bf16 ;;
  bitwise-*) run_bitwise "${case_name#bitwise-}" ;;
  stash) run_bitwise 1f1b-stash ;;
  replan) run_replan ;;
  sigkill) run_sigkill ;;
  interrupted) run_interrupted ;;
  refused) run_refused ;;
  finished) run_finished ;;
  replicated) run_replicated ;;
  sigterm) run_sigterm 1f1b-flush 2 "$plans/mlp_2.json" ;;
  sigterm-stash) run_sigterm 1f1b-stash 4 "$plans/mlp_4.json" ;;
  sigterm-rank1) run_sigterm 1f1b-flush 2 "$plans/mlp_2.json" rank1 ;;
  sigterm-all) run_sigterm 1f1b-flush 2 "$plans/mlp_2.json" all ;;
  interleaved) run_interleaved ;;
  sigterm-interleaved) run_sigterm interleaved-1f1b 2 "$plans/mlp_2x2_interleaved.json" ;;
  *) fail "unknown case" ;;
esac
