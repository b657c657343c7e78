#!/usr/bin/env bash
# A plan with uneven replication (1-2-3 on 6 ranks) trained as a user would:
#   uneven_replicas.sh TRAIN_FASHION_MNIST PLAN MPIRUN...
# under 1f1b-flush and zb-h1 its loss trajectory equals one process's (fp32 rounding: the replicas'
# gradient sums run in another order), and under 1f1b-stash it learns.
set -euo pipefail
train=$1
plan=$2
shift 2
mpirun=("$@")
work=$(mktemp -d "${TMPDIR:-/tmp}/uneven_replicas.XXXXXX")
trap 'rm -rf "$work"' EXIT
common=(--model mlp --batch 36 --threads 1 --eval-batch 10000 --lr 1e-3)

"$train" "${common[@]}" --steps 24 --metrics "$work/single.jsonl" > "$work/single.log" 2>&1 ||
  { cat "$work/single.log"; exit 1; }
"${mpirun[@]}" 6 "$train" "${common[@]}" --plan "$plan" --schedule 1f1b-flush --microbatches 6 \
  --steps 24 --metrics "$work/flush.jsonl" > "$work/flush.log" 2>&1 || { cat "$work/flush.log"; exit 1; }
"${mpirun[@]}" 6 "$train" "${common[@]}" --plan "$plan" --schedule zb-h1 --microbatches 6 \
  --steps 24 --metrics "$work/zb.jsonl" > "$work/zb.log" 2>&1 || { cat "$work/zb.log"; exit 1; }
"${mpirun[@]}" 6 "$train" "${common[@]}" --plan "$plan" --schedule 1f1b-stash --steps 120 \
  --metrics "$work/stash.jsonl" > "$work/stash.log" 2>&1 || { cat "$work/stash.log"; exit 1; }
python3 - "$work/single.jsonl" "$work/flush.jsonl" "$work/zb.jsonl" "$work/stash.jsonl" <<'PY'
import json, sys
def losses(path):
    return [r["loss"] for r in map(json.loads, open(path)) if "step" in r]
single, flush, zb, stash = map(losses, sys.argv[1:5])
def drift(name, run):
    assert len(single) == len(run) == 24, (name, len(single), len(run))
    worst = max(abs(a - b) / abs(b) for a, b in zip(run, single))
    assert worst < 1e-4, f"{name} on 1-2-3 drifts from one process by {worst:.2e}"
    return worst
worst = max(drift("1f1b-flush", flush), drift("zb-h1", zb))
assert len(stash) == 120
first, last = sum(stash[:20]) / 20, sum(stash[-20:]) / 20
assert last < 0.7 * first, f"1f1b-stash on 1-2-3 did not learn: {first:.3f} -> {last:.3f}"
print(f"1-2-3 on 6 ranks: 1f1b-flush and zb-h1 within {worst:.1e} of one process over 24 steps; "
      f"1f1b-stash loss {first:.3f} -> {last:.3f} over 120 steps")
PY
