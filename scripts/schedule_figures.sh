#!/usr/bin/env bash
# Draws the README's schedule figures: the zoo's transformer-lm (8 blocks) profiled on this
# machine, planned for 4 workers on a 10 GB/s level, and simulated with 8 microbatches under
# 1F1B-flush, ZB-H1, (on the partitioner's plan of 2 stages per worker, one pipeline)
# interleaved 1F1B and interleaved ZB-H1, and (on its plan of 2 stages per worker in a V) ZB-V.
#   scripts/schedule_figures.sh [BUILD_DIR]      (default build/cpu-release)
set -euo pipefail
build=${1:-build/cpu-release}
bin=$build/partitioner
out=docs/images
work=$(mktemp -d "${TMPDIR:-/tmp}/schedule_figures.XXXXXX")
trap 'rm -rf "$work"' EXIT

"$bin/pipeline-profile" --model transformer-lm --blocks 8 --batch 8 --threads 1 --repeat 30 -q \
  -o "$work/profile.json"
"$bin/pipeline-partition" --profile "$work/profile.json" --workers 4 --bandwidth 10GB/s \
  --straight -o "$work/plan.json" > /dev/null
"$bin/pipeline-partition" --profile "$work/profile.json" --workers 4 --bandwidth 10GB/s \
  --virtual-stages 2 --straight -o "$work/plan_v2.json" > /dev/null
"$bin/pipeline-partition" --profile "$work/profile.json" --workers 4 --bandwidth 10GB/s \
  --stage-placement v --straight -o "$work/plan_vshape.json" > /dev/null
simulate() {  # PLAN SCHEDULE SVG
  "$bin/pipeline-simulate" --profile "$work/profile.json" --plan "$1" --schedule "$2" \
    --microbatches 8 --level 4:10GB/s --svg "$out/$3" | sed -n 2p
}
echo "1f1b-flush:  $(simulate "$work/plan.json" 1f1b-flush schedule-1f1b-flush.svg)"
echo "zb-h1:       $(simulate "$work/plan.json" zb-h1 schedule-zb-h1.svg)"
echo "interleaved: $(simulate "$work/plan_v2.json" interleaved schedule-interleaved.svg)"
echo "interleaved-zb-h1: $(simulate "$work/plan_v2.json" interleaved-zb-h1 schedule-interleaved-zb-h1.svg)"
echo "zb-v:        $(simulate "$work/plan_vshape.json" zb-v schedule-zb-v.svg)"
