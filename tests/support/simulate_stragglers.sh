#!/usr/bin/env bash
# pipeline-simulate's straggler options as the README shows them:
#   simulate_stragglers.sh PIPELINE_PARTITION PIPELINE_SIMULATE CHAIN_PROFILE
# the chain profile's plan for 6 workers at 1 Gbit/s (1-1-4) is slower with a replica of its last
# stage slowed 2x than with its single second stage slowed 2x under one blocking allreduce
# (--no-overlap-allreduce), while the runtime's overlapped allreduce (the default) hides part of
# the slow replica; jitter is reproducible from its seed, and a malformed --slow-rank is refused
# naming it.
set -euo pipefail
partition=$1
simulate=$2
profile=$3
work=$(mktemp -d "${TMPDIR:-/tmp}/simulate_stragglers.XXXXXX")
trap 'rm -rf "$work"' EXIT
"$partition" --profile "$profile" --workers 6 --bandwidth 1Gbit/s -o "$work/plan.json" > /dev/null
sim() { "$simulate" --profile "$profile" --plan "$work/plan.json" --level 6:1Gbit/s --json "$@"; }
rate() { python3 -c 'import json, sys; print(json.load(sys.stdin)["samples_per_s"])'; }
nominal=$(sim | rate)
stage1=$(sim --slow-rank 1:2 | rate)
replica=$(sim --slow-rank 3:2 | rate)
nominal_blocking=$(sim --no-overlap-allreduce | rate)
replica_blocking=$(sim --no-overlap-allreduce --slow-rank 3:2 | rate)
jitter_a=$(sim --jitter 0.2 --seed 1 | rate)
jitter_b=$(sim --jitter 0.2 --seed 1 | rate)
jitter_c=$(sim --jitter 0.2 --seed 2 | rate)
echo "samples/s: nominal $nominal, stage 1 slowed 2x $stage1, a stage-2 replica slowed 2x $replica" \
  "(blocking allreduce: nominal $nominal_blocking, replica $replica_blocking)," \
  "jitter 0.2 seed 1 $jitter_a (again $jitter_b), seed 2 $jitter_c"
python3 - "$nominal" "$stage1" "$replica" "$nominal_blocking" "$replica_blocking" \
  "$jitter_a" "$jitter_b" "$jitter_c" <<'PY'
import sys
nominal, stage1, replica, nominal_blocking, replica_blocking, a, b, c = map(float, sys.argv[1:])
assert replica_blocking < stage1 < nominal_blocking <= nominal, \
    "blocking allreduce: a slowed replica should cost more than the slowed single stage"
assert replica_blocking < replica < nominal, "the overlapped allreduce should hide part of it"
assert a == b and a != c and a < nominal, "jitter: same seed same result, another seed another"
PY
if sim --slow-rank 3x2 > "$work/bad.log" 2>&1; then
  echo "--slow-rank 3x2 was accepted"
  exit 1
fi
grep -q "\-\-slow-rank '3x2' is not RANK:FACTOR" "$work/bad.log" || { cat "$work/bad.log"; exit 1; }
echo "ok"
