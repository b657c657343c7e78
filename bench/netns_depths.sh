#!/usr/bin/env bash
# 1F1B-stash over a slow link between two hosts: the partitioner's in-flight counts against
# PipeDream's (--pipedream-in-flight), trained on two hosts made on this machine
# (tests/support/netns_hosts.sh: network namespaces on a bridge, each sending at most RATE).
#
#   bench/netns_depths.sh BUILD_DIR [STAGES] [RATE] [REPS] [STEPS]
#
# STAGES 2 (one rank a host, --workers 2) or 4 (two a host, --level 2:10Gbit/s --level 2:RATE);
# RATE in tc units (default 100mbit); REPS alternating runs of each plan (default 3) of STEPS
# steps (default 1500). The mlp at batch 32, one thread a rank. Prints each plan's config and
# in-flight count, pipeline-simulate's full-duplex rate for it (each host sends at RATE, as here)
# and every run's samples/s through the pipeline. Needs root (exits 77 where namespaces cannot be
# made).
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
build=$(cd "${1:?usage: bench/netns_depths.sh BUILD_DIR [STAGES] [RATE] [REPS] [STEPS]}" && pwd)
stages=${2:-2} rate=${3:-100mbit} reps=${4:-3} steps=${5:-1500}
if [[ -z ${NETNS_HOSTS:-} ]]; then
  exec bash "$here/../tests/support/netns_hosts.sh" --hosts 2 --rate "$rate" --prefix "nd$$h" \
    --timeout 900 -- bash "${BASH_SOURCE[0]}" "$build" "$stages" "$rate" "$reps" "$steps"
fi
work=$(mktemp -d "${TMPDIR:-/tmp}/netns_depths.XXXXXX")
trap 'rm -rf "$work"' EXIT
# shellcheck disable=SC2206  # flags are words
netns_flags=($NETNS_MPIRUN_FLAGS)
bandwidth=${rate/mbit/Mbit/s}
bandwidth=${bandwidth/gbit/Gbit/s}
case $stages in
  2) levels=(--workers 2 --bandwidth "$bandwidth") sim_levels=(--level "2:$bandwidth")
     placement=(--cores-per-rank "$(nproc)") ;;
  4) levels=(--level 2:10Gbit/s --level "2:$bandwidth")
     sim_levels=(--level 2:10Gbit/s --level "2:$bandwidth" --cores "$(nproc)") placement=() ;;
  *) echo "netns_depths.sh: STAGES is 2 or 4, not $stages" >&2; exit 2 ;;
esac
"$build/partitioner/pipeline-profile" --model mlp --batch 32 --threads 1 --warmup 10 --repeat 50 \
  -o "$work/profile.json" >/dev/null
for kind in planned pipedream; do
  extra=()
  [[ $kind == pipedream ]] && extra=(--pipedream-in-flight)
  "$build/partitioner/pipeline-partition" --profile "$work/profile.json" --optimizer adamw \
    "${levels[@]}" --straight --hosts "$NETNS_HOSTFILE" --rankfile "$work/rankfile.txt" \
    "${placement[@]}" -o "$work/$kind.json" "${extra[@]}" > "$work/$kind.log"
  in_flight=$(python3 -c 'import json, sys; print("-".join(str(s.get("in_flight", 0)) for s in json.load(open(sys.argv[1]))["stages"]))' "$work/$kind.json")
  simulated=$("$build/partitioner/pipeline-simulate" --profile "$work/profile.json" --plan "$work/$kind.json" \
    "${sim_levels[@]}" --full-duplex | sed -n 's/.*s, \([0-9.]*\) samples\/s.*/\1/p' | head -n1)
  echo "$kind: config $(sed -n 's/^config \([^ ]*\).*/\1/p' "$work/$kind.log"), in flight $in_flight, simulated (full duplex) $simulated samples/s"
done
for ((rep = 1; rep <= reps; ++rep)); do
  for kind in planned pipedream; do
    mpirun --allow-run-as-root --oversubscribe "${netns_flags[@]}" --rankfile "$work/rankfile.txt" \
      "$build/examples/train_fashion_mnist" --model mlp --plan "$work/$kind.json" --schedule 1f1b-stash \
      --steps "$steps" --batch 32 --threads 1 --eval-batch 2000 --comm-timeout 60 > "$work/train.log" 2>&1 ||
      { cat "$work/train.log"; exit 1; }
    echo "$kind run $rep: $(sed -n 's/.*training: \([0-9.]*\) samples\/s through the pipeline.*/\1/p' "$work/train.log" | tail -n1) samples/s"
  done
done
