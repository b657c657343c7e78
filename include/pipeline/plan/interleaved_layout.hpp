// The layout of an interleaved plan (Plan::virtual_stages > 1): v·p stages over p ranks per
// pipeline, and optionally r such pipelines (data parallelism over interleaved pipelines): every
// stage has r replicas, replica j of stage k on the rank of replica j of the stage at k's place,
// the p·r ranks distinct. Stages 0..p−1 hold places 0..p−1; the others follow a placement:
//  - looped (Narayanan et al.): stage k at place k mod p, so a microbatch passes the ranks
//    0..p−1 v times (interleaved-1f1b, interleaved-zb-h1);
//  - V (Qi et al., ZB-V; v = 2 only): stage k ≥ p at place 2p − 1 − k, so a microbatch goes down
//    the ranks and back up, and the first rank holds both the input and the loss stage (zb-v).
#pragma once

#include <string>
#include <vector>

namespace pipeline {

struct Plan;

enum class StagePlacement { Looped, V };

// "looped" / "v".
const char* to_string(StagePlacement placement);

// `positions` ranks per pipeline (p), `stages_per_rank` (v) and `replicas` (r) of every stage.
struct InterleavedShape {
  int positions = 1;
  int stages_per_rank = 1;
  int replicas = 1;
  StagePlacement placement = StagePlacement::Looped;

  // The place (0..p−1) of `stage` in its pipeline.
  int place_of(int stage) const {
    if (placement == StagePlacement::V && stage >= positions) return 2 * positions - 1 - stage;
    return stage % positions;
  }
};

// The shape of `stage_ranks` (stage -> its replicas' ranks) as an interleaved layout, its
// placement read from where stage p runs; ConfigError naming the stage and ranks that break it.
InterleavedShape interleaved_shape(const std::vector<std::vector<int>>& stage_ranks);

// stage -> ranks of an interleaved layout: v·p stages, r pipelines of p ranks (pipeline j on ranks
// j·p .. j·p + p − 1), each stage's replica j at its place in pipeline j.
std::vector<std::vector<int>> interleaved_stage_ranks(int positions, int stages_per_rank,
                                                      int replicas, StagePlacement placement);

// The placement of an interleaved plan's stages (looped for a plan whose stages name no ranks,
// which ScheduleSpec::from_plan lays out looped).
StagePlacement placement_of(const Plan& plan);

// What `--schedule interleaved` names for a plan: zb-v for a V, interleaved-1f1b otherwise.
std::string interleaved_schedule_for(const Plan& plan);

}  // namespace pipeline
