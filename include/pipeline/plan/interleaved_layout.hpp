// The layout of an interleaved plan (Plan::virtual_stages > 1): v·p stages over p ranks per
// pipeline, and optionally r such pipelines (data parallelism over interleaved pipelines): every
// stage has r replicas, replica j of stage k on the rank of replica j of the stage at k's place,
// the p·r ranks distinct. Stages 0..p−1 hold places 0..p−1; the others follow a placement:
//  - looped (Narayanan et al.): stage k at place k mod p, so a microbatch passes the ranks
//    0..p−1 v times (interleaved-1f1b, interleaved-zb-h1);
//  - V (Qi et al., ZB-V; v = 2 only): stage k ≥ p at place 2p − 1 − k, so a microbatch goes down
//    the ranks and back up, and the first rank holds both the input and the loss stage (zb-v).
#pragma once

#include <pipeline/plan/pass_walk.hpp>

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

// Interleaved 1F1B's order on one place of a pipeline (interleaved-1f1b, interleaved-zb-h1):
// within a minibatch of m microbatches per pipeline (a multiple of p) the place runs warmup()
// forwards, then a forward and a backward in turn, then the remaining backwards. Its k-th forward
// (backward) is of its `chunk`-th stage (chunk·p + place) and of the `index`-th microbatch the
// pipeline takes in the minibatch: groups of `group` microbatches (the last group what remains)
// cycling through its stages, in ascending order for forwards and descending for backwards.
//
// Narayanan et al. take groups of p: with free messages a microbatch comes back round the p
// ranks to the next chunk just as the place has run the group's p forwards. Where messages take
// time that round trip is longer, and larger groups (a multiple of p; Megatron-core's
// microbatch group per virtual stage) give the place more work to hide it, each group member
// held once more in the warm-up, which then runs 2(p − 1 − place) + (v − 1)·group forwards.
struct InterleavedPair {
  int chunk = 0;
  int index = 0;
};
struct InterleavedOrder {
  int positions = 1;        // p
  int stages_per_rank = 1;  // v
  int microbatches = 1;     // m, per pipeline and minibatch: a multiple of p
  int group = 0;            // a multiple of p; 0: p (Narayanan et al.'s)

  InterleavedPair pair(int k, bool backward) const;
  int warmup(int place) const;
  // Calls visit(k, backward) for the place's passes in order: its k-th forward or backward.
  template <class Visit>
  void for_each_pass(int place, Visit&& visit) const {
    const int total = microbatches * stages_per_rank, first = warmup(place);
    for (int k = 0; k < first; ++k) visit(k, false);
    for (int k = 0; k < total - first; ++k) {
      visit(first + k, false);
      visit(k, true);
    }
    for (int k = total - first; k < total; ++k) visit(k, true);
  }
  // The group size in effect: `group`, or p, at most m.
  int group_size() const;
};
// ConfigError unless `group` (0: p) is a multiple of the `positions` ranks of a pipeline.
void check_microbatch_group(int group, int positions);

// Interleaved 1F1B's passes of one minibatch in `order`, per place (looped: stage k on place
// k mod p), which the planner times with walk_passes (pass_walk.hpp): with stages of unequal time
// (or slow links) the ranks wait on each other in ways no per-rank sum shows. Kept per order, as
// the planner walks the same ones for every cut it times.
const PassOrder& interleaved_passes(const InterleavedOrder& order);

// The place of each of a looped pipeline's v·p stages: k mod p.
std::vector<int> looped_stage_places(int positions, int stages_per_rank);

// The placement of an interleaved plan's stages (looped for a plan whose stages name no ranks,
// which ScheduleSpec::from_plan lays out looped).
StagePlacement placement_of(const Plan& plan);

// What `--schedule interleaved` names for a plan: zb-v for a V, interleaved-1f1b otherwise.
std::string interleaved_schedule_for(const Plan& plan);

// ConfigError naming the fix where the generator `schedule` cannot order the plan's stages: an
// interleaved plan runs under its placement's schedules only (interleaved-1f1b and
// interleaved-zb-h1 looped, zb-v a V), and those run interleaved plans only.
void check_schedule_for_plan(const Plan& plan, const std::string& schedule);

}  // namespace pipeline
